"""The merge methods of the engine, one small class each (registered at import).

General methods (mergekit's names and parameters: per-model ``weight`` and ``density``, global ``lam``):

* ``task_arithmetic`` (Ilharco et al. 2023, Eq. 1): tau = sum_i w_i tau_i.
* ``magnitude``: each tau_i keeps its int(d_i * numel) largest magnitudes per tensor, then the weighted sum.
* ``dare`` (Yu et al. 2024, Eq. 1-2; mergekit ``dare_linear``): each element of tau_i dropped with probability
  p_i = 1 - d_i, the kept ones rescaled by 1/(1 - p_i), then the weighted sum.
* ``ties`` (Yadav et al. 2023, Algorithm 1): trim each tau_i to its top d_i by magnitude, elect the sign of the
  (weighted) sum of the trimmed vectors ("mass"), disjoint mean: sum_i w_i tau'_i [agree] / sum_i w_i [agree].
* ``dare_ties``: DARE's random drop instead of the trim, then TIES' election and disjoint mean.
* ``breadcrumbs`` (Davari & Belilovsky 2024; mergekit ``magnitude_outliers``): drop the top gamma fraction
  and the smallest magnitudes, keeping int(d_i * numel) per tensor, then the weighted sum.
* ``breadcrumbs_ties`` (mergekit's name): Breadcrumbs' band, then TIES' election and disjoint merge.

NegMerge's methods (Kim et al. 2025 and its baselines; :mod:`icmltools.negmerge` gives them its own names):
``negmerge`` (sign-consensual mean), ``uniform`` (mean), ``magmax`` (largest magnitude per element),
``task_vector`` (one model's task vector: negmerge's single-candidate ``task_arithmetic``).

Top-k per tensor is exact with bounded memory (:class:`~icmltools.merge.engine.TopK`: the threshold from one
model's |tau| at a time, then chunked masks; ties at the threshold broken by lower flattened index). An
exact zero elected sign (the trimmed values cancel) keeps nothing, as the paper's sgn(0) = 0; the option
``elect_zero`` "plus" of the sign-electing methods elects + there instead (mergekit's ``sign_weight >= 0``: the
positive values are kept), as a mergekit config does.
"""
from __future__ import annotations

import math

from . import kernels as K
from .engine import MergeMethod, TensorState, TopK, register, top_count
from .options import BREADCRUMBS_GAMMA, DENSITY

TRIMS = ("exact", "keep_ties")
ELECT_ZERO = ("none", "plus")   # what a sum of 0 elects: no sign (the paper's sgn(0) = 0), or + (mergekit's)


def _sum_into(total, x, k: int) -> None:
    """total = sum of the x received so far (k = 0 first)."""
    if k == 0:
        total.copy_(x)
    else:
        total.add_(x)


def _count(t) -> int:
    import torch

    c = K.count_nonzero(t)
    return int(torch.count_nonzero(t)) if c is None else c


# --------------------------------------------------------------------------------------------- general methods


