"""NegMerge and the baseline merges of task vectors, per tensor, streamed over checkpoints by the shared merge
engine (:mod:`icmltools.merge`).

Notation (Kim et al. 2025, Sec. 3): tau_i = theta_i - theta_pre for the N models fine-tuned on the forget set.

* ``negmerge`` (Sec. 3, official CLIP code): keep an element only when all N task vectors share the same
  strict sign, |sum_i sign(tau_i)| == N (an exact zero anywhere drops it); tau = where(mask, sum_i tau_i / N, 0).
* ``task_arithmetic``: one candidate's tau (Ilharco et al. 2023), the paper's main competitor (the engine's
  ``task_vector``; the engine's own ``task_arithmetic`` is mergekit's weighted sum of all task vectors).
* ``uniform``: mean of all tau_i.
* ``ties`` (Yadav et al. 2023): trim each tau_i to its top-k fraction by magnitude (ceil(k * numel), every
  tie at the threshold kept), elect the sign of the sum of the trimmed vectors, average the trimmed entries
  that agree with it (disjoint mean): the engine's ``ties`` with ``trim="keep_ties"``.
* ``magmax`` (Marczak et al. 2024): per element, the tau_i of largest magnitude.
* optional DARE (Yu et al. 2024) before any of them: drop each element with probability p, rescale by 1/(1-p);
  the mask of candidate i's tensor `name` comes from ``derive(seed, "dare", name, i)``.

Each merge is one engine method class; :data:`REGISTRY` maps this command's names to them. The unlearned model
is theta = theta_pre - lambda * tau. Integer and bool tensors carry no task vector and are copied from the
base. Arithmetic runs in float32 (float64 for float64 tensors); the output keeps each tensor's dtype. Finite in,
finite out: see :mod:`icmltools.merge.engine`.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from icmltools.core.errors import BadInputError
from icmltools.merge import engine as E
from icmltools.merge.engine import (  # noqa: F401  (re-exported: this module's former names)
    BufferPool,
    MergeMethod,
    MergeStats,
    apply_task_vector,
    apply_to_state_dict,
    check_input,
    check_output,
    compute_dtype,
    dare_generator,
    dare_tensor,
    negate_into,
)
from icmltools.merge.methods import MagMax, NegMerge, TaskVector, Ties, Uniform
from icmltools.taskvec import CheckpointReader

from .options import METHODS, MergeConfig

__all__ = ["METHODS", "MergeConfig", "REGISTRY", "merge_tensor", "negmerge_tensor", "uniform_tensor",
           "magmax_tensor", "ties_tensor", "dare_tensor", "merge_to_checkpoint", "merged_task_vector",
           "apply_task_vector", "apply_to_state_dict"]

# this command's names -> engine methods (options.METHODS lists the same names for the CLI; a test checks it)
REGISTRY: dict[str, MergeMethod] = {m.name: m for m in (NegMerge(), TaskVector(name="task_arithmetic"), Uniform(),
                                                         Ties(name="ties", trim="keep_ties"), MagMax())}


def method(name: str) -> MergeMethod:
    try:
        return REGISTRY[name]
    except KeyError:
        raise BadInputError(f"unknown merge method {name!r}; choose one of {', '.join(METHODS)}",
                            param="method") from None


def plan_for(cfg: MergeConfig, n: int, chunk_elems: int | None = E.CHUNK_ELEMS) -> E.Plan:
    """The engine plan of `cfg` for n candidates: unit weights, ties_k as every model's density, index and
    DARE as given."""
    m = method(cfg.method)
    opts = {k: v for k, v in {"index": cfg.index}.items() if k in m.options}
    return E.make_plan(m, n, densities=(cfg.ties_k,) if m.uses_density else None, options=opts, seed=cfg.seed,
                       dare_p=cfg.dare_p, chunk_elems=chunk_elems)


# --------------------------------------------------------------------------------------------- list forms


def _trim_top_k(t, k: float):
    """Keep the ceil(k * numel) largest magnitudes (ties at the threshold are kept), zero the rest."""
    import torch

    numel = t.numel()
    keep = max(1, int(math.ceil(k * numel)))
    if keep >= numel:
        return t.clone()
    a = t.reshape(-1)
    a = a.float() if a.dtype in (torch.float16, torch.bfloat16) else a
    mask = E.TopK(a, keep, keep_ties=True).mask(a).view(t.shape)
    return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))


def merge_tensor(taus: Sequence, cfg: MergeConfig, name: str = "", chunk_elems: int | None = E.CHUNK_ELEMS):
    """Merge the task vectors of one tensor with `cfg.method` (the streamed merge's own code, fed from a
    list); returns (merged tau, kept element count). `name` keys the DARE masks."""
    return E.merge_tensor(taus, plan_for(cfg, len(taus), chunk_elems), name)


def negmerge_tensor(taus: Sequence):
    """Sign-consensual merge of one tensor: (where(|sum sign| == N, sum / N, 0), number of kept elements)."""
    return merge_tensor(taus, MergeConfig("negmerge"))


def uniform_tensor(taus: Sequence):
    return merge_tensor(taus, MergeConfig("uniform"))


def magmax_tensor(taus: Sequence):
    """Per element the value of largest magnitude (first candidate wins ties)."""
    return merge_tensor(taus, MergeConfig("magmax"))


def ties_tensor(taus: Sequence, k: float = 0.2):
    """TIES-merging of one tensor (Yadav et al. 2023, Algorithm 1) with NegMerge's trim rule: (merged, kept)."""
    return merge_tensor(taus, MergeConfig("ties", ties_k=k))


