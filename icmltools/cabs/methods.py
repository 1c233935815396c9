"""CABS, BS and CA-magnitude as method classes of the shared merge engine (:mod:`icmltools.merge.engine`).

The engine feeds each tensor's task vectors one model at a time, in the given order (the pruning order),
flattened, in m-aligned chunks for the n:m methods (block boundaries never move, so chunked = unchunked); the
per-model lambda is the plan's per-model weight, and the engine writes theta_0 + lam * merged with lam = 1.
Each method keeps per chunk a running sum ``total`` of weight_k * pruned_k and, for the conflict-aware ones, a
``taken`` mask; weights of 0 still take their slots in the order (as the official loops) but add nothing.
Per-model n:m is the model option pair ``n``/``m``; ``tail`` is the global option (:mod:`icmltools.cabs.prune`).
"""
from __future__ import annotations

import math

from icmltools.core.errors import BadInputError
from icmltools.merge import engine as E
from icmltools.merge import kernels as K
from icmltools.merge.options import DENSITY

from . import prune as P
from .options import DEFAULT_TAIL, OWN_METHODS

REFERENCE = "Yang et al., CABS, ICML 2025 (arXiv 2503.01874)"


def _lcm(values) -> int:
    out = 1
    for v in values:
        out = out * int(v) // math.gcd(out, int(v))
    return out


class _Pruned(E.MergeMethod):
    """Shared machinery: sum weight_k * (tau_k * mask_k) into ``total``, count kept slots, mark overlap."""

    buffers = (("total", None),)
    tracks = True

    def wants(self, plan, i):
        return True  # a zero-weight model still takes its slots in the order (CA), it just adds nothing

    def _accumulate(self, st, tau, mask, i: int, k: int) -> None:
        """total += w_i * (tau * mask); tau (the engine's chunk buffer, ours to modify) is pruned in place."""
        self._accumulate_pruned(st, tau.masked_fill_(mask.logical_not(), 0), i, k)

    def _accumulate_pruned(self, st, x, i: int, k: int) -> None:
        """total += w_i * x for a chunk already pruned in place (zeros where dropped), counting model i's kept
        slots: one compiled loop where it can run, else the torch ops; a zero-weight model is only counted."""
        w = st.plan.weights[i]
        if k == 0:
            st.added = False
        if w != 0 and st.accumulate_counted(i, x, w, not st.added):
            st.added = True
            return
        st.mark(i, x)
        if w != 0:
            self._add(st, x, w)

    @staticmethod
    def _add(st, pruned, w: float) -> None:
        if w != 1.0:
            pruned.mul_(w)
        if st.added:
            st.total.add_(pruned)
        else:
            st.total.copy_(pruned)
        st.added = True

    def finish(self, st):
        import torch

        if not getattr(st, "added", False):
            return None, 0  # every weight 0: the base, bitwise
        c = K.count_nonzero(st.total)
        return st.total, int(torch.count_nonzero(st.total)) if c is None else c


def _nm_of(plan, i: int) -> tuple[int, int]:
    """Model i's (n, m): its model options, or the default pattern for K models when unset (both None)."""
    mo = plan.models[i]
    if mo.get("n") is None and mo.get("m") is None:
        return P.auto_nm(plan.n_models)
    return mo.get("n"), mo.get("m")


class _NM(_Pruned):
    """n:m methods: per-model (n, m) from the model options (unset: m 32, n = max(1, 16 // K)), chunks aligned
    to every m."""

    options = {"tail": DEFAULT_TAIL}
    model_options = {"n": None, "m": None}

    def __init__(self, name=None, nms=None, **options):
        super().__init__(name, **options)
        self.short = None
        if nms is not None:
            self.short = [0] * len(nms)   # per model: blocks keeping fewer than n slots (CA left fewer free)

    def _prune_fast(self, st, tau, i: int, taken) -> bool:
        """Model i's n:m pruning of the chunk in place (and taken |= its mask) in one compiled loop; False when
        it cannot run."""
        n, m = _nm_of(st.plan, i)
        short = K.nm_prune(tau, n, m, taken, st.plan.options["tail"] == "pad")
        if short is None:
            return False
        if self.short is not None and i < len(self.short):
            self.short[i] += short
        return True

    def _mask(self, st, tau, i: int, taken):
        """Model i's n:m mask of the chunk (only the last chunk has a tail), counting its short blocks."""
        n, m = _nm_of(st.plan, i)
        box = [0]
        mask = P.nm_mask(tau, n, m, taken, st.plan.options["tail"], box)
        if self.short is not None and i < len(self.short):
            self.short[i] += box[0]
        return mask

    one_pass = True
    conflict_aware = False

    def merge_raw(self, st, raws, base, wanted):
        """Every model's chunk pruned (in the models' order) and summed in one compiled loop, span by span while
        in cache (each input read once, no task vector or mask stored): the blocks are local, so this is the
        model-by-model loops' result, bitwise. None (fed model by model) when every weight is 0."""
        nms = [_nm_of(st.plan, i) for i in wanted]
        got = K.nm_merge_raw(base, raws, nms, [st.plan.weights[i] for i in wanted], self.conflict_aware,
                             st.plan.options["tail"] == "pad", st.total, emit=st.emit)
        if got is None or got[0]:
            return None if got is None else (got[0], st.total, 0, None)
        if self.short is not None:
            for i, c in zip(wanted, got[2]):
                if i < len(self.short):
                    self.short[i] += c
        st.count_pairs(wanted, got[3])
        return 0, st.total, got[1], got[4]

    def chunk_multiple_for(self, plan):
        """Chunks align to every model's m (the lcm), so no block straddles two chunks."""
        return _lcm(_nm_of(plan, i)[1] for i in range(plan.n_models))

    def validate(self, plan):
        P.check_tail(plan.options["tail"])
        for i in range(plan.n_models):
            n, m = _nm_of(plan, i)
            if not (isinstance(n, int) and isinstance(m, int) and 1 <= n <= m):
                raise BadInputError(f"model {i}: n:m needs integers 1 <= n <= m, got {n}:{m}", param="nm")