class Weighted(MergeMethod):
    """sum_i w_i * sparsify_i(tau_i), with TIES' sign election and disjoint (weighted) mean when ``consensus``.

    Subclasses set ``sparsify`` (:meth:`prune` of one model's chunk) and the class flags; ``normalize`` (as
    mergekit's) divides by the sum of the weights that agree with the elected sign at each element (consensus),
    else by the sum of every model's weight (:meth:`divisor`)."""

    reference = "Ilharco et al., Editing Models with Task Arithmetic, ICLR 2023 (arXiv 2212.04089)"
    options = {"normalize": False}
    buffers = (("total", None),)
    consensus = False
    tracks = True

    def validate(self, plan):
        from icmltools.core.errors import BadInputError

        if self.consensus and plan.options.get("trim", "exact") not in TRIMS:
            raise BadInputError(f"trim must be one of {', '.join(TRIMS)}", param="options")
        if self.consensus and plan.options.get("elect_zero", "none") not in ELECT_ZERO:
            raise BadInputError(f"elect_zero must be one of {', '.join(ELECT_ZERO)}", param="options")

    def consensus_code(self, st) -> int:
        """The compiled loops' consensus argument: 0 none; 1 TIES, a sum of 0 electing no sign (Alg. 1's sgn);
        2 TIES with mergekit's election there (sign_weight >= 0: +, so the positive values are kept)."""
        if not self.consensus:
            return 0
        return 2 if st.plan.options.get("elect_zero") == "plus" else 1

    def prune(self, st: TensorState, tau, i: int, p: int):
        """Model i's chunk after sparsification (may reuse `tau`)."""
        return tau

    def add(self, st, tau, i, k, p):
        pruned = self.prune(st, tau, i, p)
        w = st.plan.weights[i]
        if self._fused(st, pruned, i, k, p, w):
            return
        if p == 0 and self.tracks:
            st.mark(i, pruned)
        if w != 1.0:
            pruned = pruned.mul_(w) if pruned is tau else pruned * w
        if p == 0:
            _sum_into(st.total, pruned, k)
        else:
            self._agree(st, pruned, w, k)

    def _fused(self, st, x, i: int, k: int, p: int, w: float) -> bool:
        """The weighting, the kept count and the sum (pass 0) or the disjoint accumulation (pass 1) in one
        compiled loop; False when it cannot run (the torch ops follow)."""
        if p == 0:
            return st.accumulate_counted(i, x, w, k == 0)
        return K.agree(x, st.total, st.acc, st.div, w, k == 0, self.consensus_code(st) == 2)

    def _agree(self, st, wp, w: float, k: int) -> None:
        """Pass 1 of the consensus: accumulate the entries whose sign is the elected sign(sum) (Alg. 1 l. 6-7)."""
        import torch

        if k == 0:
            torch.sign(st.total, out=st.sgn)
            if self.consensus_code(st) == 2:  # mergekit's election: a sum of 0 elects +
                st.sgn.masked_fill_(st.total == 0, 1.0)
            st.acc.zero_()
            st.div.zero_()
        agree = torch.gt(torch.mul(wp, st.sgn), 0)  # same strict sign as the elected one (sgn 0 elects nothing)
        st.acc.add_(wp.masked_fill_(agree.logical_not(), 0) if wp.data_ptr() != st.total.data_ptr() else
                    torch.where(agree, wp, torch.zeros((), dtype=wp.dtype, device=wp.device)))
        if w == 1.0:
            st.div.add_(agree)
        else:
            st.div.add_(agree.to(st.div.dtype) * w)

    def divisor(self, st) -> float | None:
        """mergekit's ``normalize`` without a sign consensus (generalized_task_arithmetic.py): the weighted sum
        divided by the sum of every model's weight, summed in the compute dtype as mergekit sums them (|sum| <
        1e-8: by 1). None: nothing to divide (no normalize, a consensus method, or a sum of 1)."""
        if self.consensus or not st.plan.options.get("normalize"):
            return None
        import torch

        s = float(torch.tensor(st.plan.weights, dtype=st.dtype).view(-1, 1).sum(0))
        return None if abs(s) < 1e-8 or s == 1.0 else s

    def merge_raw(self, st, raws, base, wanted):
        """The subclass's one-pass loop (:meth:`_merge_raw`); with a divisor the loop does not write the output
        itself (st.emit), the sum is divided, and the engine adds it to the base."""
        s = self.divisor(st)
        if s is None:
            return self._merge_raw(st, raws, base, wanted)
        st.emit = None
        got = self._merge_raw(st, raws, base, wanted)
        if got is not None and not got[0]:
            got[1].div_(s)
        return got

    def _merge_raw(self, st, raws, base, wanted):
        return None

    def finish(self, st):
        import torch

        if not self.consensus:
            s = self.divisor(st)
            return (st.total if s is None else st.total.div_(s)), _count(st.total)
        kept = K.ties_finish(st.acc, st.div, st.plan.options["normalize"])
        if kept is not None:
            return st.acc, kept
        kept = _count(st.div)
        if not st.plan.options["normalize"]:
            return st.acc, kept
        div = torch.where(st.div == 0, torch.ones((), dtype=st.div.dtype, device=st.div.device), st.div)
        return st.acc.div_(div), kept


class TaskArithmetic(Weighted):
    """Task arithmetic (Ilharco et al. 2023): tau = sum_i w_i tau_i."""

    name = "task_arithmetic"
    witness = "total"
    tracks = False
    one_pass = True

    def add_raw(self, st, raw, base, i, k, p):
        return K.tau_accumulate(raw, base, st.total, st.plan.weights[i], k == 0)

    def _merge_raw(self, st, raws, base, wanted):
        got = K.sum_raw(base, raws, [st.plan.weights[i] for i in wanted], st.total, emit=st.emit)
        return None if got is None else (got[0], st.total, got[1], got[2])


