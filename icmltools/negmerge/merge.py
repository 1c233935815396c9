"""NegMerge and the baseline merges of task vectors, per tensor, streamed over checkpoints.

Notation (Kim et al. 2025, Sec. 3): tau_i = theta_i - theta_pre for the N models fine-tuned on the forget set.

* ``negmerge`` (Sec. 3, official CLIP code): keep an element only when all N task vectors share the same
  strict sign, |sum_i sign(tau_i)| == N (an exact zero anywhere drops it); tau = where(mask, sum_i tau_i / N, 0).
* ``task_arithmetic``: one candidate's tau (Ilharco et al. 2023), the paper's main competitor.
* ``uniform``: mean of all tau_i.
* ``ties`` (Yadav et al. 2023): trim each tau_i to its top-k fraction by magnitude, elect the sign of the sum
  of the trimmed vectors, average the trimmed entries that agree with it (disjoint mean).
* ``magmax`` (Marczak et al. 2024): per element, the tau_i of largest magnitude.
* optional DARE (Yu et al. 2024) before any of them: drop each element with probability p, rescale by 1/(1-p);
  the mask of candidate i's tensor `name` comes from ``derive(seed, "dare", name, i)``.

Each merge is one class in :data:`REGISTRY` (name, reference, buffers, per-candidate ``add`` and ``finish``);
the same class serves the streamed file merge and the list form :func:`merge_tensor`. The unlearned model
is theta = theta_pre - lambda * tau. Integer and bool tensors (e.g. BatchNorm ``num_batches_tracked``) carry
no task vector and are copied from the base. Arithmetic runs in float32 (float64 for float64 tensors) on the
chosen device; the output keeps each tensor's dtype.

Finite in, finite out: every float tensor read (base and candidates) is checked for NaN/inf as it streams
by (one reduction, :func:`icmltools.taskvec.all_finite`) and refused with its file and name, unless
``allow_non_finite``; every output tensor is checked the same way, and a non-finite one (lambda too large
for the dtype, or allowed non-finite inputs that reach it) is a :class:`RuntimeFailure` that leaves no output.
"""
from __future__ import annotations

import abc
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.seed import derive
from icmltools.taskvec import (
    CheckpointReader,
    CheckpointWriter,
    all_finite,
    check_compatible,
    count_non_finite,
    is_float_dtype,
)

from .options import METHODS, MergeConfig

log = logging.getLogger(__name__)

__all__ = ["METHODS", "MergeConfig", "REGISTRY", "merge_tensor", "negmerge_tensor", "uniform_tensor",
           "magmax_tensor", "ties_tensor", "dare_tensor", "merge_to_checkpoint", "merged_task_vector",
           "apply_task_vector", "apply_to_state_dict"]


# --------------------------------------------------------------------------------------------- merge methods


class MergeMethod(abc.ABC):
    """One merge of N task vectors, fed one candidate at a time into reused buffers.

    ``buffers`` names the per-tensor buffers the method needs, each (name, None for the compute dtype or
    a torch dtype name); ``add(st, tau, k)`` takes the k-th task vector it receives (k = 0 first);
    ``finish(st, n)`` returns (merged tau, kept element count), possibly in a reused buffer. ``st`` is the
    tensor's :class:`_Accumulator` (its buffers are attributes; ``items`` is a list for methods that keep
    every task vector). ``witness`` names a buffer holding the running sum of the task vectors received:
    NaN and inf survive any sum, so its one finiteness check stands for a check of every input tensor
    (None: each input is checked as it is read). A new method is one subclass and one :data:`REGISTRY` line.
    """

    name = ""
    reference = ""
    buffers: tuple = ()
    witness: str | None = None

    def wants(self, i: int, cfg: MergeConfig) -> bool:
        """Whether candidate i's task vector is read at all."""
        return True

    @abc.abstractmethod
    def add(self, st, tau, k: int) -> None:
        """Take the k-th task vector into the tensor's accumulator `st`."""

    @abc.abstractmethod
    def finish(self, st, n: int):
        """(merged tau, kept element count) after all n task vectors."""


def _sum_into(st, tau, k: int) -> None:
    """st.total = sum of the task vectors received so far."""
    if k == 0:
        st.total.copy_(tau)
    else:
        st.total.add_(tau)


