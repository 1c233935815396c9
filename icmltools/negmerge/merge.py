"""NegMerge and the baseline merges of task vectors, per tensor, streamed over checkpoints.

Notation (paper, Sec. 3): tau_i = theta_i - theta_pre for the N models fine-tuned on the forget set.

* ``negmerge`` (Sec. 3.2, official CLIP code): keep an element only when all N task vectors share the same
  strict sign, |sum_i sign(tau_i)| == N (an exact zero anywhere drops it); tau = where(mask, sum_i tau_i / N, 0).
* ``task_arithmetic``: one candidate's tau (Ilharco et al. 2023), the paper's main competitor.
* ``uniform``: mean of all tau_i.
* ``ties`` (Yadav et al. 2023): trim each tau_i to its top-k fraction by magnitude, elect the sign of the sum
  of the trimmed vectors, average the trimmed entries that agree with it (disjoint mean).
* ``magmax`` (Marczak et al. 2024): per element, the tau_i of largest magnitude.
* optional DARE (Yu et al. 2024) before any of them: drop each element with probability p, rescale by 1/(1-p).

The unlearned model is theta = theta_pre - lambda * tau. Integer and bool tensors (e.g. BatchNorm
``num_batches_tracked``) carry no task vector and are copied from the base. Arithmetic runs in float32
(float64 for float64 tensors) on the chosen device; the output keeps each tensor's dtype.
"""
from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

from icmltools.core.errors import BadInputError
from icmltools.taskvec import CheckpointReader, CheckpointWriter, check_compatible, is_float_dtype

log = logging.getLogger(__name__)

METHODS = ("negmerge", "task_arithmetic", "uniform", "ties", "magmax")


