"""The streamed merge: tau_i = theta_i - theta_0 per tensor, merged by one registered method, theta = theta_0 +
lam * merge(tau_1..tau_N) (or theta_0 - lam * merge for task negation), written tensor by tensor.

A method is one :class:`MergeMethod` subclass, registered with :func:`register`. The engine reads each tensor of
the base and of every model lazily (:mod:`icmltools.taskvec`), in float32 (float64 stays float64) on the chosen
device, and feeds the method one model at a time, in the given order, into reused buffers; the output keeps the
base's format and each tensor's dtype and is written atomically (a failure leaves nothing).

Chunks: a method that is ``local`` (element-wise rules, n:m blocks) is fed the flattened tensor in slices of
``plan.chunk_elems`` elements (a multiple of the method's ``chunk_multiple``), so the buffers are a few chunks
whatever the number of models, and the output is bitwise the unchunked one. A method with per-tensor statistics
(top-k thresholds) ``scans`` each model's whole tensor first (one model at a time) and then runs chunked.

Finite in, finite out: each task-vector chunk is checked with one reduction (a NaN/inf input makes it
non-finite), or, for a method with a ``witness`` running sum, that sum once per chunk; a non-finite one names
the tensor and the model file (inputs let in with ``allow_non_finite`` are listed instead), and a non-finite
output tensor is a :class:`RuntimeFailure` that leaves no output.
"""
from __future__ import annotations

import abc
import fnmatch
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.memory import settle_malloc
from icmltools.core.seed import derive
from icmltools.taskvec import (
    CheckpointReader,
    CheckpointWriter,
    MemoryReader,
    TensorSpec,
    WriteBehind,
    all_finite,
    check_compatible,
    count_non_finite,
    is_float_dtype,
)
from icmltools.taskvec.writers import DIRECT_BLOCK

from . import kernels as K
from .options import CHUNK_ELEMS, OUT_DTYPES

log = logging.getLogger(__name__)

__all__ = ["MergeMethod", "REGISTRY", "register", "get_method", "Plan", "make_plan", "TensorState", "BufferPool",
           "MergeStats", "TopK", "iter_merged", "merge_to_checkpoint", "merged_task_vector", "merge_state_dicts",
           "merge_tensor", "apply_task_vector", "apply_to_state_dict", "dare_tensor", "dare_generator",
           "check_input", "check_output", "compute_dtype", "open_and_check"]


# --------------------------------------------------------------------------------------------- the method interface



def check_model_paths(base: str, models: Sequence[str], param: str = "models") -> None:
    """The base given as a model (a zero task vector) or a model given twice (an overlapping shell glob) is a
    mistake: refused before anything is opened, naming `param`."""
    from pathlib import Path

    seen: dict = {}
    b = Path(base).resolve()
    for c in models:
        r = Path(c).resolve()
        if r == b:
            raise BadInputError(f"{c}: is the base itself (its task vector is zero)", param=param)
        if r in seen:
            raise BadInputError(f"{c}: given twice (also as {seen[r]})", param=param)
        seen[r] = c


class MergeMethod(abc.ABC):
    """One merge of N task vectors, per tensor, fed one model at a time (mergekit's ``MergeMethod``, streamed).

    Class attributes:
      ``name``, ``reference`` (paper); ``options`` (global parameter -> default, resolved into ``plan.options``);
      ``model_options`` (per-model parameter -> default, resolved into ``plan.models[i]``; ``weight`` and
      ``density`` are generic: ``plan.weights[i]``, ``plan.densities[i]``); ``buffers`` ((attribute, None for
      the compute dtype or a torch dtype name) allocated chunk-sized from the pool and set on the tensor state
      for every chunk); ``local`` (the rule is element-wise or block-local: the engine may chunk);
      ``chunk_multiple`` (chunk boundaries fall on multiples of this many flattened elements, e.g. m of n:m);
      ``passes`` (each model's chunk is fed this many times per chunk, pass index ``p``); ``scans`` (call
      :meth:`scan` with each model's whole task vector before the chunks); ``witness`` (a buffer holding the
      running sum of every task vector fed: one finiteness check per chunk stands for all inputs);
      ``min_models``; ``uses_density``; ``tracks`` (per-model kept counts and the overlap matrix, via
      ``st.mark``); ``draws_dare`` (the method draws DARE masks itself: the generic ``dare_p`` is refused);
      ``weighted`` (False: per-model weights other than 1 are refused); ``one_pass`` (:meth:`merge_raw` merges
      a chunk of every model at once; the engine falls back to feeding one model at a time where it returns
      None or finds a non-finite value, so the fallback finds and names it); :meth:`defers` (a scanning
      one-pass method that finds its scan's result inside :meth:`merge_raw`: the engine skips the scan).

    Models are always fed in the order given (index ``i``; ``k`` counts the models fed so far in this pass). A
    method keeps per-tensor state on ``st`` (set in :meth:`begin`, which runs once per tensor before any chunk).
    A new method is one subclass and one :func:`register` call.
    """

    name = ""
    reference = ""
    options: Mapping = {}
    model_options: Mapping = {}
    buffers: tuple = ()
    local = True
    chunk_multiple = 1
    passes = 1
    scans = False
    witness: str | None = None
    min_models = 1
    uses_density = False
    default_density: float | None = None
    tracks = False
    draws_dare = False
    weighted = True
    one_pass = False

    def __init__(self, name: str | None = None, **options):
        """An instance may rename the method (a command's own name for it) and change option defaults."""
        if name is not None:
            self.name = name
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown option {unknown[0]!r}")
        self.options = {**self.options, **options}

    def chunk_multiple_for(self, plan: "Plan") -> int:
        """Chunk boundaries fall on multiples of this (default ``chunk_multiple``; e.g. the lcm of per-model m)."""
        return self.chunk_multiple

    def validate(self, plan: "Plan") -> None:
        """Checks of the plan beyond the generic ones (raise BadInputError naming the parameter)."""
        return None

    def wants(self, plan: "Plan", i: int) -> bool:
        """Whether model i's task vector is read at all: a zero weight skips it (-0.0 in the base survives), and so
        does a density of 0 (mergekit's sparsifiers keep nothing of it; a divisor without a consensus still
        counts its weight, as mergekit's)."""
        return plan.weights[i] != 0 and not (self.uses_density and plan.densities[i] == 0)

    def begin(self, st: "TensorState") -> None:
        """Per-tensor setup, before any scan or chunk."""
        return None

    def scan(self, st: "TensorState", tau, i: int) -> None:
        """With ``scans``: model i's whole task vector (flattened), e.g. for a top-k threshold."""
        return None

    def scan_raw(self, st: "TensorState", raw, base, i: int):
        """Optional, as :meth:`add_raw` for :meth:`scan`: model i's whole tensor and the base's, both as read
        (a compiled loop need not store tau nor widen the base). Returns the non-finite count of tau, or None when not
        handled (then :meth:`scan` gets tau)."""
        return None

    scans_together = False

    def scan_models_raw(self, st: "TensorState", raws, base, wanted: Sequence[int]):
        """Optional, with ``scans_together``: :meth:`scan_raw` of every wanted model at once, for a method whose
        scan of a model depends on the models before it (CA-magnitude): their whole tensors as read (`raws`, views
        of the mapped files or of the tensors held in memory, in the order fed) and the base's; ``st.release(a,
        b)`` drops the inputs' mapped pages of [a, b) once read. Returns 0 when every model's scan is done, or None
        (then they are scanned one at a time)."""
        return None

    def add_raw(self, st: "TensorState", raw, base, i: int, k: int, p: int):
        """Optional: model i's chunk as read (`raw`, the checkpoint's dtype) and the base chunk in the compute
        dtype, for a method that fuses tau = raw - base with its own work (a compiled loop). Returns the
        number of non-finite task-vector elements, or None when not handled (then :meth:`add` gets tau)."""
        return None

    def merge_raw(self, st: "TensorState", raws, base, wanted: Sequence[int]):
        """With ``one_pass``: every wanted model's chunk as read (`raws`, in the order fed) and the base chunk as
        read, merged in one compiled loop that reads each input once and computes exactly what feeding the
        models one at a time and :meth:`finish` compute. Where ``st.emit`` is (output chunk, lambda, sign) the
        loop may write the output chunk itself (base + sign * lambda * merged, as :func:`kernels.apply_raw`).
        Returns (non-finite task-vector elements and running sums, merged chunk, kept count, non-finite outputs
        or None where it did not write the output), or None when not run (then the models are fed one at a
        time)."""
        return None

    def defers(self, st: "TensorState") -> bool:
        """With ``scans`` and ``one_pass``: whether :meth:`merge_raw` of this tensor (one chunk) is tried before
        any scan (``st.deferring`` set then), finding what the scan would in its own pass; where it returns None the
        engine scans, then calls it again."""
        return False

    @abc.abstractmethod
    def add(self, st: "TensorState", tau, i: int, k: int, p: int) -> None:
        """Model i's task-vector chunk (flattened, compute dtype; may be modified), the k-th fed in pass p."""

    @abc.abstractmethod
    def finish(self, st: "TensorState"):
        """(merged task-vector chunk or None for "leave the base unchanged", kept element count) of the chunk."""