def _count(t) -> int:
    import torch

    return int(torch.count_nonzero(t))


class NegMerge(MergeMethod):
    """Sign-consensual merge (NegMerge Sec. 3): tau = where(|sum_i sign(tau_i)| == N, sum_i tau_i / N, 0).

    Streamed as: all N share a strict sign  <=>  min_i tau_i > 0 or max_i tau_i < 0 (NaN never kept)."""

    name = "negmerge"
    reference = "Kim et al., ICML 2025 (arXiv 2410.05583), Sec. 3"
    buffers = (("total", None), ("mn", None), ("mx", None), ("tb", "bool"))
    witness = "total"

    def add(self, st, tau, k):
        import torch

        _sum_into(st, tau, k)
        if k == 0:
            st.mn.copy_(tau)
            st.mx.copy_(tau)
        else:
            torch.minimum(st.mn, tau, out=st.mn)
            torch.maximum(st.mx, tau, out=st.mx)

    def finish(self, st, n):
        import torch

        mask = torch.gt(st.mn, 0, out=st.tb)
        mask.logical_or_(st.mx < 0)
        st.total.div_(n)
        st.total.masked_fill_(mask.logical_not_(), 0)  # st.tb now holds the dropped elements
        return st.total, int(st.tb.numel() - torch.count_nonzero(st.tb))


class Uniform(MergeMethod):
    """Mean of the task vectors: tau = sum_i tau_i / N."""

    name = "uniform"
    reference = "uniform task-vector mean (model soup of task vectors)"
    buffers = (("total", None),)
    witness = "total"

    def add(self, st, tau, k):
        _sum_into(st, tau, k)

    def finish(self, st, n):
        st.total.div_(n)
        return st.total, _count(st.total)


class TaskArithmetic(MergeMethod):
    """One candidate's task vector, tau = tau_index (task negation)."""

    name = "task_arithmetic"
    reference = "Ilharco et al., Editing Models with Task Arithmetic, ICLR 2023"
    buffers = (("total", None),)
    witness = "total"

    def wants(self, i, cfg):
        return i == cfg.index

    def add(self, st, tau, k):
        st.total.copy_(tau)

    def finish(self, st, n):
        return st.total, _count(st.total)


class MagMax(MergeMethod):
    """Per element, the task vector entry of largest magnitude (the first candidate wins ties)."""

    name = "magmax"
    reference = "Marczak et al., MagMax, ECCV 2024"
    buffers = (("best", None),)

    def add(self, st, tau, k):
        import torch

        if k == 0:
            st.best.copy_(tau)
        else:
            st.best.copy_(torch.where(tau.abs() > st.best.abs(), tau, st.best))

    def finish(self, st, n):
        return st.best, _count(st.best)


class Ties(MergeMethod):
    """TIES-merging (Yadav et al. 2023): keeps a copy of each task vector of the tensor (its sign election
    needs all of them), then :func:`ties_tensor`."""

    name = "ties"
    reference = "Yadav et al., TIES-Merging, NeurIPS 2023"

    def add(self, st, tau, k):
        st.items.append(tau.clone())

    def finish(self, st, n):
        merged, kept = ties_tensor(st.items, st.cfg.ties_k)
        st.items = []
        return merged, kept


# one line per method (options.METHODS lists the same names, for the CLI's choices; a test checks they agree)
REGISTRY: dict[str, MergeMethod] = {m.name: m for m in (NegMerge(), TaskArithmetic(), Uniform(), Ties(), MagMax())}


def method(name: str) -> MergeMethod:
    try:
        return REGISTRY[name]
    except KeyError:
        raise BadInputError(f"unknown merge method {name!r}; choose one of {', '.join(METHODS)}",
                            param="method") from None


# --------------------------------------------------------------------------------------------- kernels


def _trim_top_k(t, k: float):
    """Keep the ceil(k * numel) largest magnitudes (ties at the threshold are kept), zero the rest."""
    import math

    import torch

    numel = t.numel()
    keep = max(1, int(math.ceil(k * numel)))
    if keep >= numel:
        return t.clone()
    a = t.abs().reshape(-1)
    thr = torch.kthvalue(a.float() if a.dtype in (torch.float16, torch.bfloat16) else a, numel - keep + 1).values
    return torch.where(t.abs() >= thr, t, torch.zeros((), dtype=t.dtype, device=t.device))