class Cabs(_NM):
    """CABS (paper, method section; mergekit's CABSTask loop): model k keeps the n_k largest |tau_k| of every
    block of m_k among the slots no earlier model kept; taken |= mask_k; total += lambda_k * tau_k * mask_k."""

    name = "cabs"
    reference = REFERENCE
    buffers = (("total", None), ("taken", "bool"))
    conflict_aware = True

    def add(self, st, tau, i, k, p):
        if k == 0:
            st.taken.zero_()
        if self._prune_fast(st, tau, i, st.taken):
            self._accumulate_pruned(st, tau, i, k)
            return
        mask = self._mask(st, tau, i, st.taken)
        st.taken |= mask
        self._accumulate(st, tau, mask, i, k)


class BalancedOnly(_NM):
    """BS alone (the paper's ablation): each model's own n:m mask, no conflict-awareness."""

    name = "bs"
    reference = REFERENCE + ", BS ablation"

    def add(self, st, tau, i, k, p):
        if self._prune_fast(st, tau, i, None):
            self._accumulate_pruned(st, tau, i, k)
            return
        self._accumulate(st, tau, self._mask(st, tau, i, None), i, k)


class CAMagnitude(_Pruned):
    """CA-magnitude (the official RoBERTa ``magnitude`` branch, K models in order): model k keeps |x| > its
    threshold, x = tau_k zeroed where earlier models kept, threshold = sorted |x|[int((1 - d_k) * numel)].

    The thresholds need whole tensors: :meth:`scan` sees each model's task vector in order and keeps a
    whole-tensor ``taken`` while finding them; the chunks then rebuild each mask from its threshold (for a
    tensor of one chunk the engine interleaves scan(i) and add(i): the same masks). On a large tensor the
    thresholds are found in the merge's own pass (:meth:`merge_raw` before any scan, :meth:`defers`); where that
    declines (or a weight is 0), :meth:`scan_models_raw` finds every threshold in one pass over all the models."""

    name = "ca_magnitude"
    reference = REFERENCE + ", CA ablation with magnitude pruning (RoBERTa code)"
    buffers = (("total", None), ("taken", "bool"))
    scans = True
    uses_density = True
    default_density = DENSITY   # the engine's default where none is given (the command always gives n/m)

    def begin(self, st):
        import torch

        st.thr = [None] * st.n
        if str(st.device) == "cpu":  # zero pages from the OS (calloc), not torch's parallel fill, whose OpenMP
            import numpy as np  # threads then spin on the cores the engine's pieces need: CA-magnitude's merge

            st.scan_taken = torch.from_numpy(np.zeros(st.numel, np.bool_))  # 4.27-4.71 -> 3.59-4.05 s, 2 threads
        else:
            st.scan_taken = torch.zeros(st.numel, dtype=torch.bool, device=st.device)

    def scan(self, st, tau, i):
        thr = P.magnitude_threshold(tau, st.plan.densities[i], st.scan_taken)
        st.thr[i] = thr
        if thr is not None and not K.mark_above(tau, float(thr), st.scan_taken):
            st.scan_taken |= (tau.abs() > thr).logical_and_(st.scan_taken.logical_not())

    @staticmethod
    def _idx(st, i) -> int:
        """Model i's threshold's place in its sorted |x| (the RoBERTa code's int((1 - d) * numel))."""
        return int((1 - st.plan.densities[i]) * st.numel)

    def scan_raw(self, st, raw, base, i):
        """:meth:`scan` by compiled loops on the tensors as read: the histograms of |tau| (0 where taken) give the
        threshold of :func:`prune.magnitude_threshold`, then taken |= |tau| > it; no whole-tensor tau or |x|."""
        import torch

        idx = self._idx(st, i)
        if idx <= 0:  # the smallest |x| (or nothing to keep): the torch path's select
            return None
        got = K.radix_select_tau(raw, base, [st.numel - idx] if idx < st.numel else [], st.scan_taken)
        if got is None or got[1]:
            return None if got is None else got[1]
        st.thr[i] = torch.tensor(got[0][0][0], dtype=torch.float32) if idx < st.numel else None
        if st.thr[i] is not None and not K.mark_above_tau(raw, base, float(st.thr[i]), st.scan_taken):
            return None  # cannot happen after radix_select_tau ran (same checks); the torch path would redo it
        return 0

    scans_together = True

    def scan_models_raw(self, st, raws, base, wanted):
        """:meth:`scan_raw` of every model in one pass (kernels.ca_thresholds: no histogram pass per model, no
        taken row marked); None where it does not run or a threshold lies outside its sampled window."""
        import torch

        idxs = [self._idx(st, i) for i in wanted]
        if not all(0 < idx < st.numel for idx in idxs):  # the smallest |x|, or nothing to keep: model by model
            return None
        thr = K.ca_thresholds(base, raws, [st.numel - idx for idx in idxs],
                              buf=st.pool.flat, release=st.release)
        if thr is None:
            return None
        for i, t in zip(wanted, thr):
            st.thr[i] = torch.tensor(t, dtype=torch.float32)
        return 0

    one_pass = True

    def defers(self, st):
        """A large tensor on the CPU whose weights are all nonzero (a zero weight leaves the merge to the
        model-by-model path, which then goes chunk by chunk)."""
        return st.numel >= K.DEFER_MIN and st.device == "cpu" and all(st.plan.weights)

    def _merge_deferred(self, st, raws, base, wanted):
        """merge_raw before any scan: the thresholds found and the tensor merged in one pass over the inputs
        (kernels.ca_merge_deferred), or None."""
        import torch

        idxs = [self._idx(st, i) for i in wanted]
        if not all(0 < idx < st.numel for idx in idxs):
            return None
        got = K.ca_merge_deferred(base, raws, [st.numel - idx for idx in idxs], [st.plan.weights[i] for i in wanted],
                                  st.total, emit=st.emit, buf=st.pool.flat,
                                  release=st.release)
        if got is None:
            return None
        for i, t in zip(wanted, got[4]):
            st.thr[i] = torch.tensor(t, dtype=torch.float32)
        st.count_pairs(wanted, got[2])
        return 0, st.total, got[1], got[3]

    def merge_raw(self, st, raws, base, wanted):
        """Every model's chunk pruned by its threshold on the slots still free (in the models' order) and summed
        in one compiled loop, element by element (each input read once, no task vector or taken row stored);
        None (fed model by model) where a weight is 0 or a threshold is not float32. Before any scan
        (:meth:`defers`): the thresholds found in the same pass."""
        import torch

        if st.deferring:
            return self._merge_deferred(st, raws, base, wanted)
        thrs = [st.thr[i] for i in wanted]
        if any(t is not None and t.dtype != torch.float32 for t in thrs):
            return None
        got = K.ca_merge_raw(base, raws, [None if t is None else float(t) for t in thrs],
                             [st.plan.weights[i] for i in wanted], st.total, emit=st.emit)
        if got is None or got[0]:
            return None if got is None else (got[0], st.total, 0, None)
        st.count_pairs(wanted, got[2])
        return 0, st.total, got[1], got[3]

    def add(self, st, tau, i, k, p):
        import torch

        if k == 0:
            st.taken.zero_()
        thr = st.thr[i]
        if thr is not None and thr.dtype == torch.float32 and K.threshold_prune(tau, float(thr), st.taken):
            self._accumulate_pruned(st, tau, i, k)
            return
        if thr is None:
            mask = torch.zeros(tau.shape, dtype=torch.bool, device=tau.device)
        else:
            mask = (tau.abs() > thr).logical_and_(st.taken.logical_not())
        st.taken |= mask
        self._accumulate(st, tau, mask, i, k)


def for_plan(name: str, nms=None) -> E.MergeMethod:
    """A fresh instance of our method `name` (it counts the short blocks of this one merge for `nms`)."""
    cls = CLASSES[name]
    return cls(nms=nms) if issubclass(cls, _NM) else cls()


CLASSES = {c.name: c for c in (Cabs, BalancedOnly, CAMagnitude)}
assert set(CLASSES) == set(OWN_METHODS)
for _c in CLASSES.values():
    if _c.name not in E.REGISTRY:
        E.register(_c)