REGISTRY: dict[str, MergeMethod] = {}


def register(method: MergeMethod | type) -> MergeMethod:
    """Add a method (class or instance) to :data:`REGISTRY` under its name; returns the instance. Usable as a
    class decorator (then returns the class)."""
    inst = method() if isinstance(method, type) else method
    if not inst.name:
        raise TypeError(f"{type(inst).__name__}: a merge method needs a name")
    REGISTRY[inst.name] = inst
    return method


def get_method(name: str | MergeMethod) -> MergeMethod:
    """The registered method `name` (an instance passes through)."""
    if isinstance(name, MergeMethod):
        return name
    from . import methods  # noqa: F401  (registers the general methods)

    try:
        return REGISTRY[name]
    except KeyError:
        raise BadInputError(f"unknown merge method {name!r}; choose one of {', '.join(sorted(REGISTRY))}",
                            param="method") from None


# --------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Plan:
    """A resolved, checked merge: the method, per-model weights/densities/options, the global options."""

    method: MergeMethod
    n_models: int
    weights: tuple
    densities: tuple
    options: Mapping
    models: tuple
    seed: int = 0
    dare_p: float = 0.0
    chunk_elems: int | None = CHUNK_ELEMS
    include: tuple = ()
    exclude: tuple = ()
    tensor_params: Callable | None = None  # name -> {"weights": .., "densities": ..} of that tensor, or None

    def selected(self, name: str) -> bool:
        """Whether tensor `name` is merged (include globs, if any, match it and no exclude glob does)."""
        if self.include and not any(fnmatch.fnmatchcase(name, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.exclude)

    def for_tensor(self, name: str) -> "Plan":
        """The plan of tensor `name`: this one, or with the weights / densities `tensor_params` gives that tensor
        (per-tensor settings, as mergekit's filters and layer gradients), checked as make_plan checks them."""
        got = self.tensor_params(name) if self.tensor_params is not None else None
        if not got:
            return self
        w = tuple(float(x) for x in got.get("weights", self.weights))
        d = tuple(None if x is None else float(x) for x in got.get("densities", self.densities))
        _check_values(self.method, w, d, f" (tensor {name!r})")
        return replace(self, weights=w, densities=d, tensor_params=None)

    def describe(self) -> dict:
        """The plan as plain data (records, run folders)."""
        tp = self.tensor_params
        return {"method": self.method.name, "n_models": self.n_models, "weights": list(self.weights),
                "densities": list(self.densities), "options": dict(self.options), "models": [dict(m) for m in self.models],
                "seed": self.seed, "dare_p": self.dare_p, "chunk_elems": self.chunk_elems,
                "include": list(self.include), "exclude": list(self.exclude),
                **({"tensor_params": getattr(tp, "describe", lambda: "per tensor")()} if tp is not None else {})}


def _per_model(values, n: int, default, what: str) -> tuple:
    if values is None:
        return (default,) * n
    vals = tuple(values)
    if len(vals) == 1 and n > 1:
        return vals * n
    if len(vals) != n:
        raise BadInputError(f"{len(vals)} values for {n} models (give one, or one per model)", param=what)
    return vals


def _check_values(m: MergeMethod, w: tuple, d: tuple, where: str = "") -> None:
    """Weights finite (and 1 where the method takes none), densities in [0, 1] where the method uses them (0: the
    model is left out of the tensor, :meth:`MergeMethod.wants`)."""
    if not all(math.isfinite(x) for x in w):
        raise BadInputError(f"weights must be finite numbers, got {list(w)}{where}", param="weights")
    if not m.weighted and any(x != 1.0 for x in w):
        raise BadInputError(f"{m.name} takes no per-model weights{where}", param="weights")
    if m.uses_density and not all(x is not None and 0.0 <= float(x) <= 1.0 for x in d):
        raise BadInputError(f"densities must be in [0, 1], got {list(d)}{where}", param="densities")


def make_plan(method: str | MergeMethod, n_models: int, *, weights=None, densities=None, options: Mapping | None = None,
              model_options: Sequence[Mapping] | None = None, seed: int = 0, dare_p: float = 0.0,
              chunk_elems: int | None = CHUNK_ELEMS, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Plan:
    """Resolve and check a merge before anything is read: per-model lists (one value broadcasts), densities in
    [0, 1], weights finite, unknown options refused, then the method's own checks. (Per-tensor values: set
    ``tensor_params`` on the plan once the tensor names are known; open_and_check checks every tensor's.)"""
    m = get_method(method)
    if n_models < m.min_models:
        raise BadInputError(f"{m.name} merges at least {m.min_models} model{'s' * (m.min_models != 1)}, got {n_models}",
                            param="models")
    w = tuple(float(x) for x in _per_model(weights, n_models, 1.0, "weights"))
    d = _per_model(densities, n_models, m.default_density, "densities")
    _check_values(m, w, d)
    d = tuple(None if x is None else float(x) for x in d)
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(m.options))
    if unknown:
        raise BadInputError(f"{m.name} has no option {unknown[0]!r} (options: {', '.join(m.options) or 'none'})",
                            param="options")
    mo = list(model_options or [{}] * n_models)
    if len(mo) != n_models:
        raise BadInputError(f"{len(mo)} per-model option sets for {n_models} models", param="model_options")
    models = tuple({**m.model_options, **dict(x or {})} for x in mo)
    if not 0.0 <= dare_p < 1.0:
        raise BadInputError(f"must be in [0, 1), got {dare_p}", param="dare_p")
    if dare_p > 0 and m.draws_dare:
        raise BadInputError(f"{m.name} drops at random itself (DARE); a second DARE would draw the same masks",
                            param="dare_p")
    if chunk_elems is not None and chunk_elems < 1:
        raise BadInputError(f"must be >= 1, got {chunk_elems}", param="chunk_elems")
    plan = Plan(m, n_models, w, d, {**m.options, **opts}, models, seed, float(dare_p), chunk_elems,
                tuple(include), tuple(exclude))
    m.validate(plan)
    return plan


# --------------------------------------------------------------------------------------------- buffers, kernels


class BufferPool:
    """Flat tensors reused across tensors of the model (allocation and page faults dominate otherwise)."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.bufs: dict = {}
        self.allocations = 0

    def get(self, key: str, shape, dtype, spare: int = 0, to_disk: bool = False):
        """Buffer `key` as `shape` (its first elements); one made anew, where it is missing or too small, takes
        `spare` elements more (address space for a later, larger request: its pages are touched only as used).
        `to_disk`: the writer sends it to the disk (an output slot; :func:`huge_page_empty`)."""
        import torch

        numel = 1
        for s_ in shape:
            numel *= int(s_)
        b = self.bufs.get(key)
        if b is None or b.dtype != dtype or b.numel() < numel:
            self.bufs.pop(key, None)
            b = huge_page_empty(numel + spare, dtype, to_disk) if self.device == "cpu" else None
            if b is None:
                b = torch.empty(max(numel + spare, 1), dtype=dtype, device=self.device)
            self.bufs[key] = b
            self.allocations += 1
        return b[:numel].view(tuple(shape))

    def flat(self, key: str, numel: int, dtype, spare: int = 0, to_disk: bool = False):
        """:meth:`get` of a flat buffer (the one-pass loops' `buf(key, numel, dtype, spare)`)."""
        return self.get(key, (numel,), dtype, spare, to_disk=to_disk)

    def holds(self, key: str, numel: int, dtype) -> int:
        """The size (elements) of buffer `key` where it exists and takes `numel` elements of `dtype` without
        growing, else 0 (a truth value too)."""
        b = self.bufs.get(key)
        return b.numel() if b is not None and b.dtype == dtype and b.numel() >= numel else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the pool's buffers (tests bound peak memory by it)."""
        return sum(b.numel() * b.element_size() for b in self.bufs.values())


_HUGE_PAGE = 1 << 21  # a transparent huge page on x86-64 (and arm64 with 4 KB pages)


def huge_page_empty(numel: int, dtype, to_disk: bool = False):
    """An uninitialised CPU tensor of `numel` elements on anonymous memory of its own whose 2 MB-aligned span the
    kernel is asked to back with transparent huge pages (madvise MADV_HUGEPAGE: THP's "madvise" mode, this
    host's, serves only such regions), for the pool's buffers of 4 MB or more; None for smaller ones or where
    the platform has no MADV_HUGEPAGE (then torch.empty). Fresh memory is faulted in page by page as the loops
    first write it: a TIES merge of the engine benchmark's files (base + 4 x 0.98 GB bf16, whole-tensor output
    slots) took 154K page faults and 0.39-0.50 s of system CPU in a fresh process, 14.5K and 0.25-0.36 s with huge
    pages (docs/merge-engine.md, Decisions). Where the kernel has none to give, plain pages back it as before.
    None too where the kernel reports free 2 MB blocks to a hypervisor (:func:`_huge_blocks_reported`), except
    for a buffer the writer sends `to_disk` (an output slot): written with O_DIRECT from plain pages, a task
    arithmetic merge of the benchmark's single files took 0.83-1.14 s against 0.66-0.68 s, the same CPU time, 3
    fresh processes each (session 47's disk took 254 pieces of memory and 4 MB a request: from 4 KB pages a
    request carries 1 MB at most, our inference of the cause)."""
    import mmap

    import numpy as np
    import torch

    size = numel * dtype.itemsize
    if size < 2 * _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE") or (not to_disk and _huge_blocks_reported()):
        return None
    # private anonymous memory (a shared map would be shmem, which THP's "madvise" mode leaves out), page-aligned:
    # one huge page more to align the span
    try:
        m = mmap.mmap(-1, size + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # refused (an address-space limit): torch.empty, which says so in its own words if it fails
        return None
    whole = np.frombuffer(m, np.uint8)  # keeps the map alive for as long as the tensor is
    a = K.aligned_span(whole, size, _HUGE_PAGE)
    try:
        m.madvise(mmap.MADV_HUGEPAGE, a.ctypes.data - whole.ctypes.data, size // _HUGE_PAGE * _HUGE_PAGE)
    except OSError:  # a kernel without THP: plain pages
        pass
    return torch.from_numpy(a).view(dtype)


def _huge_blocks_reported() -> bool:
    """Whether this guest's kernel reports free blocks of a huge page's size to its hypervisor, which discards
    them (virtio-balloon's free page reporting from order 9 or below: :func:`core.envinfo.free_page_reporting`).
    Every huge page is such a block, so once a freed one is reported (2 s after it is freed) its first write goes
    to the hypervisor: the pool's buffers other than the output slots then take plain pages, most of which come
    from blocks too small to be reported. On the Intel host of session 47 (reporting from order 9), 354 MB written
    once in a fresh process, 2.5-4 s after the last: huge pages 0.37-0.50 GB/s in 7 of 7 processes, plain pages
    0.41-2.85 GB/s (1.0-2.85 in 3 of 4). The top-k merges of the benchmark's single files (their entries 92 MB of
    such memory), 3 pairs of fresh processes each: TIES 1.57-1.72 s against 1.66-2.00, Breadcrumbs 1.57-1.62
    against 1.66-1.96, CA-magnitude 1.51-1.65 against 1.59-1.78; task arithmetic the same. Read once."""
    global _REPORTED
    if _REPORTED is None:
        from ..core.envinfo import free_page_reporting

        order = free_page_reporting()
        _REPORTED = order is not None and order <= (_HUGE_PAGE // 4096).bit_length() - 1  # 9: 2 MB in 4 KB pages
    return _REPORTED


_REPORTED: bool | None = None  # _huge_blocks_reported's answer, once read


def compute_dtype(dtype):
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def dare_tensor(t, p: float, generator, buf: Callable | None = None, rescale: bool = True):
    """DARE drop-and-rescale (Yu et al. 2024, Eq. 1-2): keep each element with probability 1-p, scale the kept
    ones by 1/(1-p) (not with `rescale` False: mergekit's ``rescale: false``, the drop alone). With `buf` (key,
    dtype -> a flat buffer of t's size) `t` itself is rescaled and zeroed, the uniforms and the mask going to
    those buffers (the same numbers and values as the allocating form)."""
    import torch

    if p <= 0:
        return t
    scale = 1.0 - p if rescale else 1.0   # x / 1.0 == x: the same loops without the rescale
    if buf is None:
        keep = torch.rand(t.shape, generator=generator, device=t.device) >= p
        return torch.where(keep, t / scale, torch.zeros((), dtype=t.dtype, device=t.device))
    if isinstance(generator, K.MTStream):  # torch.rand's numbers, drawn by a compiled loop (CPU)
        t.div_(scale)
        if K.dare_zero_mt(t, generator, p):
            return t
        u = generator.uniforms(buf("dare_u", torch.float32).view(t.shape))
    else:
        u = torch.rand(t.shape, generator=generator, device=t.device, out=buf("dare_u", torch.float32).view(t.shape))
        t.div_(scale)
    if not K.dare_zero(t, u, p):
        t.masked_fill_(torch.lt(u, p, out=buf("dare_drop", torch.bool).view(t.shape)), 0.0)
    return t


def dare_generator(seed: int, name: str, i: int, device):
    """The DARE mask stream of model i's tensor `name`: ``derive(seed, "dare", name, i)``. Its uniforms are
    drawn in flattened order, chunk after chunk, so a chunked merge draws the numbers of an unchunked one."""
    import torch

    return torch.Generator(device=str(device)).manual_seed(_dare_seed(seed, name, i))


def _dare_seed(seed: int, name: str, i: int) -> int:
    """The seed of model i's DARE stream for tensor `name` (a torch generator's, or the compiled MT19937's)."""
    return derive(seed, "dare", name, i).int(63)


class TopK:
    """Exactly k elements of largest |x| of one model's tensor (flattened), found with bounded memory.

    The threshold is the k-th largest |x| (``torch.kthvalue`` on this one model's |tau|); every element above it
    is kept, and of those equal to it the first ones in flattened order until k are kept (ties broken by lower
    index). With ``keep_ties`` every element equal to the threshold is kept (possibly more than k). The mask
    of each chunk is made by :meth:`mask`, fed the chunks in order (once per pass)."""

    def __init__(self, tau_flat, k: int, keep_ties: bool = False, counts: tuple | None = None, numel: int = 0):
        import torch

        n = tau_flat.numel() if tau_flat is not None else numel
        self.k, self.n, self.keep_ties = k, n, keep_ties
        self.seen: dict = {}
        self.thr = None
        if k <= 0 or k >= n:
            return
        # (threshold, above, equal) given (kernels.radix_select_tau), or from two histogram passes over tau
        fast = counts if counts is not None else K.radix_select(tau_flat, k)
        if fast is not None:
            self.thr, n_gt, n_eq = fast
        else:
            a = tau_flat.abs()
            self.thr = kth_largest(a, k)
            n_gt = int(torch.count_nonzero(a > self.thr))
            n_eq = int(torch.count_nonzero(a == self.thr))
        self.ties_kept = k - n_gt
        self.all_ties = keep_ties or self.ties_kept == n_eq

    def selection(self, p: int = 0) -> tuple:
        """(mode, threshold, all_ties, ties left) of the next chunk in pass p, for the compiled loops (mode 0:
        none kept, 1: all kept, 2: by threshold); advance with :meth:`advance`."""
        if self.k <= 0:
            return 0, 0.0, False, 0
        if self.thr is None:
            return 1, 0.0, False, 0
        return 2, float(self.thr), bool(self.all_ties), int(self.ties_kept - self.seen.get(p, 0))

    def advance(self, p: int, n_eq: int) -> None:
        """Count the ties at the threshold of a chunk the compiled loop went through."""
        self.seen[p] = self.seen.get(p, 0) + n_eq

    def prune(self, chunk, p: int = 0):
        """`chunk` with the dropped elements zeroed in place (= chunk.masked_fill_(~mask(chunk, p), 0))."""
        sel = self.selection(p)
        n_eq = K.topk_prune(chunk, *sel)
        if n_eq is None:
            return chunk.masked_fill_(self.mask(chunk, p).logical_not_(), 0)
        self.advance(p, n_eq)
        return chunk

    def mask(self, chunk, p: int = 0):
        """The kept elements of the next chunk (bool), for pass p."""
        import torch

        if self.k <= 0:
            return torch.zeros(chunk.shape, dtype=torch.bool, device=chunk.device)
        if self.thr is None:
            return torch.ones(chunk.shape, dtype=torch.bool, device=chunk.device)
        a = chunk.abs()
        if self.all_ties:
            return a >= self.thr
        eq = a == self.thr
        n_eq = int(torch.count_nonzero(eq))
        left = self.ties_kept - self.seen.get(p, 0)
        self.seen[p] = self.seen.get(p, 0) + n_eq
        if left <= 0 or n_eq == 0:
            return a > self.thr
        if n_eq <= left:
            return eq.logical_or_(a > self.thr)
        cut = int(torch.nonzero(eq)[left - 1, 0]) + 1  # the chunk where the ties' quota runs out: after its
        eq[cut:] = False                                 # left-th tie, none is kept
        return eq.logical_or_(a > self.thr)


def kth_largest(a, k: int) -> float:
    """The k-th largest value of the flat, non-negative, finite tensor `a` (1 <= k <= numel), exactly.

    float32: a radix select on the bit patterns (:func:`kernels.select_from_histograms` on torch's histograms of
    the high 16 bits, then of the low 16 bits inside the bucket holding the k-th largest); 1.5-1.8x as fast
    as ``torch.kthvalue`` on one thread (11.5M elements: 0.07-0.09 s vs 0.13 s). Other dtypes: ``torch.kthvalue``."""
    import torch

    if a.dtype != torch.float32:
        return float(torch.kthvalue(a, a.numel() - k + 1).values)
    bits = a.reshape(-1).view(torch.int32)
    hi = bits >> 16

    def fill_lo(bucket, lo):
        lo += torch.bincount(torch.bitwise_and(bits[hi == bucket], 0xFFFF), minlength=1 << 16).numpy()

    return K.select_from_histograms(torch.bincount(hi, minlength=1 << 15).numpy(), k, fill_lo)[0]


def top_count(density: float, numel: int) -> int:
    """Elements kept at `density`: int(density * numel) (mergekit's count)."""
    return int(density * numel)


# --------------------------------------------------------------------------------------------- per-tensor state


class TensorState:
    """What a method sees of one tensor: name, shape, numel, compute dtype, device, the plan, the current chunk
    [start, stop), per-chunk buffers (``buffers`` attributes and :meth:`buf`), DARE streams, and :meth:`mark`."""

    def __init__(self, plan: Plan, name: str, shape, dtype, pool: BufferPool, tracking: bool):
        self.plan, self.name, self.shape, self.dtype, self.pool = plan, name, tuple(shape), dtype, pool
        self.device = pool.device
        self.numel = 1
        for s in self.shape:
            self.numel *= int(s)
        self.n = plan.n_models
        self.start = self.stop = 0
        self.model_kept = [0] * self.n
        self.overlap = None
        self._bits = None
        self._gens: dict = {}
        self.emit = None  # (output chunk, lambda, sign) for a one-pass loop that writes the output itself
        self.release = None  # (a, b) -> drop the inputs' mapped pages of [a, b) of the chunk (a one-pass loop's)
        self.deferring = False  # merge_raw is called before any scan (MergeMethod.defers)
        self.tracking = tracking and self.n <= 63

    def buf(self, key: str, dtype=None, numel: int | None = None):
        """A pooled flat buffer of the chunk's size (compute dtype unless `dtype`); contents are undefined."""
        return self.pool.get(key, (self.stop - self.start if numel is None else numel,), dtype or self.dtype)

    def dare(self, tau, i: int, p: float, stream=0, rescale: bool = True):
        """DARE on model i's chunk with the stream derive(seed, "dare", name, i), drawn on in chunk order;
        `stream` separates passes that draw the same numbers again."""
        return dare_tensor(tau, p, self._dare_gen(i, stream), lambda k, dt: self.buf(k, dt, tau.numel()), rescale)

    def _dare_gen(self, i: int, stream: int):
        """Model i's DARE stream of pass `stream`, made on first use: torch's CPU generator, run by the compiled
        loops where they run (:class:`kernels.MTStream`, the same numbers), else a torch generator."""
        key = (stream, i)
        g = self._gens.get(key)
        if g is None:
            mt = K.mt_stream(_dare_seed(self.plan.seed, self.name, i)) if self.device == "cpu" else None
            g = self._gens[key] = mt or dare_generator(self.plan.seed, self.name, i, self.device)
        return g

    def dare_stream(self, i: int, stream: int = 0):
        """Model i's DARE stream of pass `stream` as a compiled MT19937 (:class:`kernels.MTStream`), or None
        where its numbers come from a torch generator."""
        g = self._dare_gen(i, stream)
        return g if isinstance(g, K.MTStream) else None

    def mark(self, i: int, pruned) -> None:
        """Count model i's kept slots (the nonzeros of its pruned chunk) for the density and overlap figures."""
        import torch

        nz = pruned != 0
        self.model_kept[i] += int(torch.count_nonzero(nz))
        if self.tracking:
            if self._bits is None:  # bit i = model i kept the slot; the narrowest integer type that holds n bits
                dt = torch.uint8 if self.n <= 8 else torch.int16 if self.n <= 15 else \
                    torch.int32 if self.n <= 31 else torch.int64
                self._bits = torch.zeros(nz.shape, dtype=dt, device=nz.device)
            self._bits.add_(nz.to(self._bits.dtype), alpha=1 << i)  # the bits are disjoint: add == or

    def mark_bits(self, i: int, like):
        """For a compiled loop that counts model i's kept slots itself: (bits buffer, bit) to set where it keeps,
        (None, 0) when the overlap is not tracked; None when the loop cannot (more than 8 models: use
        :meth:`mark`). Add the loop's count with :meth:`marked`."""
        import torch

        if not self.tracking:
            return None, 0
        if self.n > 8:
            return None
        if self._bits is None:
            self._bits = torch.zeros(like.shape, dtype=torch.uint8, device=like.device)
        return self._bits, 1 << i

    def marked(self, i: int, count: int) -> None:
        """Model i kept `count` more slots (counted by a compiled loop)."""
        self.model_kept[i] += count

    def accumulate_counted(self, i: int, x, w: float, first: bool) -> bool:
        """total = w * x (first) or total + w * x, x left weighted, model i's kept slots counted (and its overlap
        bits set), in one compiled loop; False when it cannot run (the caller's torch ops follow)."""
        mb = self.mark_bits(i, x)
        c = None if mb is None else K.accumulate(x, self.total, w, first, *mb)
        if c is None:
            return False
        self.marked(i, c)
        return True

    def count_pairs(self, models: Sequence[int], pairs) -> None:
        """For a compiled loop that counted the chunk's kept pairs itself (pairs[a][b], a <= b: elements that both
        models[a] and models[b] kept; pairs[a][a]: models[a]'s kept): the kept counts and the overlap, as
        :meth:`mark` of each model and :meth:`_chunk_overlap` would add."""
        for a, i in enumerate(models):
            self.model_kept[i] += int(pairs[a][a])
        if self.tracking:
            self._add_overlap(models, pairs)

    def _add_overlap(self, models: Sequence[int], pairs) -> None:
        """overlap[models[a]][models[b]] (and its mirror) += pairs[a][b] for a <= b."""
        if self.overlap is None:
            self.overlap = [[0] * self.n for _ in range(self.n)]
        for a, i in enumerate(models):
            for b in range(a, len(models)):
                j, c = models[b], int(pairs[a][b])
                self.overlap[i][j] += c
                if j != i:
                    self.overlap[j][i] += c

    def _chunk_overlap(self) -> None:
        if self._bits is None:
            return
        import torch

        pairs = K.pair_counts(self._bits, self.n)
        if pairs is None:
            pairs = [[0] * self.n for _ in range(self.n)]
            for i in range(self.n):
                for j in range(i, self.n):
                    m = (1 << i) | (1 << j)
                    pairs[i][j] = int(torch.count_nonzero(torch.bitwise_and(self._bits, m).eq_(m)))
        self._add_overlap(range(self.n), pairs)
        self._bits = None


# --------------------------------------------------------------------------------------------- checks


def check_input(t, reader: CheckpointReader, name: str, allow: bool, stats: "MergeStats | None") -> None:
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


def check_output(t, name: str, lam: float, tainted: bool = False, param: str | None = "lam", sign: int = -1) -> None:
    """A non-finite output tensor is a RuntimeFailure naming it and the likely cause: lambda too large for
    the dtype (finite inputs), or non-finite inputs let in (`tainted`) that reach it."""
    if all_finite(t):
        return
    dt = str(t.dtype).replace("torch.", "")
    if tainted:
        raise RuntimeFailure(f"tensor {name!r} of the output would hold NaN/inf at lambda = {lam:g}: the non-finite "
                             "input values let in reach it; nothing written", param="allow_non_finite")
    formula = "theta_pre - lambda * tau" if sign < 0 else "theta_0 + lambda * tau"
    raise RuntimeFailure(f"tensor {name!r}: {formula} is not finite in {dt} at lambda = {lam:g} "
                         "(lambda too large for the dtype?); nothing written", param=param)


def open_and_check(base: CheckpointReader, models: Sequence[CheckpointReader], plan: Plan) -> list[str]:
    """Keys, shapes and dtypes of every model against the base, before any arithmetic; the plan's name filters
    against the base's tensors: filters that leave no floating-point tensor to merge are refused (the output
    would be the base), and each glob that matches no tensor name is returned as a warning (a typo in a filter
    otherwise merges, or keeps, what the user meant to leave out)."""
    if len(models) != plan.n_models:
        raise BadInputError(f"the plan is for {plan.n_models} models, got {len(models)}", param="models")
    for c in models:
        check_compatible(base, c)
    floats = [n for n, s in base.specs.items() if is_float_dtype(s.dtype)]
    if not floats:
        raise BadInputError(f"{base.path}: no floating-point tensor to merge")
    if not any(plan.selected(n) for n in floats):
        raise BadInputError(f"the filters leave none of the {len(floats)} floating-point tensors of {base.path} to "
                            f"merge (include {list(plan.include)}, exclude {list(plan.exclude)})",
                            param="include" if plan.include else "exclude")
    if plan.tensor_params is not None:  # every tensor's own weights / densities, checked before anything is read
        for n in filter(plan.selected, floats):
            plan.for_tensor(n)
    return [f"{kind} glob {g!r} matches no tensor name of {base.path}"
            for kind, globs in (("include", plan.include), ("exclude", plan.exclude)) for g in globs
            if not any(fnmatch.fnmatchcase(n, g) for n in base.specs)]


# --------------------------------------------------------------------------------------------- statistics


@dataclass
class MergeStats:
    """Sparsity and throughput of one merge: kept fraction overall and per tensor; with a tracking method, each
    model's kept count per tensor and the pairwise overlap of the pruned task vectors."""

    method: str
    n_candidates: int
    numel: int = 0
    kept: int = 0
    n_tensors: int = 0
    skipped_non_float: list = field(default_factory=list)
    excluded: list = field(default_factory=list)
    per_tensor: dict = field(default_factory=dict)
    model_kept: dict = field(default_factory=dict)  # tensor -> [kept per model] (tracking methods)
    overlap: list | None = None                     # K x K slots nonzero in both pruned vectors
    bytes_read: int = 0
    seconds: float = 0.0
    non_finite_inputs: list = field(default_factory=list)  # (file, tensor, count): only with allow_non_finite
    compiled_loops: int = 0  # chunks' work done by the numba loops (0: the torch path only)

    @property
    def non_finite_tensors(self) -> set:
        """Names of the tensors whose inputs held NaN/inf (allowed in)."""
        return {r["tensor"] for r in self.non_finite_inputs}

    def add(self, spec, kept: int, n_read: int, st: TensorState | None = None) -> None:
        """Count one merged tensor: its elements, those kept, and the bytes of the n_read tensors read."""
        self.bytes_read += n_read * spec.nbytes
        self.numel += spec.numel
        self.kept += kept
        self.n_tensors += 1
        self.per_tensor[spec.name] = (spec.numel, kept)
        if st is not None and st.plan.method.tracks:
            self.model_kept[spec.name] = list(st.model_kept)
            if st.overlap is not None:
                if self.overlap is None:
                    self.overlap = [[0] * st.n for _ in range(st.n)]
                for i in range(st.n):
                    for j in range(st.n):
                        self.overlap[i][j] += st.overlap[i][j]

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.numel if self.numel else float("nan")

    def summary(self, per_tensor: bool = False, extended: bool = False) -> dict:
        """The result's stats; `extended` adds the engine's per-model figures (densities, overlap, filters)."""
        d = {"method": self.method, "n_candidates": self.n_candidates, "n_tensors": self.n_tensors,
             "numel": self.numel, "kept": self.kept, "kept_fraction": self.kept_fraction,
             "skipped_non_float": self.skipped_non_float, "bytes_read": self.bytes_read,
             "seconds": round(self.seconds, 4), "non_finite_inputs": self.non_finite_inputs,
             "kernels": "numba" if self.compiled_loops else "torch",
             "read_gb_per_s": (self.bytes_read / 1e9 / self.seconds) if self.seconds > 0 else None}
        if per_tensor:
            d["per_tensor"] = {k: {"numel": n, "kept_fraction": (c / n if n else None)}
                               for k, (n, c) in self.per_tensor.items()}
        if extended:
            d.update(self._extended(per_tensor))
        return d

    def _extended(self, per_tensor: bool) -> dict:
        d: dict = {"excluded": self.excluded}
        if not self.model_kept:
            return d
        numels = {k: n for k, (n, _) in self.per_tensor.items()}
        models = []
        for i in range(self.n_candidates):
            kept = sum(v[i] for v in self.model_kept.values())
            dens = [v[i] / numels[k] for k, v in self.model_kept.items() if numels[k]]
            mean = sum(dens) / len(dens) if dens else float("nan")
            std = math.sqrt(sum((x - mean) ** 2 for x in dens) / len(dens)) if dens else float("nan")
            numel = sum(numels[k] for k in self.model_kept)
            models.append({"kept": kept, "numel": numel, "kept_fraction": kept / numel if numel else None,
                           "tensor_density": {"min": min(dens, default=None), "max": max(dens, default=None),
                                              "std": std}})
        d["models"] = models
        if per_tensor:
            d["tensor_density"] = {k: [c / numels[k] if numels[k] else None for c in v]
                                   for k, v in self.model_kept.items()}
        if self.overlap is not None:
            d["overlap"] = overlap_summary(self.overlap)
        return d


def overlap_summary(counts: list) -> dict:
    """counts[i][j] = slots nonzero in both pruned vectors i and j (diagonal: each one's nonzeros); iou =
    counts[i][j] / (counts[i][i] + counts[j][j] - counts[i][j]); max_pairwise over i != j."""
    n = len(counts)
    iou = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            union = counts[i][i] + counts[j][j] - counts[i][j]
            iou[i][j] = counts[i][j] / union if union else 0.0
    pairs = [counts[i][j] for i in range(n) for j in range(n) if i != j]
    return {"counts": counts, "iou": iou, "max_pairwise": max(pairs, default=0)}


# --------------------------------------------------------------------------------------------- the stream


@dataclass
class _Run:
    """One streamed merge: inputs, plan, device, pools, stats and the non-finite policy."""

    base: CheckpointReader
    models: Sequence[CheckpointReader]
    plan: Plan
    device: str
    stats: MergeStats
    allow: bool = False
    cpu_pool: BufferPool = field(default_factory=BufferPool)
    dev_pool: BufferPool | None = None
    views: dict = field(default_factory=dict)  # (buffer key, reader) -> (reader, name, a, b) not yet released
    out: "_Direct | None" = None  # the writer's output slots, for one-pass loops that write the output chunk

    def __post_init__(self):
        if self.dev_pool is None:
            self.dev_pool = self.cpu_pool if self.device == "cpu" else BufferPool(self.device)


def _chunks(numel: int, plan: Plan):
    """[start, stop) slices of the flattened tensor: whole for non-local methods, else chunk_elems rounded down
    to a multiple of the method's chunk_multiple (at least one multiple)."""
    m = plan.method
    if not m.local or plan.chunk_elems is None or numel <= plan.chunk_elems:
        yield 0, numel
        return
    mult = max(1, int(m.chunk_multiple_for(plan)))
    size = max(mult, plan.chunk_elems // mult * mult)
    for a in range(0, numel, size):
        yield a, min(numel, a + size)


def _read(run: _Run, reader, name, spec, a: int, b: int, key: str, full: bool, read_only: bool = False):
    """Elements [a, b) of tensor `name` of `reader`, flattened, in the tensor's dtype: a view of the mapped file
    where the reader offers one and the bytes are only read (`read_only`, or a dtype other than the compute
    dtype: the task vector goes to another buffer), else read into a pooled CPU buffer. A view's pages leave
    the process's resident memory when the next read of the same `key` comes."""
    if run.device == "cpu" and (read_only or spec.dtype != compute_dtype(spec.dtype)):
        v = reader.view_range(name, a, b)
        if v is not None:
            _viewed(run, key, reader, name, a, b, spec.dtype.itemsize)
            return v
    out = run.cpu_pool.get(key, (b - a,), spec.dtype)
    if full:
        return reader.get_into(name, out.view(tuple(spec.shape))).reshape(-1)
    return reader.get_range_into(name, a, b, out)


_RELEASE_BYTES = 1 << 25  # mapped views are dropped from resident memory 32 MB at a time (one madvise each)


def _viewed(run: _Run, key: str, reader, name: str, a: int, b: int, itemsize: int) -> None:
    """Record a view of [a, b) of `reader` under `key`; the range viewed before it there is released once it
    reaches 32 MB or the tensor changes (a view handed out stays valid: its pages are only unmapped)."""
    slot = (key, id(reader))
    prev = run.views.get(slot)
    if prev is not None and prev[1] == name and prev[3] == a and (b - prev[2]) * itemsize <= _RELEASE_BYTES:
        run.views[slot] = (reader, name, prev[2], b)  # the same tensor read on: one release later
        return
    if prev is not None:
        prev[0].release_range(*prev[1:])
    run.views[slot] = (reader, name, a, b)


def _to_compute(run: _Run, raw, key: str, cd):
    """`raw` in the compute dtype on the device (the same buffer when nothing changes)."""
    if raw.dtype == cd and run.device == "cpu":
        return raw
    out = run.dev_pool.get(key, tuple(raw.shape), cd)
    if run.device == "cpu" and K.to_float32(raw, out):
        return out
    return out.copy_(raw)


def _task_vector(run: _Run, raw, bd, cd, check: bool):
    """(tau = raw in the compute dtype - bd, whether it is finite (None when not `check`)): one compiled loop
    where it can run, else the torch ops (convert, subtract, one-reduction check)."""
    if run.device == "cpu":
        out = raw if raw.dtype == cd else run.dev_pool.get("tau", tuple(raw.shape), cd)
        bad = K.load_tau(raw, bd, out)
        if bad is not None:
            return out, (bad == 0) if check else None
    tau = _to_compute(run, raw, "tau", cd).sub_(bd)
    return tau, (all_finite(tau) if check else None)


class _Diagnosis:
    """Once per tensor, when a finiteness check fails: which input is at fault (named), else an overflow."""

    def __init__(self):
        self.done = False
        self.inputs_bad = False

    def run(self, run: _Run, name: str, wanted: Sequence[int]) -> None:
        if self.done:
            return
        self.done = True
        before = len(run.stats.non_finite_inputs)
        check_input(run.base.get(name), run.base, name, run.allow, run.stats)
        for i in wanted:
            check_input(run.models[i].get(name), run.models[i], name, run.allow, run.stats)
        self.inputs_bad = len(run.stats.non_finite_inputs) > before

    def task_vector(self, run: _Run, name: str, wanted: Sequence[int], i: int, cd) -> None:
        """Model i's task vector is not finite: name the input at fault (recorded, or refused by check_input),
        else raise the overflow error."""
        self.run(run, name, wanted)
        if not self.inputs_bad:
            raise _overflow(run, name, i, cd)


def _overflow(run: _Run, name: str, i: int, cd) -> RuntimeFailure:
    dt = str(cd).replace("torch.", "")
    return RuntimeFailure(f"{run.models[i].path}: tensor {name!r}: the task vector (model - base) is not finite in "
                          f"{dt} (the difference overflows); nothing written", param="models")


def _scan(run: _Run, st: TensorState, spec, wanted, diag: _Diagnosis) -> None:
    """Feed each wanted model's whole task vector (after DARE) to the method's scan, one model at a time."""
    cd = st.dtype
    raw_b, b = _read(run, run.base, spec.name, spec, 0, spec.numel, "raw_base", True), None
    if run.plan.dare_p == 0 and run.device == "cpu" and _scan_together(run, st, spec, raw_b, wanted):
        return
    for i in wanted:
        raw = _read(run, run.models[i], spec.name, spec, 0, spec.numel, "raw_cand", True)
        if run.plan.dare_p == 0 and run.device == "cpu" and run.plan.method.scan_raw(st, raw, raw_b, i) == 0:
            continue  # scanned by a compiled loop (a non-finite tau goes the torch way: checked, named)
        b = _to_compute(run, raw_b, "base_c", cd) if b is None else b
        tau, finite = _task_vector(run, raw, b, cd, True)
        if not finite:
            diag.task_vector(run, spec.name, wanted, i, cd)
        if run.plan.dare_p > 0:
            tau = dare_tensor(tau, run.plan.dare_p, dare_generator(run.plan.seed, spec.name, i, run.device))
        run.plan.method.scan(st, tau, i)


def _scan_together(run: _Run, st: TensorState, spec, raw_b, wanted) -> bool:
    """The method's scan of every wanted model in one call (:meth:`MergeMethod.scan_models_raw`), where each
    model's reader offers a view of the whole tensor (no buffer per model: memory independent of the model
    count); whether it was done."""
    m = run.plan.method
    if not (m.scans_together and wanted):
        return False
    raws = [run.models[i].view_range(spec.name, 0, spec.numel) for i in wanted]
    if any(r is None for r in raws):
        return False
    st.release = _releaser(run, spec.name, wanted, 0)
    try:
        return m.scan_models_raw(st, raws, raw_b, wanted) == 0
    finally:
        st.release = None


def _releaser(run: _Run, name: str, wanted, at: int):
    """st.release for a loop over [at, ...) of tensor `name`: (a, b) -> the base's and every wanted model's mapped
    pages of [at + a, at + b) dropped from resident memory."""
    readers = [run.base] + [run.models[i] for i in wanted]
    return lambda a, b: [r.release_range(name, at + a, at + b) for r in readers]


def _feed_chunk(run: _Run, st: TensorState, spec, a: int, b: int, bd, wanted, whole: bool,
                diag: _Diagnosis, each: bool, fused: bool) -> None:
    """Every pass of every wanted model over chunk [a, b). `fused`: the tensor is one chunk, so the method's
    scan of each model runs here, on the same task vector, just before its pass-0 add (one read saved)."""
    m, plan, cd = run.plan.method, run.plan, st.dtype
    for p in range(m.passes):
        for k, i in enumerate(wanted):
            raw = _read(run, run.models[i], spec.name, spec, a, b, "raw_cand", whole)
            check = each and p == 0 and (fused or not m.scans)
            if plan.dare_p == 0 and not fused and run.device == "cpu":
                bad = m.add_raw(st, raw, bd, i, k, p)
                if bad is not None:
                    if check and bad:
                        diag.task_vector(run, spec.name, wanted, i, cd)
                    continue
            tau, finite = _task_vector(run, raw, bd, cd, check)
            if check and not finite:  # before DARE (drops hide NaN)
                diag.task_vector(run, spec.name, wanted, i, cd)
            if plan.dare_p > 0:
                tau = st.dare(tau, i, plan.dare_p, stream=p)
            if fused and p == 0:
                m.scan(st, tau, i)
            m.add(st, tau, i, k, p)


def _one_pass(run: _Run, st: TensorState, spec, a: int, b: int, raw_b, wanted, whole: bool):
    """(merged chunk, kept count, whether the output chunk is written) of the method's one-pass loop over every
    wanted model's chunk [a, b), or None: not run, or a non-finite task vector or sum (then the model-by-model
    path computes the chunk again and names the input at fault or records it, as it always does). With the
    writer's slots (`run.out`) the loop writes the output chunk into the next one as it goes (no float32 chunk
    stored and read again by a pass of its own)."""
    raws = [_read(run, run.models[i], spec.name, spec, a, b, f"raw_cand{k}", whole, read_only=True)
            for k, i in enumerate(wanted)]  # views: no buffer per model (a reader without views: one chunk each)
    st.emit = run.out.target(a, b) if run.out is not None else None
    st.release = _releaser(run, spec.name, wanted, a)  # pages of views
    got = run.plan.method.merge_raw(st, raws, raw_b, wanted)
    st.emit = st.release = None
    if got is None or got[0]:
        return None
    if got[3] is not None:
        run.out.written(got[3])
    return got[1], got[2], got[3] is not None


def _finite(t) -> bool:
    bad = K.count_non_finite(t)
    return all_finite(t) if bad is None else bad == 0


def _tensor_chunks(run: _Run, spec):
    """Merge one float tensor chunk by chunk: yields (start, stop, raw base chunk, base chunk in the compute
    dtype, merged chunk or None); returns nothing. Updates the stats when the tensor is done."""
    import torch

    plan, m = run.plan, run.plan.method
    name, cd = spec.name, compute_dtype(spec.dtype)
    st = TensorState(plan, name, spec.shape, cd, run.dev_pool, m.tracks)
    wanted = [i for i in range(plan.n_models) if m.wants(plan, i)]
    witness = m.witness if (m.witness and plan.dare_p == 0 and not m.scans) else None
    diag, kept = _Diagnosis(), 0
    one_pass = m.one_pass and wanted and len(wanted) <= K.MAX_ONE_PASS and plan.dare_p == 0 and run.device == "cpu"
    # the scan's result found in the pass (one chunk), where the one-pass loops take these dtypes
    deferred = bool(one_pass and m.scans and spec.dtype in (torch.bfloat16, torch.float32) and m.defers(st)
                    and all(run.models[i].specs[name].dtype == spec.dtype for i in wanted))
    spans = [(0, spec.numel)] if deferred else list(_chunks(spec.numel, plan))
    whole = len(spans) == 1
    fused = m.scans and whole and not one_pass  # a one-pass method scans first, then reads each chunk once
    with torch.no_grad():  # never across a yield: grad mode is thread state the caller would inherit
        m.begin(st)
        if m.scans and not fused and not deferred:
            _scan(run, st, spec, wanted, diag)
    for a, b in spans:
        with torch.no_grad():
            st.start, st.stop = a, b
            for key, dt in m.buffers:
                setattr(st, key, st.buf(key, None if dt is None else getattr(torch, dt)))
            raw_b = _read(run, run.base, name, spec, a, b, "raw_base", whole)
            st.deferring = deferred
            got = _one_pass(run, st, spec, a, b, raw_b, wanted, whole) if one_pass else None
            st.deferring = False
            if got is None and deferred:  # the scan's result was not found in the pass: scan, then pass again
                _scan(run, st, spec, wanted, diag)
                got = _one_pass(run, st, spec, a, b, raw_b, wanted, whole)
            if got is not None:
                merged, c, done = got
                bd = WRITTEN if done else None  # else the output is computed from raw_b (_write_tensor)
            elif not wanted:  # no model read (every weight or density 0 here): tau = 0, as mergekit's sum of none
                bd = _to_compute(run, raw_b, "base_c", cd)
                merged, c = st.buf("zeros").zero_(), 0
            else:
                bd = _to_compute(run, raw_b, "base_c", cd)
                _feed_chunk(run, st, spec, a, b, bd, wanted, whole, diag, witness is None, fused)
                if witness is not None and wanted and not _finite(getattr(st, witness)):
                    diag.run(run, name, wanted)  # inputs finite: a task vector overflowed; the output check decides
                merged, c = m.finish(st)
            kept += c
            st._chunk_overlap()
        yield a, b, raw_b, bd, merged
    run.stats.add(spec, kept, 1 + len(wanted), st)


def iter_merged(base: CheckpointReader, models: Sequence[CheckpointReader], plan: Plan, names: Sequence[str],
                device: str = "cpu", stats: MergeStats | None = None, progress: Callable | None = None,
                allow_non_finite: bool = False, direct: "_Direct | None" = None):
    """Yield (name, spec, chunks) tensor by tensor; `chunks` is None for tensors copied from the base (integer,
    bool, or filtered out), else an iterator of (start, stop, raw base chunk, base chunk in the compute dtype or
    None (a chunk merged in one pass: convert the raw one where needed) or WRITTEN (`direct`: the output chunk
    is in the writer's slot, :meth:`_Direct.take`), merged task-vector chunk or None): consume it before the
    next tensor (the buffers are reused)."""
    stats = stats if stats is not None else MergeStats(plan.method.name, len(models))
    if device == "cpu":
        settle_malloc()  # the loops' transient arrays from the heap from the first tensor on
    run = _Run(base, models, plan, device, stats, allow_non_finite, out=direct)
    t0, k0 = time.perf_counter(), K.runs()
    for j, name in enumerate(names):
        spec = base.specs[name]
        if not is_float_dtype(spec.dtype):
            stats.bytes_read += spec.nbytes
            stats.skipped_non_float.append(name)
            yield name, spec, None
        elif not plan.selected(name):
            stats.bytes_read += spec.nbytes
            stats.excluded.append(name)
            yield name, spec, None
        else:
            run.plan = plan.for_tensor(name)  # consumed before the next tensor (see above)
            yield name, spec, _tensor_chunks(run, spec)
        stats.seconds = time.perf_counter() - t0
        stats.compiled_loops += K.runs() - k0
        k0 = K.runs()
        if progress is not None:
            progress("merging tensors", j + 1, len(names))


def _apply_chunk(bd, merged, lam: float, sign: int, pool: BufferPool):
    """theta_0 + sign * lam * tau in the compute dtype (task negation: sign -1, NegMerge Sec. 3)."""
    import torch

    if sign > 0 and lam == 1.0:
        return torch.add(bd, merged, out=pool.get("res", bd.shape, bd.dtype))
    scaled = torch.mul(merged, lam, out=pool.get("scaled", bd.shape, bd.dtype))
    op = torch.sub if sign < 0 else torch.add
    return op(bd, scaled, out=pool.get("res", bd.shape, bd.dtype))


WRITTEN = "written"  # a chunk whose output a one-pass loop wrote into the writer's slot (iter_merged's `direct`)


class _Direct:
    """The writer's output slots lent to the one-pass loops of merge_to_checkpoint: the loop writes theta_0 +
    sign * lambda * merged into the slot as it goes, instead of a float32 chunk that an output pass of its own
    reads again (one thread, 4 bf16 models of 2^21 elements: task arithmetic's merge and output 2.73-2.79 ->
    2.48-2.49 ms, DARE's 4.89 -> 4.72). `target` takes the next slot for a chunk, `written` records the loop's
    non-finite output flag, `take` hands the slot to _write_tensor (which uses it whether or not the loop
    wrote it)."""

    def __init__(self, w, pool: BufferPool, lam: float, sign: int, skip_zero: bool):
        self.w, self.pool, self.lam, self.sign, self.skip_zero = w, pool, lam, sign, skip_zero
        self.dtype = None  # the output dtype of the tensor being written; None: none lent
        self.name = None  # that tensor's name
        self.pending = None  # [slot, output chunk, the loop's non-finite output flag or None]

    def target(self, a: int, b: int):
        """(output chunk, lambda, sign) of the next slot for chunk [a, b), or None (lambda 0 writes the base)."""
        if self.dtype is None or (self.skip_zero and self.lam == 0):
            return None
        slot = self.w.slot(_fits(self.pool, a, b, self.dtype))
        o = _slot_chunk(self.pool, self.w, slot, self.name, a, b, self.dtype)
        self.pending = [slot, o, None]
        return o, self.lam, self.sign

    def written(self, bad: int) -> None:
        self.pending[2] = bad

    def take(self):
        got, self.pending = self.pending, None
        return got


def _slot_numel(a: int, b: int, dtype) -> int:
    """Elements of the slot buffer that holds the output chunk [a, b) (a disk block to spare: _slot_chunk)."""
    return b - a + DIRECT_BLOCK // dtype.itemsize


def _fits(pool: BufferPool, a: int, b: int, dtype):
    """WriteBehind.slot's `fits` for the chunk [a, b): the size of each slot's buffer where it already holds the
    chunk, else 0. The smallest free one that fits is taken before the next in turn: the merge benchmark's HF
    folders (the embedding in the first shard, the head first in the last) grew a third 131 MB buffer for the
    head where the embedding's was free, and (first fit) the top-k methods a second one in some runs, where the
    write of a small chunk put in the embedding's buffer was still running."""
    numel = _slot_numel(a, b, dtype)
    return lambda slot: pool.holds(f"out{slot}", numel, dtype)


def _slot_chunk(pool: BufferPool, w, slot: int, name: str, a: int, b: int, dtype):
    """The output chunk [a, b) of tensor `name` in the writer's slot `slot`: a view of the slot's buffer whose
    address is congruent, modulo a disk block, to the chunk's offset in its output file (the writer's
    `byte_offset`), so that a file written with O_DIRECT takes the chunk's whole blocks straight from it instead of
    copying them through its staging buffer (taskvec.writers._DirectFile). The buffer has a block to spare; where
    no such view exists (torch files, an offset that is not a multiple of the dtype's size), its start."""
    size = dtype.itemsize
    buf = pool.flat(f"out{slot}", _slot_numel(a, b, dtype), dtype, to_disk=True)
    where = w.byte_offset(name, a)
    shift = 0
    if where is not None:
        gap = (where - buf.data_ptr()) % DIRECT_BLOCK
        shift = gap // size if gap % size == 0 else 0
    return buf[shift:shift + b - a]


def _write_tensor(w, name, spec, chunks, lam: float, sign: int, skip_zero: bool, pool: BufferPool,
                  tainted: Callable[[], bool], base: CheckpointReader, direct: _Direct | None = None) -> None:
    """Compute the output (base dtype, CPU) chunk by chunk, each chunk into a free output slot of the writer (a
    :class:`WriteBehind`, whose thread writes it while the next chunk is merged); a one-pass chunk's output is
    written by its loop into the slot `direct` lent it."""
    if chunks is None:
        w.write(name, base.get(name))
        return
    dtype = base.specs[name].dtype  # the output's dtype (`base` may be retyped)
    if direct is not None:
        direct.dtype, direct.name = dtype, name
    for a, b, raw_b, bd, merged in chunks:
        lent = direct.take() if direct is not None else None
        slot = lent[0] if lent is not None else w.slot(_fits(pool, a, b, dtype))
        o = _slot_chunk(pool, w, slot, name, a, b, dtype)
        if bd is WRITTEN:
            if lent[2]:
                check_output(o, name, lam, tainted(), "lam", sign)
        elif merged is None or (skip_zero and lam == 0):
            o.copy_(raw_b)
        else:
            if bd is None:  # a one-pass chunk: the base as read
                bad = K.apply_raw(raw_b, merged, lam, sign, o)
                bd = raw_b.to(merged.dtype) if bad is None else bd
            else:
                bad = K.apply(bd, merged, lam, sign, o) if bd.device.type == "cpu" else None
            if bad is None:
                o.copy_(_apply_chunk(bd, merged, lam, sign, pool))
            if bad != 0:
                check_output(o, name, lam, tainted(), "lam", sign)
        w.write_range(name, a, b, o, slot)


class RetypedReader(CheckpointReader):
    """`inner` with its floating-point tensors seen in `dtype` (an output dtype other than the base's)."""

    def __init__(self, inner: CheckpointReader, dtype):
        super().__init__(inner.path)
        self.format, self.shards, self.file_metadata = inner.format, inner.shards, inner.file_metadata
        self.index_metadata = getattr(inner, "index_metadata", {})
        self.inner = inner
        self.float_dtype = dtype  # the writer names it in a Hugging Face folder's config.json
        self.specs = {k: TensorSpec(k, dtype if is_float_dtype(s.dtype) else s.dtype, s.shape)
                      for k, s in inner.specs.items()}

    def get(self, name):
        return self.inner.get(name).to(self.specs[name].dtype)


def output_dtype(name: str | None):
    """The torch dtype of an output dtype name; None for "same"/None (each tensor keeps its own)."""
    import torch

    if name in (None, "same"):
        return None
    if name not in OUT_DTYPES:
        raise BadInputError(f"unknown output dtype {name!r}; use same, {', '.join(OUT_DTYPES)}", param="out_dtype")
    return getattr(torch, name)


def output_reader(base: CheckpointReader, out_dtype: str | None) -> CheckpointReader:
    """`base` as the writer sees the output: unchanged for "same"/None, else its floating tensors in `out_dtype`."""
    dt = output_dtype(out_dtype)
    return base if dt is None else RetypedReader(base, dt)


OUT_SLOT_BYTES = 64 << 20  # the writer's output buffers of chunked merges, in all (float32 chunks)


def _slots(plan: Plan) -> int:
    """Output buffers handed to the writer thread: 3 for whole tensors, up to 8 chunks in OUT_SLOT_BYTES (the
    writer's disk writes come in bursts of 16 MB, during which the merge fills the next buffers: with 3 slots of
    1M elements it waited 0.18-0.34 s of a 2 s task-arithmetic merge, with 8 0.02-0.1 s). 64 MB held eight slots
    of the 2^21-element chunk, the default until session 41 (with 32 MB, four: task arithmetic waited 0.25 s of
    1.23 s; through benchmarks/merge_engine.py, two alternations, 2026-12-03: task arithmetic 1.14-1.38 -> 0.99-1.24
    s, uniform 1.21-1.42 -> 1.02-1.33, DARE, compute-bound, the same, 1.71-1.86 against 1.72-1.9). It holds four of
    today's 2^22-element chunk, measured faster (merge/options.py), with the writer no longer copying the output."""
    if not plan.method.local or plan.chunk_elems is None:
        return 3
    return max(3, min(8, OUT_SLOT_BYTES // (4 * plan.chunk_elems)))


def merge_to_checkpoint(base: CheckpointReader, models: Sequence[CheckpointReader], plan: Plan, lam: float, out_path,
                        *, fmt: str = "same", device: str = "cpu", record: dict | None = None, sign: int = 1,
                        skip_zero: bool = True, progress: Callable | None = None, allow_non_finite: bool = False,
                        stats: MergeStats | None = None, out_dtype: str | None = None) -> MergeStats:
    """Stream theta = theta_0 + sign * lam * merge(tau_1..tau_N) into `out_path` (atomic; the base's format
    unless `fmt`; each tensor keeps its dtype unless `out_dtype` names one for the floating tensors). With
    `skip_zero` a lambda of 0 (or a method leaving a chunk unchanged) writes the base's values (so -0.0
    survives). A failure leaves nothing at `out_path`."""
    open_and_check(base, models, plan)
    stats = stats if stats is not None else MergeStats(plan.method.name, len(models))
    pool = BufferPool("cpu")
    target = output_reader(base, out_dtype)
    with CheckpointWriter(target, out_path, fmt=fmt, record=record) as cw, WriteBehind(cw, slots=_slots(plan)) as w:
        direct = _Direct(w, pool, lam, sign, skip_zero) if device == "cpu" else None
        for name, spec, chunks in iter_merged(base, models, plan, w.order, device, stats, progress, allow_non_finite,
                                              direct):
            _write_tensor(w, name, spec, chunks, lam, sign, skip_zero, pool,
                          lambda n=name: n in stats.non_finite_tensors, target, direct)
    return stats


def merged_task_vector(base: CheckpointReader, models: Sequence[CheckpointReader], plan: Plan, device: str = "cpu",
                       progress: Callable | None = None, allow_non_finite: bool = False, names=None):
    """The merged task vector as a dict {name: tensor} (compute dtype, CPU; float tensors that are merged), with
    its stats: one model in memory, for a lambda search."""
    import torch

    open_and_check(base, models, plan)
    stats = MergeStats(plan.method.name, len(models))
    tau = {}
    for name, spec, chunks in iter_merged(base, models, plan, base.keys() if names is None else names, device, stats,
                                          progress, allow_non_finite):
        if chunks is None:
            continue
        t = torch.zeros(spec.numel, dtype=compute_dtype(spec.dtype))
        for a, b, _raw, _bd, merged in chunks:
            if merged is not None:
                t[a:b].copy_(merged)
        tau[name] = t.view(tuple(spec.shape))
    return tau, stats


def merge_tensor(taus: Sequence, plan: Plan, name: str = "t"):
    """Merge the task vectors of one tensor (a list form of the streamed merge, over a zero base: x - 0 == x);
    returns (merged tau in the compute dtype, kept element count)."""
    import torch

    t0 = taus[0]
    base = MemoryReader({name: torch.zeros_like(t0)})
    tau, stats = merged_task_vector(base, [MemoryReader({name: t}) for t in taus], plan, device=str(t0.device.type))
    return tau[name].to(t0.device), stats.per_tensor[name][1]


def negate_into(b, tau, lam: float, name: str = "", tainted: bool = False, param: str | None = "lam", sign: int = -1,
                dtype=None):
    """theta = theta_0 + sign * lambda * tau (sign -1: task negation, NegMerge Sec. 3; Ilharco et al. 2023) in
    the compute dtype, cast once to `dtype` (default: the base's) on the CPU; a non-finite result raises."""
    dtype = b.dtype if dtype is None else dtype
    if tau is None:
        return b.to(dtype)
    bd = b.to(device=tau.device, dtype=tau.dtype)
    out = ((bd - lam * tau) if sign < 0 else (bd + lam * tau)).to(device="cpu", dtype=dtype)
    check_output(out, name, lam, tainted, param, sign)
    return out


def apply_task_vector(base: CheckpointReader, tau: dict, lam: float, out_path, fmt: str = "same",
                      record: dict | None = None, tainted: Sequence[str] = (), param: str | None = "lam",
                      sign: int = -1, skip_zero: bool = False, out_dtype: str | None = None) -> None:
    """Write theta_0 + sign * lam * tau tensor by tensor, atomically (tensors without a tau are the base's; the
    floating tensors in `out_dtype` when it names one, as merge_to_checkpoint)."""
    target = output_reader(base, out_dtype)
    with CheckpointWriter(target, out_path, fmt=fmt, record=record) as w:
        for name in w.order:
            b = base.get(name)
            t = None if (skip_zero and lam == 0) else tau.get(name)
            w.write(name, negate_into(b, t, lam, name, name in tainted, param, sign, target.specs[name].dtype))


def apply_to_state_dict(base_sd: dict, tau: dict, lam: float, param: str | None = None, sign: int = -1) -> dict:
    """In memory: {name: theta_0 + sign * lam * tau} (tensors without a tau copied); a non-finite tensor raises."""
    return {k: negate_into(v, tau.get(k), lam, k, param=param, sign=sign) for k, v in base_sd.items()}


def merge_state_dicts(base_sd: dict, models: Sequence[dict], plan: Plan, lam: float = 1.0, sign: int = 1,
                      device: str = "cpu") -> tuple[dict, MergeStats]:
    """In memory: the merged state dict theta_0 + sign * lam * merge(...) (the same engine over MemoryReaders),
    and the stats. Tensors the plan does not merge are the base's own objects."""
    base = MemoryReader(base_sd)
    tau, stats = merged_task_vector(base, [MemoryReader(m) for m in models], plan, device=device)
    out = {}
    for k, v in base_sd.items():
        out[k] = v if (k not in tau or lam == 0) else negate_into(v, tau[k].to(device), lam, k, param="lam", sign=sign)
    return out, stats