def ties_tensor(taus: Sequence, k: float = 0.2):
    """TIES-merging of one tensor (Yadav et al. 2023, Algorithm 1): trim (top-k per task vector), elect
    sign (sign of the sum of the trimmed vectors), disjoint mean of the entries that agree with it.

    Trimming is per tensor (the original TIES trims over the whole flattened task vector); streaming
    tensor by tensor makes the per-tensor form the one that scales.
    """
    import torch

    trimmed = [_trim_top_k(t, k) for t in taus]
    total = trimmed[0].clone()
    for t in trimmed[1:]:
        total += t
    elected = torch.sign(total)
    acc = torch.zeros_like(total)
    cnt = torch.zeros_like(total)
    for t in trimmed:
        agree = (torch.sign(t) == elected) & (t != 0)
        acc += torch.where(agree, t, torch.zeros((), dtype=t.dtype, device=t.device))
        cnt += agree.to(acc.dtype)
    merged = acc / cnt.clamp(min=1)
    return merged, int(torch.count_nonzero(cnt))


def dare_tensor(t, p: float, generator):
    """DARE drop-and-rescale (Yu et al. 2024): keep each element with probability 1-p, scale the kept
    ones by 1/(1-p)."""
    import torch

    if p <= 0:
        return t
    keep = torch.rand(t.shape, generator=generator, device=t.device) >= p
    return torch.where(keep, t / (1.0 - p), torch.zeros((), dtype=t.dtype, device=t.device))


def dare_generator(seed: int, name: str, i: int, device):
    """The DARE mask stream of candidate i's tensor `name`: ``derive(seed, "dare", name, i)``."""
    return derive(seed, "dare", name, i).torch(str(device))


def merge_tensor(taus: Sequence, cfg: MergeConfig, name: str = ""):
    """Merge the task vectors of one tensor with `cfg.method` (the streamed merge's own code, fed from a
    list); returns (merged tau, kept element count). `name` keys the DARE masks."""
    t0 = taus[0]
    acc = _Accumulator(cfg, len(taus), tuple(t0.shape), t0.dtype, BufferPool(t0.device), name)
    for i, t in enumerate(taus):
        if acc.wants(i):
            acc.add(t, i)
    return acc.finish()


def negmerge_tensor(taus: Sequence):
    """Sign-consensual merge of one tensor: (where(|sum sign| == N, sum / N, 0), number of kept elements)."""
    return merge_tensor(taus, MergeConfig("negmerge"))


def uniform_tensor(taus: Sequence):
    return merge_tensor(taus, MergeConfig("uniform"))


def magmax_tensor(taus: Sequence):
    """Per element the value of largest magnitude (first candidate wins ties)."""
    return merge_tensor(taus, MergeConfig("magmax"))


def compute_dtype(dtype):
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------------------------- streaming


@dataclass
class MergeStats:
    """Sparsity and throughput of one merge: kept fraction overall and per tensor."""

    method: str
    n_candidates: int
    numel: int = 0
    kept: int = 0
    n_tensors: int = 0
    skipped_non_float: list = field(default_factory=list)
    per_tensor: dict = field(default_factory=dict)
    bytes_read: int = 0
    seconds: float = 0.0
    non_finite_inputs: list = field(default_factory=list)  # (file, tensor, count): only with allow_non_finite

    @property
    def non_finite_tensors(self) -> set:
        """Names of the tensors whose inputs held NaN/inf (allowed in)."""
        return {r["tensor"] for r in self.non_finite_inputs}

    def add(self, spec, kept: int, n_read: int) -> None:
        """Count one merged tensor: its elements, those kept, and the bytes of the n_read tensors read."""
        self.bytes_read += n_read * spec.nbytes
        self.numel += spec.numel
        self.kept += kept
        self.n_tensors += 1
        self.per_tensor[spec.name] = (spec.numel, kept)

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.numel if self.numel else float("nan")

    def summary(self, per_tensor: bool = False) -> dict:
        d = {"method": self.method, "n_candidates": self.n_candidates, "n_tensors": self.n_tensors,
             "numel": self.numel, "kept": self.kept, "kept_fraction": self.kept_fraction,
             "skipped_non_float": self.skipped_non_float, "bytes_read": self.bytes_read,
             "seconds": round(self.seconds, 4), "non_finite_inputs": self.non_finite_inputs,
             "read_gb_per_s": (self.bytes_read / 1e9 / self.seconds) if self.seconds > 0 else None}
        if per_tensor:
            d["per_tensor"] = {k: {"numel": n, "kept_fraction": (c / n if n else None)}
                               for k, (n, c) in self.per_tensor.items()}
        return d