class _Magnitude(Weighted):
    """Top-d_i magnitudes of each model's tensor (exact count, ties by lower index; ``trim=keep_ties``: NegMerge's
    TIES rule, max(1, ceil(d * numel)) with every tie at the threshold kept)."""

    scans = True
    uses_density = True
    default_density = DENSITY

    def _k(self, st, i):
        d = st.plan.densities[i]
        if st.plan.options.get("trim", "exact") == "keep_ties":
            return max(1, int(math.ceil(d * st.numel)))
        return min(st.numel, max(1, top_count(d, st.numel)))  # mergekit 0.1.5's magnitude: at least one

    def begin(self, st):
        st.topk = {}

    def scan(self, st, tau, i):
        st.topk[i] = TopK(tau, self._k(st, i), keep_ties=st.plan.options.get("trim") == "keep_ties")

    def _ks(self, st, i) -> tuple:
        return (self._k(st, i),)

    def _from_counts(self, st, i, ks, counts) -> None:
        st.topk[i] = TopK(None, ks[0], st.plan.options.get("trim") == "keep_ties", counts[0], st.numel)

    def scan_raw(self, st, raw, base, i):
        if i in st.topk:  # found by the deferred pass, which missed another model's window (_merge_deferred)
            return 0
        ks = self._ks(st, i)
        got = K.radix_select_tau(raw, base, ks)
        if got is None or got[1]:
            return None if got is None else got[1]
        self._from_counts(st, i, ks, got[0])
        return 0

    def prune(self, st, tau, i, p):
        return st.topk[i].prune(tau, p)

    one_pass = True
    defer = True  # the thresholds found in the one pass (kernels.topk_merge_deferred) on a large tensor

    def defers(self, st):
        return self.defer and st.numel >= K.DEFER_MIN and st.device == "cpu"

    def _merge_deferred(self, st, raws, base, wanted, out):
        """merge_raw before any scan: each model's TopK from the thresholds the one pass found, or None."""
        keep = st.plan.options.get("trim") == "keep_ties"
        ks = [self._k(st, i) for i in wanted]
        part: dict = {}
        got = K.topk_merge_deferred(base, raws, ks, keep, [st.plan.weights[i] for i in wanted], self.consensus_code(st),
                                    bool(st.plan.options.get("normalize")), out, emit=st.emit,
                                    buf=st.pool.flat, release=st.release,
                                    found=part)
        if got is None:
            for i, k, sel in zip(wanted, ks, part.get("sels", ())):  # the scan then skips these models
                if sel is not None:
                    st.topk[i] = TopK(None, k, keep, sel, st.numel)
            return None
        for i, k, sel in zip(wanted, ks, got[5]):
            st.topk[i] = TopK(None, k, keep, sel, st.numel)
            for p in range(self.passes):
                st.topk[i].advance(p, sel[2])
        st.count_pairs(wanted, got[3])
        return 0, out, got[1], got[4]

    def _merge_raw(self, st, raws, base, wanted):
        """Every model's chunk pruned by its TopK and combined in one compiled loop (each input read once; TIES'
        two passes in one); the ties each model met advance its TopK in every pass, as feeding it would. Before
        any scan (:meth:`defers`): the thresholds found in the same pass."""
        out = st.acc if self.consensus else st.total
        if st.deferring:
            return self._merge_deferred(st, raws, base, wanted, out)
        got = K.topk_merge_raw(base, raws, [st.topk[i].selection(0) for i in wanted],
                               [st.plan.weights[i] for i in wanted], self.consensus_code(st),
                               bool(st.plan.options.get("normalize")), out, emit=st.emit)
        if got is None or got[0]:
            return None if got is None else (got[0], out, 0, None)
        for i, ties in zip(wanted, got[2]):
            for p in range(self.passes):
                st.topk[i].advance(p, ties)
        st.count_pairs(wanted, got[3])
        return 0, out, got[1], got[4]


class Magnitude(_Magnitude):
    """Magnitude pruning of each task vector (top d_i per tensor), then task arithmetic."""

    name = "magnitude"
    reference = "magnitude-pruned task arithmetic (Yadav et al. 2023, Sec. 3 'trim' alone)"