@dataclass(frozen=True)
class MergeConfig:
    """How to merge the task vectors (the same for a file merge and for the demo)."""

    method: str = "negmerge"
    ties_k: float = 0.2          # TIES: fraction of each task vector kept (top-k by magnitude)
    dare_p: float = 0.0          # DARE drop probability; 0 = off
    index: int = 0               # task_arithmetic: which candidate
    seed: int = 0                # DARE masks

    def validate(self, n_candidates: int) -> None:
        if self.method not in METHODS:
            raise BadInputError(f"unknown merge method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.method == "task_arithmetic":
            if n_candidates < 1:
                raise BadInputError("task_arithmetic needs at least one candidate")
            if not 0 <= self.index < n_candidates:
                raise BadInputError(f"--ta-index {self.index} is out of range for {n_candidates} candidate(s)")
        elif n_candidates < 2:
            raise BadInputError(f"{self.method} merges at least 2 candidates, got {n_candidates}",
                                hint="pass more --candidate files, or use --method task_arithmetic for one")
        if not 0.0 < self.ties_k <= 1.0:
            raise BadInputError(f"--ties-k must be in (0, 1], got {self.ties_k}")
        if not 0.0 <= self.dare_p < 1.0:
            raise BadInputError(f"--dare must be in [0, 1), got {self.dare_p}")


# --------------------------------------------------------------------------------------------- kernels


def negmerge_tensor(taus: Sequence):
    """Sign-consensual merge of one tensor: (where(|sum sign| == N, sum / N, 0), number of kept elements)."""
    import torch

    n = len(taus)
    total = taus[0].clone()
    signs = torch.sign(taus[0]).to(torch.int32)
    for t in taus[1:]:
        total += t
        signs += torch.sign(t).to(torch.int32)
    mask = signs.abs() == n
    del signs
    merged = torch.where(mask, total / n, torch.zeros((), dtype=total.dtype, device=total.device))
    return merged, int(torch.count_nonzero(mask))


def uniform_tensor(taus: Sequence):
    import torch

    total = taus[0].clone()
    for t in taus[1:]:
        total += t
    merged = total / len(taus)
    return merged, int(torch.count_nonzero(merged))


def magmax_tensor(taus: Sequence):
    """Per element the value of largest magnitude (first candidate wins ties)."""
    import torch

    best = taus[0].clone()
    for t in taus[1:]:
        best = torch.where(t.abs() > best.abs(), t, best)
    return best, int(torch.count_nonzero(best))


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
    """TIES-merging of one tensor: trim (top-k per task vector), elect sign (sign of the sum), disjoint mean.

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
    """Drop-and-rescale: keep each element with probability 1-p, scale the kept ones by 1/(1-p)."""
    import torch

    if p <= 0:
        return t
    keep = torch.rand(t.shape, generator=generator, device=t.device) >= p
    return torch.where(keep, t / (1.0 - p), torch.zeros((), dtype=t.dtype, device=t.device))


def merge_tensor(taus: Sequence, cfg: MergeConfig, name: str = "", device: str = "cpu"):
    """Merge the task vectors of one tensor with `cfg.method`; returns (merged tau, kept element count)."""
    import torch

    if cfg.dare_p > 0:
        out = []
        for i, t in enumerate(taus):
            g = torch.Generator(device=device)
            g.manual_seed((cfg.seed * 1_000_003 + zlib.crc32(name.encode()) * 131 + i) % (2**63))
            out.append(dare_tensor(t, cfg.dare_p, g))
        taus = out
    m = cfg.method
    if m == "negmerge":
        return negmerge_tensor(taus)
    if m == "task_arithmetic":
        t = taus[cfg.index]
        return t, int(torch.count_nonzero(t))
    if m == "uniform":
        return uniform_tensor(taus)
    if m == "ties":
        return ties_tensor(taus, cfg.ties_k)
    if m == "magmax":
        return magmax_tensor(taus)
    raise BadInputError(f"unknown merge method {m!r}")


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

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.numel if self.numel else float("nan")

    def summary(self, per_tensor: bool = False) -> dict:
        d = {"method": self.method, "n_candidates": self.n_candidates, "n_tensors": self.n_tensors,
             "numel": self.numel, "kept": self.kept, "kept_fraction": self.kept_fraction,
             "skipped_non_float": self.skipped_non_float, "bytes_read": self.bytes_read,
             "seconds": round(self.seconds, 4),
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
    """Merges task vectors arriving one at a time into reused buffers.

    negmerge, uniform, magmax and task_arithmetic need O(1) buffers whatever N is; TIES keeps a copy
    of each task vector of the current tensor (its sign election needs all of them)."""

    def __init__(self, cfg: MergeConfig, n: int, shape, dtype, pool: BufferPool, name: str):
        import torch

        self.cfg, self.n, self.name, self.pool = cfg, n, name, pool
        self.i = 0
        m = cfg.method
        if m in ("negmerge", "uniform", "task_arithmetic"):
            self.total = pool.get("total", shape, dtype)
        if m == "negmerge":
            # all N share a strict sign  <=>  min_i tau_i > 0 or max_i tau_i < 0  (NaN never kept)
            self.mn = pool.get("min", shape, dtype)
            self.mx = pool.get("max", shape, dtype)
            self.tb = pool.get("tb", shape, torch.bool)
        if m == "magmax":
            self.best = pool.get("best", shape, dtype)
        self.kept_list: list = []

    def wants(self, i: int) -> bool:
        return self.cfg.method != "task_arithmetic" or i == self.cfg.index

    def add(self, tau, j: int):
        """Add candidate j's task vector (j seeds its DARE mask, as in :func:`merge_tensor`)."""
        import torch

        cfg, i = self.cfg, self.i
        self.i += 1
        if cfg.dare_p > 0:
            g = torch.Generator(device=tau.device)
            g.manual_seed((cfg.seed * 1_000_003 + zlib.crc32(self.name.encode()) * 131 + j) % (2**63))
            tau = dare_tensor(tau, cfg.dare_p, g)
        m = cfg.method
        if m in ("negmerge", "uniform"):
            if i == 0:
                self.total.copy_(tau)
            else:
                self.total.add_(tau)
            if m == "negmerge":
                if i == 0:
                    self.mn.copy_(tau)
                    self.mx.copy_(tau)
                else:
                    torch.minimum(self.mn, tau, out=self.mn)
                    torch.maximum(self.mx, tau, out=self.mx)
        elif m == "task_arithmetic":
            self.total.copy_(tau)
        elif m == "magmax":
            if i == 0:
                self.best.copy_(tau)
            else:
                self.best.copy_(torch.where(tau.abs() > self.best.abs(), tau, self.best))
        elif m == "ties":
            self.kept_list.append(tau.clone())
        else:
            raise BadInputError(f"unknown merge method {m!r}")

    def finish(self):
        """(merged tau, kept count); the tensor may live in a reused buffer."""
        import torch

        m = self.cfg.method
        if m == "negmerge":
            mask = torch.gt(self.mn, 0, out=self.tb)
            mask.logical_or_(self.mx < 0)
            self.total.div_(self.n)
            self.total.masked_fill_(mask.logical_not_(), 0)
            return self.total, int(self.tb.numel() - torch.count_nonzero(self.tb))
        if m == "uniform":
            self.total.div_(self.n)
            return self.total, int(torch.count_nonzero(self.total))
        if m == "task_arithmetic":
            return self.total, int(torch.count_nonzero(self.total))
        if m == "magmax":
            return self.best, int(torch.count_nonzero(self.best))
        merged, kept = ties_tensor(self.kept_list, self.cfg.ties_k)
        self.kept_list = []
        return merged, kept


def iter_merged(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                names: Sequence[str], device: str = "cpu", stats: MergeStats | None = None,
                progress: Callable | None = None, reuse: bool = False):
    """Yield (name, base tensor, merged tau or None) tensor by tensor, reading one candidate tensor at a time.

    tau is in the compute dtype on `device`; None for integer/bool tensors (copied from the base). With
    `reuse=True` the yielded tensors live in buffers reused for the next tensor: consume them first.
    """
    import torch

    total = len(names)
    t0 = time.perf_counter()
    cpu_pool = BufferPool("cpu")
    dev_pool = cpu_pool if device == "cpu" else BufferPool(device)
    for i, name in enumerate(names):
        spec = base.specs[name]
        if not is_float_dtype(spec.dtype):
            b = base.get(name)
            if stats is not None:
                stats.bytes_read += spec.nbytes
                stats.skipped_non_float.append(name)
            yield name, b, None
        else:
            shape, cd = tuple(spec.shape), compute_dtype(spec.dtype)
            same = cd == spec.dtype and device == "cpu"
            b = base.get_into(name, cpu_pool.get("raw_base", shape, spec.dtype))
            bd = b if same else dev_pool.get("base_c", shape, cd).copy_(b)
            acc = _Accumulator(cfg, len(candidates), shape, cd, dev_pool, name)
            with torch.no_grad():
                for j, c in enumerate(candidates):
                    if not acc.wants(j):
                        continue
                    raw = c.get_into(name, cpu_pool.get("raw_cand", shape, spec.dtype))
                    tau = raw if same else dev_pool.get("tau", shape, cd).copy_(raw)
                    tau.sub_(bd)
                    acc.add(tau, j)
                    if stats is not None:
                        stats.bytes_read += spec.nbytes
                merged, kept = acc.finish()
            if not reuse:
                b, merged = b.clone(), merged.clone()
            if stats is not None:
                stats.bytes_read += spec.nbytes
                stats.numel += spec.numel
                stats.kept += kept
                stats.n_tensors += 1
                stats.per_tensor[name] = (spec.numel, kept)
            yield name, b, merged
        if stats is not None:
            stats.seconds = time.perf_counter() - t0
        if progress is not None:
            progress("merging tensors", i + 1, total)


def negate_into(b, tau, lam: float):
    """theta = theta_pre - lambda * tau, in the compute dtype, cast back to the base's dtype on the CPU."""
    if tau is None:
        return b
    bd = b.to(device=tau.device, dtype=tau.dtype)
    return (bd - lam * tau).to(device="cpu", dtype=b.dtype)


def merge_to_checkpoint(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                        lam: float, out_path, fmt: str = "same", device: str = "cpu", record: dict | None = None,
                        progress: Callable | None = None) -> MergeStats:
    """Stream base - lam * merge(tau_i) into `out_path` (atomic; base's format unless `fmt` says otherwise)."""
    import torch

    open_and_check(base, candidates, cfg)
    stats = MergeStats(cfg.method, len(candidates))
    record = {**default_record(base, candidates, cfg, lam), **(record or {})}
    pool = BufferPool(device)
    with CheckpointWriter(base, out_path, fmt=fmt, record=record) as w:
        for name, b, tau in iter_merged(base, candidates, cfg, w.order, device, stats, progress, reuse=True):
            if tau is None:
                w.write(name, b)
                continue
            bd = b if (b.dtype == tau.dtype and b.device == tau.device) else pool.get("bd", b.shape, tau.dtype).copy_(b)
            scaled = torch.mul(tau, lam, out=pool.get("scaled", b.shape, tau.dtype))
            res = torch.sub(bd, scaled, out=pool.get("res", b.shape, tau.dtype))  # = negate_into(b, tau, lam)
            w.write(name, res if (res.dtype == b.dtype and res.device.type == "cpu") else res.to("cpu", b.dtype))
    return stats


def default_record(base, candidates, cfg: MergeConfig, lam: float) -> dict:
    """The metadata record written with every merged checkpoint."""
    from dataclasses import asdict

    return {"tool": "icml negmerge", "method": cfg.method, "lam": lam, "operation": "theta_pre - lam * tau",
            "base": str(base.path), "candidates": [str(c.path) for c in candidates], "config": asdict(cfg)}


def merged_task_vector(base: CheckpointReader, candidates: Sequence[CheckpointReader], cfg: MergeConfig,
                       device: str = "cpu", progress: Callable | None = None):
    """The merged task vector as a dict (compute dtype, CPU) for a lambda search: one model in memory."""
    open_and_check(base, candidates, cfg)
    stats = MergeStats(cfg.method, len(candidates))
    tau = {}
    for name, _b, t in iter_merged(base, candidates, cfg, base.keys(), device, stats, progress):
        if t is not None:
            tau[name] = t.to("cpu")
    return tau, stats


def apply_task_vector(base: CheckpointReader, tau: dict, lam: float, out_path, fmt: str = "same",
                      record: dict | None = None) -> None:
    """Write base - lam * tau (tensor by tensor, atomically)."""
    with CheckpointWriter(base, out_path, fmt=fmt, record=record) as w:
        for name in w.order:
            w.write(name, negate_into(base.get(name), tau.get(name), lam))


def apply_to_state_dict(base_sd: dict, tau: dict, lam: float) -> dict:
    """In memory: {name: base - lam * tau} (integer tensors copied)."""
    return {k: negate_into(v, tau.get(k), lam) for k, v in base_sd.items()}