def open_and_check(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig) -> None:
    """Validate the inputs before any arithmetic: method options, candidate count, keys, shapes, dtypes."""
    cfg.validate(len(candidates))
    for c in candidates:
        check_compatible(base, c)
    if not any(is_float_dtype(s.dtype) for s in base.specs.values()):
        raise BadInputError(f"{base.path}: no floating-point tensor to merge")


def check_input(t, reader: CheckpointReader, name: str, allow: bool, stats: MergeStats | None) -> None:
    """Refuse an input tensor holding NaN/inf, naming its file and tensor; with `allow`, record it in
    `stats.non_finite_inputs` instead (the output is still checked)."""
    if all_finite(t):
        return
    k = count_non_finite(t)
    if not allow:
        raise BadInputError(f"{reader.path}: tensor {name!r} holds {k} NaN/inf value{'s' * (k != 1)} (of {t.numel()}); "
                            "non-finite inputs are refused unless allowed", param="allow_non_finite")
    if stats is not None:
        stats.non_finite_inputs.append({"file": str(reader.path), "tensor": name, "count": k})


def check_output(t, name: str, lam: float, tainted: bool = False, param: str | None = "lam") -> None:
    """A non-finite output tensor is a RuntimeFailure naming it and the likely cause: lambda too large for
    the dtype (finite inputs), or non-finite inputs let in (`tainted`) that reach it."""
    if all_finite(t):
        return
    dt = str(t.dtype).replace("torch.", "")
    if tainted:
        raise RuntimeFailure(f"tensor {name!r} of the output would hold NaN/inf at lambda = {lam:g}: the non-finite "
                             "input values let in reach it; nothing written", param="allow_non_finite")
    raise RuntimeFailure(f"tensor {name!r}: theta_pre - lambda * tau is not finite in {dt} at lambda = {lam:g} "
                         "(lambda too large for the dtype?); nothing written", param=param)


class BufferPool:
    """Flat tensors reused across tensors of the model (allocation and page faults dominate otherwise)."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.bufs: dict = {}

    def get(self, key: str, shape, dtype):
        import torch

        numel = 1
        for s_ in shape:
            numel *= int(s_)
        b = self.bufs.get(key)
        if b is None or b.dtype != dtype or b.numel() < numel:
            self.bufs.pop(key, None)
            b = torch.empty(max(numel, 1), dtype=dtype, device=self.device)
            self.bufs[key] = b
        return b[:numel].view(tuple(shape))


class _Accumulator:
    """The per-tensor state of one merge: the method's buffers (from the pool) and its list of items.

    negmerge, uniform, magmax and task_arithmetic need O(1) buffers whatever N is; TIES keeps a copy
    of each task vector of the current tensor."""

    def __init__(self, cfg: MergeConfig, n: int, shape, dtype, pool: BufferPool, name: str):
        import torch

        self.cfg, self.n, self.name = cfg, n, name
        self.method = method(cfg.method)
        self.k = 0
        self.items: list = []
        for key, dt in self.method.buffers:
            setattr(self, key, pool.get(key, shape, dtype if dt is None else getattr(torch, dt)))

    def wants(self, i: int) -> bool:
        return self.method.wants(i, self.cfg)

    def add(self, tau, i: int):
        """Add candidate i's task vector (i keys its DARE mask)."""
        if self.cfg.dare_p > 0:
            tau = dare_tensor(tau, self.cfg.dare_p, dare_generator(self.cfg.seed, self.name, i, tau.device))
        self.method.add(self, tau, self.k)
        self.k += 1

    def finish(self):
        """(merged tau, kept count); the tensor may live in a reused buffer."""
        return self.method.finish(self, self.n)

    def witness(self):
        """The buffer (before :meth:`finish`) that is finite only if every task vector added was, or None
        (the method keeps no running sum, or DARE's drops could hide a NaN): then each input is checked."""
        if self.cfg.dare_p > 0 or self.method.witness is None:
            return None
        return getattr(self, self.method.witness)