class Ties(_Magnitude):
    """TIES-merging (Yadav et al., NeurIPS 2023, arXiv 2306.01708, Algorithm 1): trim, elect sign, disjoint merge."""

    name = "ties"
    reference = "Yadav et al., TIES-Merging: Resolving Interference When Merging Models, NeurIPS 2023"
    options = {"normalize": True, "trim": "exact", "elect_zero": "none"}
    buffers = (("total", None), ("sgn", None), ("acc", None), ("div", None))
    consensus = True
    passes = 2


class Dare(Weighted):
    """DARE (Yu et al., ICML 2024, arXiv 2311.03099): drop with p_i = 1 - d_i, rescale by 1/(1 - p_i) (Eq. 2;
    ``rescale`` False: mergekit's option, the drop alone), sum."""

    name = "dare"
    reference = "Yu et al., Language Models are Super Mario (DARE), ICML 2024"
    options = {"normalize": False, "rescale": True}
    draws_dare = True
    uses_density = True
    default_density = DENSITY

    def validate(self, plan):
        from icmltools.core.errors import BadInputError

        super().validate(plan)
        if not isinstance(plan.options["rescale"], bool):
            raise BadInputError(f"rescale must be true or false, got {plan.options['rescale']!r}", param="options")

    def prune(self, st, tau, i, p):
        return st.dare(tau, i, 1.0 - st.plan.densities[i], stream=p, rescale=st.plan.options["rescale"])

    one_pass = True

    def _merge_raw(self, st, raws, base, wanted):
        """Every model's chunk dropped and rescaled by its own stream and combined in one compiled loop (the
        masks drawn for all models in parallel; DARE-TIES' two passes in one: the second pass's streams are set
        to where the first's are, as redrawing the same numbers would leave them)."""
        import torch

        ps = [1.0 - st.plan.densities[i] for i in wanted]
        streams = [st.dare_stream(i, 0) if p > 0 else None for i, p in zip(wanted, ps)]
        if any(s is None for s, p in zip(streams, ps) if p > 0):
            return None
        out = st.acc if self.consensus else st.total
        got = K.dare_merge_raw(base, raws, streams, ps, [st.plan.weights[i] for i in wanted], self.consensus_code(st),
                               bool(st.plan.options.get("normalize")), st.plan.options["rescale"], out,
                               st.buf("dare_masks", torch.uint8, K.MAX_ONE_PASS * (st.stop - st.start)),  # rows
                               emit=st.emit)  # for the most models a pass takes: buffers independent of the count
        if got is None or got[0]:
            return None if got is None else (got[0], out, 0, None)
        for q in range(1, self.passes):
            for i, s in zip(wanted, streams):
                if s is not None:
                    st.dare_stream(i, q).copy_from(s)
        st.count_pairs(wanted, got[2])
        return 0, out, got[1], got[3]


class DareTies(Dare):
    """DARE's drop-and-rescale, then TIES' sign election and disjoint mean (mergekit ``dare_ties``)."""

    name = "dare_ties"
    reference = "Yu et al., ICML 2024 (DARE) with Yadav et al., NeurIPS 2023 (TIES)"
    options = {"normalize": True, "rescale": True, "elect_zero": "none"}
    buffers = Ties.buffers
    consensus = True
    passes = 2