# --------------------------------------------------------------------------------------------- streaming


def open_and_check(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig) -> None:
    """Validate the inputs before any arithmetic: method options, candidate count, keys, shapes, dtypes."""
    cfg.validate(len(candidates))
    E.open_and_check(base, candidates, plan_for(cfg, len(candidates)))


def merge_to_checkpoint(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                        lam: float, out_path, fmt: str = "same", device: str = "cpu", record: dict | None = None,
                        progress: Callable | None = None, allow_non_finite: bool = False,
                        chunk_elems: int | None = E.CHUNK_ELEMS) -> MergeStats:
    """Stream theta_pre - lam * merge(tau_1..tau_N) into `out_path` (atomic; base's format unless `fmt` says
    otherwise). Inputs and outputs are checked finite; a failure leaves nothing at `out_path`."""
    open_and_check(base, candidates, cfg)
    record = {**default_record(base, candidates, cfg, lam), **(record or {})}
    return E.merge_to_checkpoint(base, candidates, plan_for(cfg, len(candidates), chunk_elems), lam, out_path,
                                 fmt=fmt, device=device, record=record, sign=-1, skip_zero=False, progress=progress,
                                 allow_non_finite=allow_non_finite)


def default_record(base, candidates, cfg: MergeConfig, lam: float) -> dict:
    """The metadata record written with every merged checkpoint."""
    from dataclasses import asdict

    return {"tool": "icml negmerge", "method": cfg.method, "lam": lam, "operation": "theta_pre - lam * tau",
            "base": str(base.path), "candidates": [str(c.path) for c in candidates], "config": asdict(cfg)}


def merged_task_vector(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                       device: str = "cpu", progress: Callable | None = None, allow_non_finite: bool = False,
                       chunk_elems: int | None = E.CHUNK_ELEMS):
    """The merged task vector as a dict (compute dtype, CPU) for a lambda search: one model in memory.
    Inputs are checked finite as they are read."""
    open_and_check(base, candidates, cfg)
    return E.merged_task_vector(base, candidates, plan_for(cfg, len(candidates), chunk_elems), device=device,
                                progress=progress, allow_non_finite=allow_non_finite)