def _merge_one(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig, spec,
               device: str, cpu_pool: BufferPool, dev_pool: BufferPool, allow: bool = False,
               stats: MergeStats | None = None):
    """Merge one float tensor: (base tensor, merged tau, kept count, tensors read), in reused buffers. Every
    tensor read is checked finite: through the merge's witness buffer (one reduction; the base and each
    candidate are checked one by one only once it is non-finite), else each as it is read."""
    import torch

    name, shape, cd = spec.name, tuple(spec.shape), compute_dtype(spec.dtype)
    same = cd == spec.dtype and device == "cpu"
    acc = _Accumulator(cfg, len(candidates), shape, cd, dev_pool, name)
    each = acc.witness() is None
    b = base.get_into(name, cpu_pool.get("raw_base", shape, spec.dtype))
    if each:
        check_input(b, base, name, allow, stats)
    bd = b if same else dev_pool.get("base_c", shape, cd).copy_(b)
    n_read = 1
    with torch.no_grad():
        for j, c in enumerate(candidates):
            if not acc.wants(j):
                continue
            raw = c.get_into(name, cpu_pool.get("raw_cand", shape, spec.dtype))
            if each:
                check_input(raw, c, name, allow, stats)
            tau = raw if same else dev_pool.get("tau", shape, cd).copy_(raw)
            tau.sub_(bd)
            acc.add(tau, j)
            n_read += 1
        if not each and not all_finite(acc.witness()):
            _find_non_finite(base, candidates, acc, name, allow, stats)
        merged, kept = acc.finish()
    return b, merged, kept, n_read


def _find_non_finite(base: CheckpointReader, candidates: Sequence[CheckpointReader], acc: _Accumulator, name: str,
                     allow: bool, stats: MergeStats | None) -> None:
    """Once a witness turned non-finite: the base and every candidate read, checked one by one (re-read).
    If all are finite, a task vector overflowed the compute dtype: the output check decides."""
    check_input(base.get(name), base, name, allow, stats)
    for j, c in enumerate(candidates):
        if acc.wants(j):
            check_input(c.get(name), c, name, allow, stats)


def iter_merged(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                names: Sequence[str], device: str = "cpu", stats: MergeStats | None = None,
                progress: Callable | None = None, reuse: bool = False, allow_non_finite: bool = False):
    """Yield (name, base tensor, merged tau or None) tensor by tensor, reading one candidate tensor at a time.

    tau is in the compute dtype on `device`; None for integer/bool tensors (copied from the base). With
    `reuse=True` the yielded tensors live in buffers reused for the next tensor: consume them first. An
    input tensor holding NaN/inf is refused unless `allow_non_finite` (then listed in `stats`).
    """
    stats = stats if stats is not None else MergeStats(cfg.method, len(candidates))
    t0 = time.perf_counter()
    cpu_pool = BufferPool("cpu")
    dev_pool = cpu_pool if device == "cpu" else BufferPool(device)
    for i, name in enumerate(names):
        spec = base.specs[name]
        if not is_float_dtype(spec.dtype):
            stats.bytes_read += spec.nbytes
            stats.skipped_non_float.append(name)
            yield name, base.get(name), None
        else:
            b, merged, kept, n_read = _merge_one(base, candidates, cfg, spec, device, cpu_pool, dev_pool,
                                                 allow_non_finite, stats)
            if not reuse:
                b, merged = b.clone(), merged.clone()
            stats.add(spec, kept, n_read)
            yield name, b, merged
        stats.seconds = time.perf_counter() - t0
        if progress is not None:
            progress("merging tensors", i + 1, len(names))