class Breadcrumbs(_Magnitude):
    """Model Breadcrumbs (Davari & Belilovsky, ECCV 2024, arXiv 2312.06795): per tensor, drop the top `gamma`
    fraction of magnitudes and the smallest, keeping int(d_i * numel) (mergekit's count; when d + gamma > 1
    fewer of the top are dropped), then the weighted sum."""

    name = "breadcrumbs"
    reference = "Davari & Belilovsky, Model Breadcrumbs, ECCV 2024"
    options = {"normalize": False, "gamma": BREADCRUMBS_GAMMA}

    def validate(self, plan):
        from icmltools.core.errors import BadInputError

        super().validate(plan)
        if not 0.0 <= float(plan.options["gamma"]) < 1.0:
            raise BadInputError(f"gamma must be in [0, 1), got {plan.options['gamma']}", param="options")

    def _ks(self, st, i) -> tuple:
        """(elements kept before dropping the top, elements of the top dropped)."""
        n = st.numel
        target = top_count(st.plan.densities[i], n)
        n_top = int(float(st.plan.options["gamma"]) * n)
        n_bot = n - target - n_top
        if n_bot < 0:
            n_top, n_bot = n_top + n_bot, 0
        return n - n_bot, n_top

    def scan(self, st, tau, i):
        keep, top = self._ks(st, i)
        st.topk[i] = (TopK(tau, keep), TopK(tau, top))

    def _from_counts(self, st, i, ks, counts) -> None:
        st.topk[i] = tuple(TopK(None, k, False, c, st.numel) for k, c in zip(ks, counts))

    def prune(self, st, tau, i, p):
        keep, top = st.topk[i]
        got = K.band_prune(tau, keep.selection(p), top.selection(p))
        if got is not None:
            keep.advance(p, got[0])
            top.advance(p, got[1])
            return tau
        m = keep.mask(tau, p).logical_and_(top.mask(tau, p).logical_not_())
        return tau.masked_fill_(m.logical_not_(), 0)

    def _merge_deferred(self, st, raws, base, wanted, out):
        """merge_raw before any scan: both TopKs of each model from the thresholds the one pass found, or None."""
        ks = [self._ks(st, i) for i in wanted]
        part: dict = {}
        got = K.topk_merge_deferred(base, raws, [k[0] for k in ks], False, [st.plan.weights[i] for i in wanted],
                                    self.consensus_code(st), bool(st.plan.options.get("normalize")), out, emit=st.emit,
                                    buf=st.pool.flat,
                                    tops=[k[1] for k in ks], release=st.release, found=part)
        J = len(wanted)
        if got is None:
            sels = part.get("sels", [None] * 2 * J)
            for j, (i, k) in enumerate(zip(wanted, ks)):  # a model whose two windows held: the scan skips it
                if sels[j] is not None and sels[J + j] is not None:
                    st.topk[i] = (TopK(None, k[0], False, sels[j], st.numel),
                                  TopK(None, k[1], False, sels[J + j], st.numel))
            return None
        for j, (i, k) in enumerate(zip(wanted, ks)):
            st.topk[i] = (TopK(None, k[0], False, got[5][j], st.numel), TopK(None, k[1], False, got[5][J + j], st.numel))
            for p in range(self.passes):
                st.topk[i][0].advance(p, got[5][j][2])
                st.topk[i][1].advance(p, got[5][J + j][2])
        st.count_pairs(wanted, got[3])
        return 0, out, got[1], got[4]

    def _merge_raw(self, st, raws, base, wanted):
        """Every model's chunk pruned to its band (kept by the first TopK, not by the top's) and summed (or, with
        the consensus, elected and merged disjointly) in one compiled loop, as :meth:`_Magnitude._merge_raw`; both
        TopKs advance by the ties they met, in every pass. Before any scan (:meth:`defers`): both thresholds found
        in the same pass."""
        out = st.acc if self.consensus else st.total
        if st.deferring:
            return self._merge_deferred(st, raws, base, wanted, out)
        got = K.topk_merge_raw(base, raws, [st.topk[i][0].selection(0) for i in wanted],
                               [st.plan.weights[i] for i in wanted], self.consensus_code(st),
                               bool(st.plan.options.get("normalize")), out, emit=st.emit,
                               tops=[st.topk[i][1].selection(0) for i in wanted])
        if got is None or got[0]:
            return None if got is None else (got[0], out, 0, None)
        for i, ties, ties2 in zip(wanted, got[2], got[5]):
            for p in range(self.passes):
                st.topk[i][0].advance(p, ties)
                st.topk[i][1].advance(p, ties2)
        st.count_pairs(wanted, got[3])
        return 0, out, got[1], got[4]


class BreadcrumbsTies(Breadcrumbs):
    """Breadcrumbs' band (top gamma and the smallest dropped), then TIES' sign election and disjoint merge
    (mergekit ``breadcrumbs_ties``: magnitude_outliers sparsification with the sum consensus; normalize off by
    default, as mergekit 0.1.5)."""

    name = "breadcrumbs_ties"
    reference = "Davari & Belilovsky, ECCV 2024 (Breadcrumbs) with Yadav et al., NeurIPS 2023 (TIES)"
    options = {"normalize": False, "gamma": BREADCRUMBS_GAMMA, "elect_zero": "none"}
    buffers = Ties.buffers
    consensus = True
    passes = 2


# --------------------------------------------------------------------------------------------- NegMerge's methods


class NegMerge(MergeMethod):
    """Sign-consensual merge (NegMerge Sec. 3): tau = where(|sum_i sign(tau_i)| == N, sum_i tau_i / N, 0).

    Streamed as: all N share a strict sign  <=>  min_i tau_i > 0 or max_i tau_i < 0 (NaN never kept)."""

    weighted = False
    name = "negmerge"
    reference = "Kim et al., ICML 2025 (arXiv 2410.05583), Sec. 3"
    buffers = (("total", None), ("mn", None), ("mx", None), ("tb", "bool"))
    witness = "total"
    min_models = 2
    one_pass = True

    def add_raw(self, st, raw, base, i, k, p):
        return K.sign_stats(raw, base, st.total, st.mn, st.mx, k == 0)

    def merge_raw(self, st, raws, base, wanted):
        got = K.consensus_raw(base, raws, st.total, emit=st.emit)
        return None if got is None else (got[0], st.total, got[1], got[2])

    def add(self, st, tau, i, k, p):
        import torch

        _sum_into(st.total, tau, k)
        if k == 0:
            st.mn.copy_(tau)
            st.mx.copy_(tau)
        else:
            torch.minimum(st.mn, tau, out=st.mn)
            torch.maximum(st.mx, tau, out=st.mx)

    def finish(self, st):
        import torch

        kept = K.sign_consensus_finish(st.total, st.mn, st.mx, st.n)
        if kept is not None:
            return st.total, kept
        mask = torch.gt(st.mn, 0, out=st.tb)
        mask.logical_or_(st.mx < 0)
        st.total.div_(st.n)
        st.total.masked_fill_(mask.logical_not_(), 0)  # st.tb now holds the dropped elements
        return st.total, int(st.tb.numel() - torch.count_nonzero(st.tb))


class Uniform(MergeMethod):
    """Mean of the task vectors: tau = sum_i tau_i / N."""

    weighted = False
    name = "uniform"
    reference = "uniform task-vector mean (model soup of task vectors)"
    buffers = (("total", None),)
    witness = "total"
    min_models = 2
    one_pass = True

    def add(self, st, tau, i, k, p):
        _sum_into(st.total, tau, k)

    def add_raw(self, st, raw, base, i, k, p):
        return K.tau_accumulate(raw, base, st.total, 1.0, k == 0)

    def merge_raw(self, st, raws, base, wanted):
        got = K.sum_raw(base, raws, [1.0] * len(raws), st.total, div=st.n, emit=st.emit)
        return None if got is None else (got[0], st.total, got[1], got[2])

    def finish(self, st):
        st.total.div_(st.n)
        return st.total, _count(st.total)


class TaskVector(MergeMethod):
    """One model's task vector, tau = tau_index (task negation with a single candidate)."""

    weighted = False
    name = "task_vector"
    reference = "Ilharco et al., Editing Models with Task Arithmetic, ICLR 2023"
    options = {"index": 0}
    buffers = (("total", None),)
    witness = "total"

    def validate(self, plan):
        from icmltools.core.errors import BadInputError

        if not 0 <= int(plan.options["index"]) < plan.n_models:
            raise BadInputError(f"{plan.options['index']} is out of range for {plan.n_models} model(s)", param="index")

    def wants(self, plan, i):
        return i == plan.options["index"]

    def add(self, st, tau, i, k, p):
        st.total.copy_(tau)

    def finish(self, st):
        return st.total, _count(st.total)


class MagMax(MergeMethod):
    """MagMax (Marczak et al., ECCV 2024): per element, the task-vector entry of largest magnitude (the first
    model wins ties)."""

    weighted = False
    name = "magmax"
    reference = "Marczak et al., MagMax, ECCV 2024"
    buffers = (("best", None),)
    min_models = 2
    one_pass = True

    def merge_raw(self, st, raws, base, wanted):
        got = K.magmax_raw(base, raws, st.best, emit=st.emit)
        return None if got is None else (got[0], st.best, got[1], got[2])

    def add(self, st, tau, i, k, p):
        import torch

        if K.magmax_add(tau, st.best, k == 0):
            return
        if k == 0:
            st.best.copy_(tau)
        else:
            st.best.copy_(torch.where(tau.abs() > st.best.abs(), tau, st.best))

    def finish(self, st):
        return st.best, _count(st.best)


for _cls in (TaskArithmetic, Magnitude, Dare, Ties, DareTies, Breadcrumbs, BreadcrumbsTies, NegMerge, Uniform,
             TaskVector, MagMax):
    register(_cls)