def negate_into(b, tau, lam: float, name: str = "", tainted: bool = False, param: str | None = "lam"):
    """Task negation, theta = theta_pre - lambda * tau (NegMerge Sec. 3; Ilharco et al. 2023), in the compute
    dtype, cast back to the base's dtype on the CPU; a non-finite result raises (:func:`check_output`)."""
    if tau is None:
        return b
    bd = b.to(device=tau.device, dtype=tau.dtype)
    out = (bd - lam * tau).to(device="cpu", dtype=b.dtype)
    check_output(out, name, lam, tainted, param)
    return out


def merge_to_checkpoint(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                        lam: float, out_path, fmt: str = "same", device: str = "cpu", record: dict | None = None,
                        progress: Callable | None = None, allow_non_finite: bool = False) -> MergeStats:
    """Stream theta_pre - lam * merge(tau_1..tau_N) into `out_path` (atomic; base's format unless `fmt` says
    otherwise): the streamed form of :func:`negate_into` over :func:`iter_merged`. Inputs and outputs are
    checked finite tensor by tensor; a failure leaves nothing at `out_path`."""
    import torch

    open_and_check(base, candidates, cfg)
    stats = MergeStats(cfg.method, len(candidates))
    record = {**default_record(base, candidates, cfg, lam), **(record or {})}
    pool = BufferPool(device)
    with CheckpointWriter(base, out_path, fmt=fmt, record=record) as w:
        for name, b, tau in iter_merged(base, candidates, cfg, w.order, device, stats, progress, reuse=True,
                                        allow_non_finite=allow_non_finite):
            if tau is None:
                w.write(name, b)
                continue
            bd = b if (b.dtype == tau.dtype and b.device == tau.device) else pool.get("bd", b.shape, tau.dtype).copy_(b)
            scaled = torch.mul(tau, lam, out=pool.get("scaled", b.shape, tau.dtype))
            res = torch.sub(bd, scaled, out=pool.get("res", b.shape, tau.dtype))  # = negate_into(b, tau, lam)
            res = res if (res.dtype == b.dtype and res.device.type == "cpu") else res.to("cpu", b.dtype)
            check_output(res, name, lam, name in stats.non_finite_tensors)
            w.write(name, res)
    return stats


def default_record(base, candidates, cfg: MergeConfig, lam: float) -> dict:
    """The metadata record written with every merged checkpoint."""
    from dataclasses import asdict

    return {"tool": "icml negmerge", "method": cfg.method, "lam": lam, "operation": "theta_pre - lam * tau",
            "base": str(base.path), "candidates": [str(c.path) for c in candidates], "config": asdict(cfg)}


def merged_task_vector(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                       device: str = "cpu", progress: Callable | None = None, allow_non_finite: bool = False):
    """The merged task vector as a dict (compute dtype, CPU) for a lambda search: one model in memory.
    Inputs are checked finite as they are read (see :func:`iter_merged`)."""
    open_and_check(base, candidates, cfg)
    stats = MergeStats(cfg.method, len(candidates))
    tau = {}
    for name, _b, t in iter_merged(base, candidates, cfg, base.keys(), device, stats, progress,
                                   allow_non_finite=allow_non_finite):
        if t is not None:
            tau[name] = t.to("cpu")
    return tau, stats


def apply_task_vector(base: CheckpointReader, tau: dict, lam: float, out_path, fmt: str = "same",
                      record: dict | None = None, tainted: Sequence[str] = (), param: str | None = "lam") -> None:
    """Write base - lam * tau (tensor by tensor, atomically); a non-finite tensor raises and leaves nothing.
    `tainted` names the tensors whose inputs held NaN/inf (allowed in); `param` the source of `lam` in errors."""
    with CheckpointWriter(base, out_path, fmt=fmt, record=record) as w:
        for name in w.order:
            w.write(name, negate_into(base.get(name), tau.get(name), lam, name, name in tainted, param))


def apply_to_state_dict(base_sd: dict, tau: dict, lam: float, param: str | None = None) -> dict:
    """In memory: {name: base - lam * tau} (integer tensors copied); a non-finite tensor raises."""
    return {k: negate_into(v, tau.get(k), lam, k, param=param) for k, v in base_sd.items()}
