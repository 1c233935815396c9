"""The shared merge engine (issue 13): every method chunked == unchunked, lambda 0 is the base, the general
methods equal straightforward loops typed from the papers' definitions, non-finite values named, nothing
half-written, buffers independent of the number of models."""
from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.seed import derive
from icmltools.merge import engine as E
from icmltools.merge import methods as MM
from icmltools.merge import options
from icmltools.taskvec import MemoryReader, WriteBehind, open_checkpoint, write_state_dict

ALL = sorted(E.REGISTRY)


def _taus(n=4, shape=(37, 11), seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g) * (1 + i)).to(dtype) for i in range(n)]


def _models(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = {"emb": torch.randn(50, 8, generator=g), "w": torch.randn(33, 17, generator=g).to(torch.bfloat16),
            "b": torch.randn(13, generator=g).to(torch.float16), "steps": torch.tensor(7),
            "d": torch.randn(9, 5, generator=g).double()}
    models = [{k: (v + (0.1 * torch.randn(v.shape, generator=g)).to(v.dtype) if v.is_floating_point() else v + 1)
               for k, v in base.items()} for _ in range(n)]
    return base, models


def _plan(name, n, **kw):
    m = E.get_method(name)
    if m.min_models > n:
        n = m.min_models
    return E.make_plan(name, n, **kw)


# --------------------------------------------------------------------------------------------- registry, imports


def test_registry_lists_every_method_with_a_reference():
    assert set(options.METHODS) <= set(E.REGISTRY)
    assert {"negmerge", "uniform", "magmax", "task_vector"} <= set(E.REGISTRY)
    assert all(m.name == k and m.reference for k, m in E.REGISTRY.items())


def test_options_and_package_import_light():
    code = ("import sys, icmltools.merge, icmltools.merge.options; "
            "print(any(m in sys.modules for m in ('torch', 'numpy', 'safetensors')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_unknown_method_option_and_counts_are_refused():
    with pytest.raises(BadInputError, match="unknown merge method") as ei:
        E.make_plan("nope", 2)
    assert ei.value.param == "method"
    with pytest.raises(BadInputError, match="no option 'gama'"):
        E.make_plan("breadcrumbs", 2, options={"gama": 0.1})
    with pytest.raises(BadInputError, match="3 values for 2 models"):
        E.make_plan("ties", 2, densities=[0.1, 0.2, 0.3])
    with pytest.raises(BadInputError, match=r"densities must be in \[0, 1\]"):
        E.make_plan("dare", 2, densities=[1.5, 0.5])
    with pytest.raises(BadInputError, match="rescale must be true or false, got 'no'"):
        E.make_plan("dare_ties", 2, options={"rescale": "no"})
    with pytest.raises(BadInputError, match="at least 2 models"):
        E.make_plan("negmerge", 1)
    with pytest.raises(BadInputError, match="negmerge takes no per-model weights"):
        E.make_plan("negmerge", 2, weights=[1.0, 0.5])


# --------------------------------------------------------------------------------------------- chunked == unchunked


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dare_p", [0.0, 0.3])
def test_chunked_equals_unchunked_bitwise(name, dare_p):
    base, models = _models(n=3)
    kw = dict(densities=[0.3, 0.5, 0.2], weights=[1.0, 0.5, -0.7], seed=4, dare_p=dare_p)
    if name in ("negmerge", "uniform", "magmax", "task_vector"):
        kw.pop("weights")
    if not E.get_method(name).uses_density:
        kw.pop("densities")
    if E.get_method(name).draws_dare and dare_p:
        with pytest.raises(BadInputError, match="second DARE"):
            E.make_plan(name, 3, **kw)
        return
    ref, s_ref = E.merged_task_vector(MemoryReader(base), [MemoryReader(m) for m in models],
                                      E.make_plan(name, 3, chunk_elems=None, **kw))
    for chunk in (7, 64, 100):
        got, s = E.merged_task_vector(MemoryReader(base), [MemoryReader(m) for m in models],
                                      E.make_plan(name, 3, chunk_elems=chunk, **kw))
        for k in ref:
            assert torch.equal(got[k], ref[k]), (name, chunk, k)
        assert s.per_tensor == s_ref.per_tensor and s.model_kept == s_ref.model_kept and s.overlap == s_ref.overlap


def test_chunked_file_merge_equals_unchunked_bytes(tmp_path):
    base, models = _models(n=3)  # 3 models: each model count compiles every one-pass loop again (~12 s each)
    write_state_dict(base, tmp_path / "base.safetensors")
    for i, m in enumerate(models):
        write_state_dict(m, tmp_path / f"m{i}.safetensors")
    readers = [open_checkpoint(tmp_path / f"m{i}.safetensors") for i in range(3)]
    b = open_checkpoint(tmp_path / "base.safetensors")
    for name in ("ties", "dare_ties", "breadcrumbs", "task_arithmetic"):
        outs = []
        for chunk in (None, 5, 128):
            p = tmp_path / f"{name}_{chunk}.safetensors"
            E.merge_to_checkpoint(b, readers, E.make_plan(name, 3, densities=[0.4], chunk_elems=chunk, seed=2), 0.8, p)
            outs.append({k: v for k, v in _load(p).items()})
        for o in outs[1:]:
            assert o.keys() == outs[0].keys() and all(torch.equal(o[k], outs[0][k]) for k in o), name


def _load(p):
    r = open_checkpoint(p)
    return {k: r.get(k) for k in r.keys()}


# --------------------------------------------------------------------------------------------- lambda 0, task arithmetic


@pytest.mark.parametrize("name", ALL)
def test_lambda_zero_returns_the_base_bitwise(tmp_path, name):
    base, models = _models(n=3)
    base["w"].view(-1)[0] = -0.0
    base["emb"].view(-1)[3] = -0.0
    p = tmp_path / "zero.safetensors"
    E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models], _plan(name, 3), 0.0, p)
    out = _load(p)
    for k, v in base.items():
        assert out[k].dtype == v.dtype
        assert torch.equal(out[k].view(-1).view(torch.uint8) if v.is_floating_point() else out[k],
                           v.reshape(-1).view(torch.uint8) if v.is_floating_point() else v), (name, k)


def test_task_arithmetic_equals_a_straightforward_sum():
    base, models = _models(n=3)
    w = [0.5, -1.25, 2.0]
    out, _ = E.merge_state_dicts(base, models, E.make_plan("task_arithmetic", 3, weights=w), lam=0.7)
    for k, v in base.items():
        if not v.is_floating_point():
            assert torch.equal(out[k], v)
            continue
        cd = torch.float64 if v.dtype == torch.float64 else torch.float32
        acc = None
        for wi, m in zip(w, models):
            t = (m[k].to(cd) - v.to(cd)) * wi
            acc = t if acc is None else acc + t
        assert torch.equal(out[k], (v.to(cd) + 0.7 * acc).to(v.dtype)), k


def test_zero_weight_model_is_not_read():
    base, models = _models(n=2)
    models[1]["emb"] = models[1]["emb"] * float("nan")  # never read: its weight is 0
    out, _ = E.merge_state_dicts(base, models, E.make_plan("task_arithmetic", 2, weights=[1.0, 0.0]))
    ref, _ = E.merge_state_dicts(base, models[:1], E.make_plan("task_arithmetic", 1))
    assert all(torch.equal(out[k], ref[k]) for k in base)


@pytest.mark.parametrize("name", [n for n in ALL if E.get_method(n).weighted])
def test_every_weight_zero_merges_nothing_into_the_base(tmp_path, name):
    """No model read for a tensor: tau = 0 (the pool's buffers, uninitialized, once came out as the merge)."""
    taus = _taus(n=3)   # 3 float32 models: the loops the other tests compile
    E.merge_tensor(taus, _plan(name, 3))  # memory the allocator hands out again holds a merge
    got, kept = E.merge_tensor(taus, _plan(name, 3, weights=[0.0, 0.0, 0.0]))
    assert torch.equal(got, torch.zeros_like(got)) and kept == 0
    base, models = _models(n=2)
    p = tmp_path / "out.safetensors"
    E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models], _plan(name, 2, weights=[0.0, 0.0]),
                          1.0, p)
    assert all(torch.equal(v, base[k]) for k, v in _load(p).items())


# --------------------------------------------------------------------------------------------- papers' definitions


def _topk_ref(t, k):
    """Keep the k largest |x|, ties broken by lower flattened index: a plain sort over (-|x|, index)."""
    flat = t.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda j: (-abs(flat[j]), j))
    keep = torch.zeros(len(flat), dtype=torch.bool)
    keep[order[:k]] = True
    return keep.view(t.shape)


def _ties_ref(taus, dens, w, masks=None):
    """TIES Algorithm 1 (Yadav et al. 2023): trim, elect sgn(sum) by mass, disjoint (weighted) mean."""
    kept = []
    for i, t in enumerate(taus):
        m = masks[i] if masks is not None else _topk_ref(t, max(1, int(dens[i] * t.numel())))
        kept.append(torch.where(m, t, torch.zeros(())) * w[i])
    total = kept[0].clone()
    for t in kept[1:]:
        total = total + t
    sgn = torch.sign(total)
    acc, div = torch.zeros_like(total), torch.zeros_like(total)
    for i, t in enumerate(kept):
        agree = (torch.sign(t) == sgn) & (t != 0)
        acc = acc + torch.where(agree, t, torch.zeros(()))
        div = div + agree.float() * w[i]
    return acc / torch.where(div == 0, torch.ones(()), div)


def test_magnitude_keeps_at_least_one_element_of_a_tiny_tensor():
    """mergekit 0.1.5's magnitude sparsification keeps max(1, int(density * numel)) of a non-empty tensor (TIES,
    magnitude); Breadcrumbs keeps int(density * numel) (its target count has no floor there either)."""
    taus = [torch.tensor([0.5, -2.0, 1.0, 0.25]), torch.tensor([-0.125, 0.75, 3.0, -1.5]),
            torch.tensor([0.0625, 0.375, -0.5, 4.0])]   # 3 models, float32: the loops other tests compile
    for name, want in (("magnitude", [0.0, -2.0, 3.0, 4.0]), ("ties", [0.0, -2.0, 3.0, 4.0])):
        got = E.merge_tensor(taus, E.make_plan(name, 3, densities=[0.2], options={"normalize": False}))[0]
        assert got.tolist() == want, name
    got = E.merge_tensor(taus, E.make_plan("breadcrumbs", 3, densities=[0.2], options={"gamma": 0.0}))[0]
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("chunk", [None, 50])
def test_normalize_without_consensus_divides_by_the_sum_of_the_weights(chunk):
    """mergekit's `normalize` where no sign is elected (generalized_task_arithmetic.py: task_arithmetic,
    dare_linear, breadcrumbs; here magnitude too): the weighted sum divided by the float32 sum of every model's
    weight; weights summing to ~0 (|sum| < 1e-8) divide by 1. (It used to be ignored: the sum came out as is.)"""
    taus = _taus(n=3)

    def run(name, w, normalize):
        plan = E.make_plan(name, 3, densities=[0.3, 0.2, 0.5], weights=w, chunk_elems=chunk, seed=9,
                           options={"normalize": normalize})
        return E.merge_tensor(taus, plan, name="layer")[0]

    for name in ("task_arithmetic", "magnitude", "dare", "breadcrumbs"):
        w = [1.0, 0.5, 0.75]
        plain = run(name, w, False)
        assert torch.equal(run(name, w, True), plain / torch.tensor(w).view(-1, 1).sum(0)), name
        assert torch.equal(run(name, [1.0, -1.0, 0.0], True), run(name, [1.0, -1.0, 0.0], False)), name


@pytest.mark.parametrize("normalize", [False, True])
def test_density_zero_leaves_the_model_out_of_the_tensor(normalize):
    """A density of 0 keeps nothing of the model (mergekit's sparsifiers give zeros): the merge of the others,
    except that without a consensus its weight still counts in normalize's divisor (as in mergekit)."""
    taus, w = _taus(n=4), [1.0, 0.5, 0.75, 1.25]   # the 4th left out: the 3-model loops the tests compile

    def run(name, n, dens, normalize):
        plan = E.make_plan(name, n, densities=dens, weights=w[:n], seed=9, options={"normalize": normalize})
        return E.merge_tensor(taus[:n], plan, name="layer")[0]

    for name in ("magnitude", "ties", "dare", "dare_ties", "breadcrumbs", "breadcrumbs_ties"):
        got = run(name, 4, [0.3, 0.2, 0.5, 0.0], normalize)
        if normalize and not E.get_method(name).consensus:
            want = run(name, 3, [0.3, 0.2, 0.5], False) / torch.tensor(w).view(-1, 1).sum(0)
        else:
            want = run(name, 3, [0.3, 0.2, 0.5], normalize)
        assert torch.equal(got, want), name
    with pytest.raises(BadInputError, match=r"densities must be in \[0, 1\]"):
        E.make_plan("ties", 3, densities=[0.5, -0.1, 0.5])


def _dare_masks(taus, dens, seed, name):
    return [torch.rand(t.shape, generator=derive(seed, "dare", name, i).torch()) >= (1.0 - d)
            for i, (t, d) in enumerate(zip(taus, dens))]


def _dare_ref(taus, dens, seed, name):
    return [torch.where(m, t / (1.0 - (1.0 - d)), torch.zeros(()))
            for t, d, m in zip(taus, dens, _dare_masks(taus, dens, seed, name))]


def _sum_ref(parts, w):
    acc = None
    for p, wi in zip(parts, w):
        t = p * wi
        acc = t if acc is None else acc + t
    return acc


@pytest.mark.parametrize("chunk", [None, 50])
def test_general_methods_equal_the_papers_loops(chunk):
    taus = _taus(n=3)  # 3 models: a count the other tests compile the one-pass loops for
    dens, w = [0.3, 0.2, 0.5], [1.0, 0.5, 1.5]
    n = taus[0].numel()

    def run(name, **kw):
        return E.merge_tensor(taus, E.make_plan(name, 3, densities=dens, weights=w, chunk_elems=chunk, seed=9, **kw),
                              name="layer")[0]

    mag = [torch.where(_topk_ref(t, max(1, int(d * n))), t, torch.zeros(())) for t, d in zip(taus, dens)]
    assert torch.equal(run("magnitude"), _sum_ref(mag, w))
    assert torch.equal(run("ties"), _ties_ref(taus, dens, w))
    assert torch.equal(run("dare"), _sum_ref(_dare_ref(taus, dens, 9, "layer"), w))
    assert torch.equal(run("dare_ties"), _ties_ref(_dare_ref(taus, dens, 9, "layer"), dens, w,
                                                   masks=[torch.ones(t.shape, dtype=torch.bool) for t in taus]))
    crumbs, bands = [], []
    for t, d in zip(taus, dens):  # Breadcrumbs: drop the top gamma and the bottom, keep int(d * n)
        n_top = int(0.05 * n)
        n_bot = n - int(d * n) - n_top
        bands.append(_topk_ref(t, n - n_bot) & ~_topk_ref(t, n_top))
        crumbs.append(torch.where(bands[-1], t, torch.zeros(())))
    assert torch.equal(run("breadcrumbs", options={"gamma": 0.05}), _sum_ref(crumbs, w))
    # mergekit's breadcrumbs_ties: the same bands, then TIES' election and disjoint mean
    assert torch.equal(run("breadcrumbs_ties", options={"gamma": 0.05, "normalize": True}),
                       _ties_ref(taus, dens, w, masks=bands))


@pytest.mark.parametrize("compiled", [True, False])
def test_dare_without_rescale_drops_alone(monkeypatch, compiled):
    """mergekit's `rescale: false`: DARE's mask, the kept values not divided by the density (the compiled loops
    and the torch path, chunked or not)."""
    if not compiled:
        monkeypatch.setitem(K._state, "mod", None)
        monkeypatch.setitem(K._state, "tried", True)
    taus, dens, w = _taus(n=3), [0.3, 0.2, 0.5], [1.0, 0.5, 1.5]
    dropped = [torch.where(m, t, torch.zeros(())) for t, m in zip(taus, _dare_masks(taus, dens, 9, "layer"))]

    def run(name, chunk):
        plan = E.make_plan(name, 3, densities=dens, weights=w, chunk_elems=chunk, seed=9, options={"rescale": False})
        return E.merge_tensor(taus, plan, name="layer")[0]

    for chunk in (None, 50):
        assert torch.equal(run("dare", chunk), _sum_ref(dropped, w))
        assert torch.equal(run("dare_ties", chunk),
                           _ties_ref(dropped, dens, w, masks=[torch.ones(t.shape, dtype=torch.bool) for t in taus]))


def _mergekit_ties_ref(taus, dens, w):
    """mergekit 0.1.5's sum consensus (get_mask): majority sign + where the weighted sum is >= 0, a value kept where
    its sign equals it (a 0 never), the kept summed and divided by the kept weights (0: by 1)."""
    kept = [torch.where(_topk_ref(t, max(1, int(d * t.numel()))), t, torch.zeros(())) * wi
            for t, d, wi in zip(taus, dens, w)]
    total = kept[0].clone()
    for t in kept[1:]:
        total = total + t
    majority = torch.where(total >= 0, torch.ones(()), -torch.ones(()))
    acc, div = torch.zeros_like(total), torch.zeros_like(total)
    for t, wi in zip(kept, w):
        mask = torch.sign(t) == majority
        acc = acc + torch.where(mask, t, torch.zeros(()))
        div = div + mask.float() * wi
    return acc / torch.where(div == 0, torch.ones(()), div)


@pytest.mark.parametrize("path", ["one_pass", "model_by_model", "torch"])
def test_elect_zero_plus_is_mergekits_election(monkeypatch, path):
    """Where the weighted sum of the pruned task vectors is exactly 0 (common on bf16 values) TIES elects no sign
    by default (the paper's sgn(0)); `elect_zero: plus`, set by a mergekit config, elects + and keeps the positive
    values as mergekit does: ties, dare_ties (density 1) and breadcrumbs_ties (gamma 0), in the one-pass loops,
    the compiled model-by-model loops and the torch path, chunked or not."""
    if path == "model_by_model":
        monkeypatch.setattr(K, "MAX_ONE_PASS", 2)
    if path == "torch":
        monkeypatch.setitem(K._state, "mod", None)
        monkeypatch.setitem(K._state, "tried", True)
    g = torch.Generator().manual_seed(3)
    taus = [torch.randint(-3, 4, (37, 11), generator=g).float() * 0.25 for _ in range(3)]   # many sums exactly 0
    w = [1.0, 1.0, 0.5]
    for dens in ([1.0] * 3, [0.5, 0.3, 0.7]):
        want = _mergekit_ties_ref(taus, dens, w)
        assert not torch.equal(want, _ties_ref(taus, dens, w))   # the data has sums of 0 with values kept
        for chunk in (None, 50):
            for name, opts in (("ties", {}), ("breadcrumbs_ties", {"gamma": 0.0}), ("dare_ties", {})):
                if name == "dare_ties" and dens[0] != 1.0:
                    continue
                plan = E.make_plan(name, 3, densities=dens, weights=w, chunk_elems=chunk,
                                   options={"normalize": True, "elect_zero": "plus", **opts})
                assert torch.equal(E.merge_tensor(taus, plan)[0], want), (name, dens, chunk)
    with pytest.raises(BadInputError, match="elect_zero must be one of none, plus"):
        E.make_plan("breadcrumbs_ties", 3, options={"elect_zero": "minus"})

def test_topk_breaks_ties_by_lower_index_in_every_chunking():
    t = torch.tensor([1.0, -3.0, 3.0, 2.0, 3.0, -3.0, 0.5, 3.0])
    tk = E.TopK(t, 3)
    assert tk.mask(t).tolist() == [False, True, True, False, True, False, False, False]
    tk = E.TopK(t, 3)
    parts = [tk.mask(t[a:a + 3]) for a in range(0, 8, 3)]
    assert torch.cat(parts).tolist() == [False, True, True, False, True, False, False, False]
    assert E.TopK(t, 3, keep_ties=True).mask(t).sum() == 5  # NegMerge's rule keeps every tie


def test_kth_largest_equals_kthvalue():
    g = torch.Generator().manual_seed(3)
    for a in (torch.randn(5000, generator=g).abs(), torch.randn(3000, generator=g).to(torch.bfloat16).float().abs(),
              torch.tensor([0.0, 0.0, 1e-40, 3.0, 3.0, 2.0]), torch.randn(700, generator=g).double().abs()):
        n = a.numel()
        for k in (1, 2, n // 3, n // 2, n - 1, n):
            assert E.kth_largest(a, k) == float(torch.kthvalue(a, n - k + 1).values), (k, a.dtype)


def test_ties_kept_count_and_overlap_matrix():
    taus = _taus(n=3, shape=(64,))
    base = MemoryReader({"w": torch.zeros(64)})
    tau, stats = E.merged_task_vector(base, [MemoryReader({"w": t}) for t in taus],
                                      E.make_plan("magnitude", 3, densities=[0.25, 0.5, 0.125]))
    masks = [_topk_ref(t, k) for t, k in zip(taus, (16, 32, 8))]
    assert stats.model_kept["w"] == [16, 32, 8]
    expect = [[int((masks[i] & masks[j]).sum()) for j in range(3)] for i in range(3)]
    assert stats.overlap == expect
    doc = stats.summary(extended=True)
    assert doc["overlap"]["max_pairwise"] == max(expect[i][j] for i in range(3) for j in range(3) if i != j)
    assert [m["kept"] for m in doc["models"]] == [16, 32, 8]


def test_filters_copy_excluded_tensors_from_the_base():
    base, models = _models(n=2)
    plan = E.make_plan("task_arithmetic", 2, exclude=("emb",), include=("*",))
    out, stats = E.merge_state_dicts(base, models, plan)
    assert out["emb"] is base["emb"] and stats.excluded == ["emb"]
    assert not torch.equal(out["w"], base["w"])
    only, stats = E.merge_state_dicts(base, models, E.make_plan("task_arithmetic", 2, include=("w",)))
    assert sorted(stats.excluded) == ["b", "d", "emb"]


def test_filters_checked_against_the_base_names_before_merging():
    """A glob that matches no tensor name is a warning; filters that leave no floating-point tensor are refused
    (an integer tensor matching does not count)."""
    base, models = _models(n=2)
    rb, rms = MemoryReader(base, name="base"), [MemoryReader(m) for m in models]
    plan = E.make_plan("task_arithmetic", 2, include=("w", "x*", "e?b"), exclude=("emb", "emb$", "steps"))
    assert E.open_and_check(rb, rms, plan) == ["include glob 'x*' matches no tensor name of base",
                                                "exclude glob 'emb$' matches no tensor name of base"]
    assert E.open_and_check(rb, rms, E.make_plan("task_arithmetic", 2)) == []
    for kw, param in (({"include": ("zzz*", "steps")}, "include"), ({"exclude": ("*",)}, "exclude"),
                      ({"include": ("w", "emb"), "exclude": ("[we]*",)}, "include")):
        with pytest.raises(BadInputError, match=r"the filters leave none of the 4 floating-point tensors of base") as ei:
            E.open_and_check(rb, rms, E.make_plan("task_arithmetic", 2, **kw))
        assert ei.value.param == param


# --------------------------------------------------------------------------------------------- failures


def test_non_finite_task_vector_names_tensor_and_model(tmp_path):
    base, models = _models(n=3)
    models[1]["w"].view(-1)[5] = float("nan")
    bs, ms = MemoryReader(base, name="base"), [MemoryReader(m, name=f"model{i}") for i, m in enumerate(models)]
    for name in ("task_arithmetic", "ties", "dare", "magmax"):
        with pytest.raises(BadInputError, match="^allow_non_finite: model1: tensor 'w' holds 1 NaN/inf"):
            E.merge_to_checkpoint(bs, ms, E.make_plan(name, 3, chunk_elems=64), 1.0, tmp_path / "o.safetensors")
    assert list(tmp_path.iterdir()) == []
    big = {"w": torch.full((4,), -3e38)}
    with pytest.raises(RuntimeFailure, match="m0: tensor 'w': the task vector .* overflows"):
        E.merged_task_vector(MemoryReader(big), [MemoryReader({"w": torch.full((4,), 3e38)}, name="m0")],
                             E.make_plan("ties", 1))


def test_failure_mid_merge_leaves_nothing(tmp_path):
    class Boom(MM.TaskArithmetic):
        name = "boom"

        def begin(self, st):
            if st.name == "w":
                raise RuntimeError("boom")

    base, models = _models(n=2)
    write_state_dict(base, tmp_path / "hf", fmt="hf_safetensors", shards=[["emb", "b"], ["steps", "w", "d"]])
    out = tmp_path / "out"
    for target, fmt in ((out / "merged.safetensors", "safetensors"), (out / "merged", "hf_safetensors"),
                        (out / "merged.pt", "torch")):
        with pytest.raises(RuntimeError, match="boom"):
            E.merge_to_checkpoint(open_checkpoint(tmp_path / "hf"), [MemoryReader(m) for m in models],
                                  E.make_plan(Boom(), 2), 1.0, target, fmt=fmt)
        assert not out.exists() or list(out.iterdir()) == []



@pytest.mark.parametrize("fmt", ["safetensors", "hf_safetensors"])
def test_interrupt_mid_file_merge_stops_the_writer_and_leaves_nothing(tmp_path, monkeypatch, fmt):
    """Ctrl-C while chunks are in the writer thread (O_DIRECT output, bf16 inputs read through mapped views): the
    KeyboardInterrupt comes out, the thread is gone and no output or temporary file is left."""
    import threading

    from icmltools.taskvec import writers

    monkeypatch.setattr(writers, "DIRECT_MIN_BYTES", 0)
    g = torch.Generator().manual_seed(2)
    base = {f"t{i}": (torch.randn(3000, generator=g) * 0.05).to(torch.bfloat16) for i in range(6)}
    models = [{k: v + 0.01 for k, v in base.items()} for _ in range(2)]
    paths = []
    for tag, sd in [("base", base), ("m1", models[0]), ("m2", models[1])]:
        write_state_dict(sd, tmp_path / "in" / f"{tag}.safetensors")
        paths.append(tmp_path / "in" / f"{tag}.safetensors")
    calls = []

    def progress(what, done, total):
        calls.append(done)
        if done == 3:
            raise KeyboardInterrupt

    out = tmp_path / "out" / ("merged.safetensors" if fmt == "safetensors" else "merged")
    with pytest.raises(KeyboardInterrupt):
        E.merge_to_checkpoint(open_checkpoint(paths[0]), [open_checkpoint(p) for p in paths[1:]],
                              E.make_plan("task_arithmetic", 2, chunk_elems=512), 1.0, out, fmt=fmt,
                              progress=progress)
    assert calls == [1, 2, 3]
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("icml-write")]


@pytest.mark.parametrize("fmt", ["safetensors", "hf_safetensors"])
def test_output_chunks_sit_at_their_file_offset_and_go_to_the_disk_unstaged(tmp_path, monkeypatch, fmt):
    """The engine's output chunks lie at addresses congruent to their offsets in the output file modulo a disk
    block (where the dtype's size allows: a float32 tensor 2 bytes off cannot), so an O_DIRECT output writes them
    from the slots, staging only the bytes around their block boundaries; the files are byte for byte those of the
    page-cache path, chunked (task arithmetic, DARE) and whole (TIES)."""
    from icmltools.taskvec import writers

    g = torch.Generator().manual_seed(4)
    base = {"a": (torch.randn(300001, generator=g) * 0.05).to(torch.bfloat16), "b": torch.randn(999, generator=g),
            "c": (torch.randn(500000, generator=g) * 0.05).to(torch.bfloat16), "d": torch.randn(20000, generator=g)}
    models = [{k: v + (torch.randn(v.shape, generator=g) * 0.01).to(v.dtype) for k, v in base.items()}
              for _ in range(2)]
    paths = []
    for tag, sd in [("base", base), ("m1", models[0]), ("m2", models[1])]:
        write_state_dict(sd, tmp_path / "in" / f"{tag}.safetensors")
        paths.append(tmp_path / "in" / f"{tag}.safetensors")
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this OS")
    monkeypatch.setattr(writers, "_DIRECT_MIN", 4096)
    staged, placed = [], []
    real_stage, real_chunk = writers._DirectFile._stage, E._slot_chunk
    monkeypatch.setattr(writers._DirectFile, "_stage", lambda self, mv: (staged.append(len(mv)), real_stage(self, mv)))

    def chunk(pool, w, slot, name, a, b, dtype):
        o = real_chunk(pool, w, slot, name, a, b, dtype)
        placed.append((o.data_ptr() - w.byte_offset(name, a)) % 4096 == 0 or name in ("b", "d"))
        return o

    monkeypatch.setattr(E, "_slot_chunk", chunk)
    total = sum(t.numel() * t.element_size() for t in base.values())
    for method in ("task_arithmetic", "dare", "ties"):
        got = {}
        for direct in (False, True):
            monkeypatch.setattr(writers, "DIRECT_MIN_BYTES", 0 if direct else 1 << 40)
            staged.clear()
            out = tmp_path / f"{method}_{direct}" / ("m.safetensors" if fmt == "safetensors" else "m")
            E.merge_to_checkpoint(open_checkpoint(paths[0]), [open_checkpoint(p) for p in paths[1:]],
                                  E.make_plan(method, 2, chunk_elems=1 << 17), 1.0, out, fmt=fmt)
            files = sorted(out.glob("*.safetensors")) if out.is_dir() else [out]
            got[direct] = [f.read_bytes() for f in files]
        assert got[True] == got[False], method
        assert 0 < sum(staged) < total // 4, (method, sum(staged), total)  # b and d (float32) may be staged
    assert placed and all(placed)


# --------------------------------------------------------------------------------------------- memory


def test_buffers_do_not_grow_with_the_number_of_models(monkeypatch):
    """The pools' bytes (every buffer the engine keeps) are the same for 3 and 8 models; the largest chunk
    bounds them."""
    made = []
    orig = E.BufferPool.__init__

    def spy(self, device="cpu"):
        orig(self, device)
        made.append(self)

    monkeypatch.setattr(E.BufferPool, "__init__", spy)
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(4000, generator=g), "v": torch.randn(300, generator=g)}
    sizes = {}
    for name in ("ties", "negmerge", "dare_ties", "breadcrumbs"):
        for n in (3, 8):  # 3 and 8: counts the other tests compile too
            made.clear()
            models = [{k: v + torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(n)]
            E.merge_state_dicts(base, models, E.make_plan(name, n, chunk_elems=1000))
            sizes[(name, n)] = sum(p.nbytes for p in made)
        assert sizes[(name, 3)] == sizes[(name, 8)], (name, sizes)
        assert sizes[(name, 3)] <= 12 * 4000 * 4  # a few copies of the largest tensor


def _anon_huge_kb(addr: int) -> int:
    """AnonHugePages (kB) of the mapping of this process that holds `addr` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


def test_pool_buffers_of_4_mb_or_more_ask_for_huge_pages(monkeypatch):
    """The pool's CPU buffers of 4 MB or more lie on private anonymous memory of their own, 2 MB-aligned and
    advised MADV_HUGEPAGE: on a kernel whose THP mode is not "never", their pages are huge once written (a shared
    map, shmem, would get none in the "madvise" mode). Smaller buffers stay torch.empty's, and so does a buffer
    whose map is refused. The memory lives as long as the tensor, whatever else is dropped."""
    import gc
    import mmap

    from icmltools.core.envinfo import thp_mode

    monkeypatch.setattr(E, "_REPORTED", False)  # a host whose free huge blocks stay its own (see the test below)
    assert E.huge_page_empty((2 << 20) // 4 - 1, torch.float32) is None
    if not hasattr(mmap, "MADV_HUGEPAGE"):  # not Linux: torch.empty's buffers
        assert E.huge_page_empty(3 << 20, torch.float32) is None
        pytest.skip("no MADV_HUGEPAGE on this platform")
    pool = E.BufferPool()
    t = pool.get("x", (3, 1 << 20), torch.float32)
    assert t.shape == (3, 1 << 20) and t.dtype == torch.float32 and t.is_contiguous()
    assert pool.get("x", (5,), torch.float32).data_ptr() == t.data_ptr()  # reused as before
    b = E.huge_page_empty(3 << 20, torch.bfloat16)
    assert b.dtype == torch.bfloat16 and b.numel() == 3 << 20 and b.data_ptr() % (1 << 21) == 0
    del t
    gc.collect()
    x = pool.bufs["x"]
    x.fill_(2.5)
    assert float(x.sum()) == 2.5 * (3 << 20)
    with monkeypatch.context() as m:  # a map refused (an address-space limit): torch.empty's buffer instead
        def refuse(*a, **k):
            raise OSError(12, "Cannot allocate memory")

        m.setattr(mmap, "mmap", refuse)
        assert E.huge_page_empty(3 << 20, torch.float32) is None
        assert E.BufferPool().get("y", (3 << 20,), torch.float32).numel() == 3 << 20
    if thp_mode() in (None, "never"):
        pytest.skip("transparent huge pages are off here")
    assert x.data_ptr() % (1 << 21) == 0 and _anon_huge_kb(x.data_ptr()) >= 2048


def test_pool_buffers_take_plain_pages_where_free_huge_blocks_go_to_the_hypervisor(tmp_path, monkeypatch):
    """Where the kernel reports free blocks of order 9 or below to a hypervisor (virtio-balloon's free page
    reporting), huge_page_empty gives None and the pool's buffers are torch.empty's, except the output slots, which
    the writer sends to the disk; reporting from a larger order leaves huge pages alone. The answer is read from
    sysfs once."""
    import mmap

    from icmltools.core import envinfo

    calls = []

    def reporting(order):
        def read():
            calls.append(order)
            return order
        return read

    for order, reported in ((9, True), (7, True), (10, False), (None, False)):
        monkeypatch.setattr(E, "_REPORTED", None)
        monkeypatch.setattr(envinfo, "free_page_reporting", reporting(order))
        assert E._huge_blocks_reported() is reported and E._huge_blocks_reported() is reported
        assert calls.count(order) == 1
        if reported or not hasattr(mmap, "MADV_HUGEPAGE"):
            assert E.huge_page_empty(3 << 20, torch.float32) is None
        else:
            assert E.huge_page_empty(3 << 20, torch.float32).data_ptr() % (1 << 21) == 0
    monkeypatch.setattr(E, "_REPORTED", True)
    pool = E.BufferPool()
    b = pool.get("x", (3 << 20,), torch.float32)
    b.fill_(1.5)
    assert b.numel() == 3 << 20 and float(b.sum()) == 1.5 * (3 << 20)
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform")
    assert E.huge_page_empty(3 << 20, torch.float32, to_disk=True).data_ptr() % (1 << 21) == 0

    class Writer:  # the writer's place for the chunk: none (a torch file)
        def byte_offset(self, name, a):
            return None

    slot = E._slot_chunk(pool, Writer(), 0, "w", 0, 3 << 20, torch.bfloat16)  # an output slot: the disk reads it
    assert slot.data_ptr() % (1 << 21) == 0 and pool.bufs["out0"].data_ptr() == slot.data_ptr()


def test_pool_buffers_made_anew_keep_their_spare_and_slots_reuse_the_largest(tmp_path, monkeypatch):
    """A pool buffer made anew takes `spare` elements more, which a later, larger request uses without a new
    buffer; holds() says whether a request fits. In a merge to an HF folder whose two shards each start with the
    largest tensor, the second one's output goes to the free slot that holds the first's, so one output buffer of
    that size is made (before: the next slot in turn grew to it)."""
    pool = E.BufferPool()
    a = pool.get("x", (1000,), torch.float32, spare=500)
    assert pool.bufs["x"].numel() == 1500 and pool.allocations == 1
    assert pool.holds("x", 1500, torch.float32) and not pool.holds("x", 1501, torch.float32)
    assert not pool.holds("x", 10, torch.int32) and not pool.holds("y", 1, torch.float32)
    assert pool.get("x", (1500,), torch.float32).data_ptr() == a.data_ptr() and pool.allocations == 1
    assert pool.flat("x", 1501, torch.float32).numel() == 1501 and pool.allocations == 2
    _, caps, pos, pat, vals, _ = K._entry_buffers(3 << 20, 0.02, 4, torch.bfloat16, pool.flat, True)
    cap = sum(caps)  # the deferred passes' entries: a pool's buffers made with half as much again
    assert pos.shape == pat.shape == (cap,) and vals.shape == (5, cap)
    room = cap + cap // 2
    assert [pool.bufs[f"defer_{k}"].numel() for k in ("pos", "pat", "vals")] == [room, room, 5 * room]

    g = torch.Generator().manual_seed(3)
    big, small = 300_000, 5_000
    base = {"a": torch.randn(big, generator=g).bfloat16(), "s1": torch.randn(small, generator=g).bfloat16(),
            "z": torch.randn(big, generator=g).bfloat16(), "s2": torch.randn(small, generator=g).bfloat16()}
    models = [{k: (v.float() + 0.01 * torch.randn(v.shape, generator=g)).bfloat16() for k, v in base.items()}
              for _ in range(2)]
    write_state_dict(base, tmp_path / "hf", fmt="hf_safetensors", shards=[["a", "s1"], ["z", "s2"]])
    made, real_get, real_slot = [], E.BufferPool.get, WriteBehind.slot

    def get(self, key, shape, dtype, spare=0, **kw):
        grows = not self.holds(key, int(np.prod(shape)), dtype)
        out = real_get(self, key, shape, dtype, spare, **kw)
        if grows and key.startswith("out"):
            made.append((key, self.bufs[key].numel()))
        return out

    def slot(self, fits=None):  # every earlier write done first: which slots are free does not depend on timing
        if self._last is not None:
            self._last.result()
        return real_slot(self, fits)

    monkeypatch.setattr(E.BufferPool, "get", get)
    monkeypatch.setattr(WriteBehind, "slot", slot)
    E.merge_to_checkpoint(open_checkpoint(tmp_path / "hf"), [MemoryReader(m) for m in models],
                          E.make_plan("task_arithmetic", 2), 1.0, tmp_path / "out")
    assert len([n for _, n in made if n >= big]) == 1, made
    want = {k: (v.float() + sum(m[k].float() - v.float() for m in models)).bfloat16() for k, v in base.items()}
    got = open_checkpoint(tmp_path / "out")
    assert all(torch.equal(got.get(k), want[k]) for k in base)


def test_cpu_merges_settle_malloc_first(monkeypatch):
    """Every streamed merge on the CPU settles glibc malloc's thresholds (core.memory.settle_malloc) before its
    first tensor, so the loops' transient arrays come from the heap from the start."""
    calls = []
    monkeypatch.setattr(E, "settle_malloc", lambda: calls.append(1) or True)
    base, models = _models(3)
    before = []
    real = E._Run.__post_init__

    def seen(self):
        before.append(len(calls))
        real(self)

    monkeypatch.setattr(E._Run, "__post_init__", seen)
    E.merge_state_dicts(base, models, E.make_plan("ties", 3))
    assert calls == [1] and before == [1]


def test_negmerge_registry_is_the_engine_classes():
    from icmltools.negmerge import merge as NM

    assert type(NM.REGISTRY["ties"]) is MM.Ties and NM.REGISTRY["ties"].options["trim"] == "keep_ties"
    assert type(NM.REGISTRY["task_arithmetic"]) is MM.TaskVector
    assert type(NM.REGISTRY["negmerge"]) is MM.NegMerge


# --------------------------------------------------------------------------------------------- output dtype, CLI options


def test_output_dtype_casts_float_tensors_once(tmp_path):
    base, models = _models(n=2)
    p = tmp_path / "o.safetensors"
    E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models], E.make_plan("task_arithmetic", 2),
                          1.0, p, out_dtype="bfloat16")
    same = tmp_path / "s.safetensors"
    E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models], E.make_plan("task_arithmetic", 2),
                          1.0, same)
    got, ref = _load(p), _load(same)
    assert got["steps"].dtype == torch.int64 and torch.equal(got["steps"], base["steps"])
    assert got["emb"].dtype == torch.bfloat16 and torch.equal(got["emb"], ref["emb"].to(torch.bfloat16))
    with pytest.raises(BadInputError, match="unknown output dtype"):
        E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models],
                              E.make_plan("task_arithmetic", 2), 1.0, tmp_path / "x.safetensors", out_dtype="int8")
    # the lambda search's writer (the merged vector applied at a scale) casts the same way: bitwise equal
    tau, _ = E.merged_task_vector(MemoryReader(base), [MemoryReader(m) for m in models], E.make_plan("task_arithmetic", 2))
    q = tmp_path / "a.safetensors"
    E.apply_task_vector(MemoryReader(base), tau, 1.0, q, sign=1, out_dtype="bfloat16")
    applied = _load(q)
    assert {k: v.dtype for k, v in applied.items()} == {k: v.dtype for k, v in got.items()}
    assert all(torch.equal(applied[k], got[k]) for k in got)


def test_shared_file_options_keep_per_model_repeats():
    import click
    from click.testing import CliRunner

    from icmltools.commands import merge_options

    @click.command()
    @merge_options.file_options(weights=True, densities=True, filters=True, out_dtype=True, chunk=True)
    def cmd(**kw):
        click.echo(repr(sorted(kw.items())))

    res = CliRunner().invoke(cmd, ["--base", "b", "-m", "x", "-m", "y", "--weight", "0.5,0.5,1", "--density", "0.2",
                                   "--exclude", "lm_head.*", "--dtype", "bfloat16"])
    assert res.exit_code == 0, res.output
    assert "('weights', (0.5, 0.5, 1.0))" in res.output and "('models', ('x', 'y'))" in res.output
    assert "('exclude', ('lm_head.*',))" in res.output and "('out_dtype', 'bfloat16')" in res.output
    bad = CliRunner().invoke(cmd, ["--density", "0,0.5"])
    assert bad.exit_code == 2 and "not a finite positive number" in bad.output


def test_lambda_search_on_files_with_a_score_rule(tmp_path):
    """The engine's search on checkpoints: one temporary checkpoint per lambda (gone afterwards), the rule
    picks the largest score; lambda 0 evaluates the base itself."""
    from icmltools.merge import search as S

    base, models = _models(n=2)
    bs = MemoryReader(base)
    tau, _ = E.merged_task_vector(bs, [MemoryReader(m) for m in models], E.make_plan("task_arithmetic", 2))
    seen = []

    def evaluate(path, label=None):
        sd = _load(path)
        seen.append(label)
        return {"score": -float((sd["emb"].float() - base["emb"].float() - 0.5 * tau["emb"]).abs().sum())}

    rows, sel = S.search_files(bs, tau, [0.0, 0.25, 0.5, 0.75], evaluate, tmp_path, fmt="safetensors", sign=1,
                               skip_zero=True, rule=lambda r: S.select_max(r, "score"), out_name="m.safetensors")
    assert sel.lam == 0.5 and [r["lam"] for r in rows] == [0.0, 0.25, 0.5, 0.75]
    assert seen[0] == "the checkpoint for lambda = 0" and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------- compiled loops

from icmltools.merge import kernels as K  # noqa: E402

needs_numba = pytest.mark.skipif(not K.available(), reason="numba (the `fast` extra) is not installed")


class _Counting:
    """The numba module, counting which compiled loops ran (so a comparison cannot be torch against torch)."""

    def __init__(self, mod):
        self.mod, self.calls = mod, {}

    def __getattr__(self, name):
        f = getattr(self.mod, name)
        if not callable(f):
            return f

        def wrapped(*a):
            self.calls[name] = self.calls.get(name, 0) + 1
            return f(*a)
        return wrapped


@pytest.fixture
def counted(monkeypatch):
    c = _Counting(K._mod())
    monkeypatch.setitem(K._state, "mod", c)
    return c


def _tied_models(n=3, seed=0):
    """bf16 and float32 tensors of odd shapes; small integer steps so |tau| ties a lot (thresholds, n:m)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"a": (37, 53), "b": (1031,), "c": (7, 3, 5), "d": (64, 33)}
    base = {k: (torch.randn(s, generator=g) * 0.05).to(torch.bfloat16 if k in "ac" else torch.float32)
            for k, s in shapes.items()}
    base["n"] = torch.arange(5)
    models = []
    for _ in range(n):
        sd = {k: v + (torch.randint(-3, 4, v.shape, generator=g) * 2.0 ** -9).to(v.dtype) if v.is_floating_point()
              else v for k, v in base.items()}
        models.append(sd)
    return base, models


def _merge_bytes(tmp_path, tag, base, models, plan, lam, sign=1):
    out = tmp_path / f"{tag}.safetensors"
    st = E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models], plan, lam, out, sign=sign)
    return out.read_bytes(), st.summary(extended=True, per_tensor=True)


def _all_methods():
    import icmltools.cabs.methods  # noqa: F401  (registers cabs, bs, ca_magnitude)

    return sorted(E.REGISTRY)


def _test_plan(name, chunk):
    """A 3-model plan of method `name` with unequal weights and densities where it takes them."""
    m = E.get_method(name)
    kw = {"chunk_elems": chunk, "seed": 5}
    if m.weighted:
        kw["weights"] = [0.7, -1.3, 0.5]
    if m.uses_density:
        kw["densities"] = [0.3, 0.2, 0.45]
    if name == "task_vector":
        kw["options"] = {"index": 2}
    return E.make_plan(name, 3, **kw)


@needs_numba
@pytest.mark.parametrize("name", _all_methods())
@pytest.mark.parametrize("chunk", [None, 96, 1000])
def test_compiled_loops_equal_the_torch_path_bitwise(tmp_path, counted, name, chunk):
    base, models = _tied_models()
    plan = _test_plan(name, chunk)
    for lam, sign in ((1.0, 1), (1.7, 1), (0.6, -1)):
        fast = _merge_bytes(tmp_path, "fast", base, models, plan, lam, sign)
        with K.torch_only():
            slow = _merge_bytes(tmp_path, "slow", base, models, plan, lam, sign)
        assert fast[0] == slow[0], (name, chunk, lam, sign)
        fast[1].pop("seconds"), slow[1].pop("seconds"), fast[1].pop("read_gb_per_s"), slow[1].pop("read_gb_per_s")
        assert (fast[1].pop("kernels"), slow[1].pop("kernels")) == ("numba", "torch")  # the JSON says which ran
        assert fast[1] == slow[1]
    if E.get_method(name).one_pass:  # its loop writes each output chunk itself: no output pass of its own
        assert not any(counted.calls.get(k) for k in ("apply_raw", "apply_bf16", "apply_f32")), counted.calls
        # and no numba parallel loop (prange) runs between its pieces: torch's OpenMP, which those loops use,
        # spins after each on the cores the pieces need (DARE's masks, the deferred select, the taken marks)
        par = [k for k in counted.calls if getattr(getattr(counted.mod, k), "targetoptions", {}).get("parallel")]
        assert not par, (name, par)
    else:
        assert counted.calls.get("apply_bf16") and counted.calls.get("apply_f32"), counted.calls
    loops = {"task_arithmetic": "sum_raw", "ties": "topk_merge_raw", "magnitude": "topk_merge_raw",
             "breadcrumbs": "topk_merge_raw", "cabs": "nm_merge_raw", "bs": "nm_merge_raw", "dare": "dare_merge_raw",
             "ca_magnitude": "ca_merge_raw", "negmerge": "consensus_raw", "magmax": "magmax_raw", "uniform": "sum_raw"}
    if name in loops:
        assert counted.calls.get(loops[name]), counted.calls
    if name in ("magnitude", "ties", "ca_magnitude", "breadcrumbs"):  # scanned without tau (a one-pass method
        # scans first even when the tensor is one chunk)
        assert counted.calls.get("hist_hi_tau") and counted.calls.get("hist_lo_tau"), counted.calls
    if name == "ca_magnitude" and chunk is not None:  # the taken slots marked from the tensors as read
        assert counted.calls.get("mark_above_tau"), counted.calls



@needs_numba
@pytest.mark.parametrize("name", _all_methods())
def test_compiled_loops_cut_in_pieces_equal_the_torch_path(tmp_path, name):
    """Tensors large enough that the compiled loops split their work into pieces over numba's threads (top-k tie
    quotas carried across pieces, n:m blocks, histograms summed): bitwise the torch path, with 1 or 2 threads."""
    import numba

    g = torch.Generator().manual_seed(11)
    base = {"big": torch.randn(2 ** 21 + 37, generator=g) * 0.05,
            "bf": (torch.randn(1 << 20, generator=g) * 0.05).to(torch.bfloat16)}
    models = [{k: v + (torch.randint(-3, 4, v.shape, generator=g) * 2.0 ** -9).to(v.dtype) for k, v in base.items()}
              for _ in range(3)]
    plan = _test_plan(name, 1 << 21)
    with K.torch_only():
        slow = _merge_bytes(tmp_path, "slow", base, models, plan, 1.3)[0]
    old = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            assert _merge_bytes(tmp_path, "fast", base, models, plan, 1.3)[0] == slow, (name, threads)
    finally:
        numba.set_num_threads(old)


@needs_numba
def test_pieces_run_once_each_and_a_ctrl_c_waits_for_the_running_ones():
    """_run_pieces (the one-pass drivers' threads): every piece runs exactly once on up to numba's thread count;
    an error in a piece is raised; a KeyboardInterrupt in one is raised only once no other piece is running, and
    no piece starts after it."""
    import threading
    import time

    import numba

    from icmltools.merge import _kernels_numba as N

    old = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        done, lock, running, started_after = [], threading.Lock(), [0], []

        def piece(p, T, phase, out, stop_at=None):
            with lock:
                running[0] += 1
                if stop_at is not None and started_after:
                    started_after.append(p)
            try:
                time.sleep(0.01)
                out.append((p, T, phase, threading.get_ident()))
                if p == stop_at:
                    started_after.append(None)
                    raise KeyboardInterrupt
                if p == 5 and stop_at == -1:
                    raise ValueError("piece 5")
            finally:
                with lock:
                    running[0] -= 1

        N._run_pieces(piece, 8, 1, (done,))
        assert sorted(d[0] for d in done) == list(range(8)) and {d[1:3] for d in done} == {(8, 1)}
        assert len({d[3] for d in done}) == numba.get_num_threads()  # the calling thread and the pool's
        with pytest.raises(ValueError, match="piece 5"):
            N._run_pieces(piece, 8, 0, ([], -1))
        assert running[0] == 0
        got = []
        with pytest.raises(KeyboardInterrupt):
            try:
                N._run_pieces(piece, 64, 0, (got, 3))
            finally:
                got.append(running[0])
        assert got[-1] == 0 and len(got) - 1 < 64  # nothing running when it is raised; the rest never started
        # at most the other thread's piece taken before the stop was marked (None marks the interrupt)
        assert started_after[0] is None and len(started_after) <= numba.get_num_threads()
    finally:
        numba.set_num_threads(old)


ONE_PASS = ("task_arithmetic", "uniform", "negmerge", "magmax", "magnitude", "ties", "dare", "dare_ties", "cabs", "bs",
            "ca_magnitude", "breadcrumbs")
WEIGHTED_ONE_PASS = ("task_arithmetic", "magnitude", "ties", "dare", "dare_ties", "cabs", "bs", "ca_magnitude",
                     "breadcrumbs")


@needs_numba
@pytest.mark.parametrize("name", ONE_PASS)
@pytest.mark.parametrize("n", [1, 2, 8, 9])
def test_one_pass_loops_equal_feeding_models_one_at_a_time(tmp_path, counted, name, n):
    """The one-pass loops (every model's chunk at once) give the bytes and figures of the model-by-model loops
    (their `merge_raw` switched off) and of the torch path; more than 8 models go model by model."""
    if n < E.get_method(name).min_models:
        pytest.skip("needs 2 models")
    if n == 1 and name in ("magnitude", "ties", "dare", "dare_ties", "ca_magnitude", "breadcrumbs"):
        pytest.skip("one model: the same loop as two (each model count is compiled once, ~20 s)")
    if n in (2, 8) and name == "breadcrumbs":  # its band loop compiles per model count and dtype (~20 s each):
        pytest.skip("3 models in the threaded and torch-path tests, models 4-7's ties in the span loop's test")
    base, models = _tied_models(n, seed=n)
    kw = {"weights": [0.7, -1.3, 1.0, 0.5, 1.0, 2.0, 1.0, -0.25, 3.0][:n]} if name in WEIGHTED_ONE_PASS else {}
    if name in ("magnitude", "ties", "dare", "dare_ties", "breadcrumbs"):
        kw["densities"] = [0.3, 0.5, 1.0, 0.1, 0.7, 0.005, 0.4, 0.25, 0.9][:n]
    for chunk in (None, 96):
        plan = E.make_plan(name, n, chunk_elems=chunk, **kw)
        for lam, sign in ((1.0, 1), (0.6, -1)):
            fast = _merge_bytes(tmp_path, "fast", base, models, plan, lam, sign)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(type(plan.method), "one_pass", False)
                by_model = _merge_bytes(tmp_path, "by_model", base, models, plan, lam, sign)
            with K.torch_only():
                slow = _merge_bytes(tmp_path, "slow", base, models, plan, lam, sign)
            assert fast[0] == by_model[0] == slow[0], (name, n, chunk, lam)
            for d in (fast[1], by_model[1], slow[1]):
                d.pop("seconds"), d.pop("read_gb_per_s"), d.pop("kernels")
            assert fast[1] == by_model[1] == slow[1]
    loop = {"task_arithmetic": "sum_raw", "uniform": "sum_raw", "negmerge": "consensus_raw", "magmax": "magmax_raw",
            "magnitude": "topk_merge_raw", "ties": "topk_merge_raw", "dare": "dare_merge_raw",
            "dare_ties": "dare_merge_raw", "cabs": "nm_merge_raw", "bs": "nm_merge_raw", "ca_magnitude": "ca_merge_raw",
            "breadcrumbs": "topk_merge_raw"}
    assert bool(counted.calls.get(loop[name])) == (n <= K.MAX_ONE_PASS), counted.calls


@needs_numba
@pytest.mark.parametrize("name", ["magnitude", "ties", "dare", "dare_ties", "breadcrumbs"])
def test_one_pass_top_k_over_threaded_pieces_with_ties_and_a_skipped_model(tmp_path, counted, name):
    """Tensors large enough to be cut into pieces (one per thread) with many ties at each threshold, chunked and
    whole, a zero-weight model skipped: the one-pass loop gives the bytes, kept counts and overlap of feeding the
    models one at a time and of the torch path (the ties quota carried across pieces and chunks). Breadcrumbs also
    runs with densities that drop none of the bottom, so only its second quota (the top dropped) splits ties."""
    import numba

    g = torch.Generator().manual_seed(7)
    base = {"big": (torch.randn(1000, 600, generator=g) * 0.05).to(torch.bfloat16),
            "f": torch.randn(2_100_003, generator=g) * 0.05}
    models = [{k: v + (torch.randint(-3, 4, v.shape, generator=g) * 2.0 ** -9).to(v.dtype) for k, v in base.items()}
              for _ in range(3)]
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        cases = [(chunk, [0.3, 0.5, 0.05]) for chunk in (None, 250_000)]
        if name == "breadcrumbs":
            cases += [(chunk, [0.995, 0.999, 1.0]) for chunk in (None, 250_000)]
        for chunk, densities in cases:
            plan = E.make_plan(name, 3, weights=[0.5, 0.0, 2.0], densities=densities, chunk_elems=chunk)
            fast = _merge_bytes(tmp_path, "fast", base, models, plan, 1.0)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(type(plan.method), "one_pass", False)
                by_model = _merge_bytes(tmp_path, "by_model", base, models, plan, 1.0)
            with K.torch_only():
                slow = _merge_bytes(tmp_path, "slow", base, models, plan, 1.0)
            assert fast[0] == by_model[0] == slow[0], (name, chunk, densities)
            for d in (fast[1], by_model[1], slow[1]):
                d.pop("seconds"), d.pop("read_gb_per_s"), d.pop("kernels")
            assert fast[1] == by_model[1] == slow[1]
    finally:
        numba.set_num_threads(old)
    assert counted.calls.get("dare_merge_raw" if name.startswith("dare") else "topk_merge_raw"), counted.calls


@needs_numba
@pytest.mark.parametrize("name", ["dare", "dare_ties"])
def test_one_pass_dare_after_a_chunk_that_falls_back_draws_the_same_numbers(tmp_path, name):
    """A chunk holding a let-in NaN goes model by model (the one-pass loop refuses it before its streams
    advance), and the chunks after it draw DARE's numbers where the torch path does: the same bytes."""
    g = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(5000, generator=g) * 0.05}
    models = [{"w": base["w"] + torch.randn(5000, generator=g) * 0.01} for _ in range(3)]
    plan = E.make_plan(name, 3, densities=[0.3, 0.6, 0.9], chunk_elems=1000, seed=4)

    def merge(tag, torch_only):
        out = tmp_path / f"{tag}.safetensors"
        with K.torch_only(torch_only):
            st = E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models], plan, 1.0, out,
                                       allow_non_finite=True)
        return out.read_bytes(), st.non_finite_inputs

    for j in range(2100, 2200):  # a NaN that DARE drops (a kept one reaches the output: refused either way)
        models[1]["w"][j] = float("nan")
        try:
            slow = merge("slow", True)
        except RuntimeFailure:
            models[1]["w"][j] = base["w"][j]
            continue
        assert merge("fast", False) == slow
        assert slow[1]
        return
    pytest.fail("no dropped position found")


@needs_numba
def test_keep32_keeps_the_set_bits():
    """_keep32 / _keep32m zero the slots of a block of 32 whose bit is clear and leave the others (NaN, -0.0 and
    inf included), mark the kept ones in `taken` (_keep32m: OR, earlier marks stay) and return the bits of the slots
    left nonzero (NaN nonzero, -0.0 not); neighbours untouched. Whichever store the target gets (see the next
    test)."""
    import numba

    km = K._mod()
    keep32, keep32m = km._keep32, km._keep32m  # intrinsics: called from compiled code only
    fns = (numba.njit(cache=False)(lambda x, o, t, b: keep32(x, o, t, b)),
           numba.njit(cache=False)(lambda x, o, t, b: keep32m(x, o, t, b)))
    g = np.random.default_rng(7)
    for trial in range(200):
        o = int(g.integers(0, 40))
        x = g.standard_normal(o + 40).astype(np.float32)
        x[g.random(o + 40) < 0.1] = 0.0
        x[o + int(g.integers(0, 32))] = [np.nan, -0.0, np.inf, -np.inf][trial % 4]
        taken = g.random(o + 40) < 0.2
        bits = np.uint32(g.integers(0, 1 << 32)) if trial % 7 else np.uint32([0, 0xFFFFFFFF][trial % 2])
        keep = ((int(bits) >> np.arange(32)) & 1).astype(bool)
        for mark, fn in zip((False, True), fns):
            xx, tt = x.copy(), taken.copy()
            got = fn(xx, o, tt, bits)
            want = x.copy()
            want[o:o + 32] = np.where(keep, x[o:o + 32], np.float32(0.0))
            assert np.array_equal(xx.view(np.uint32), want.view(np.uint32)), (trial, mark)
            wt = taken.copy()
            if mark:
                wt[o:o + 32] |= keep
            assert np.array_equal(tt, wt), (trial, mark)
            nz = want[o:o + 32] != 0
            assert int(got) == int(np.sum(nz.astype(np.uint64) << np.arange(32, dtype=np.uint64))), (trial, mark)


@needs_numba
def test_keep32_stores_whole_vectors_without_avx512():
    """Where numba's target is x86 with AVX2 and without AVX-512, a loop calling _keep32m stores whole vectors: no
    masked store (vmaskmovps / vpmaskmovd, slow on AMD's Zen 3: see _laundered), which LLVM makes of a store of
    select(m, load p, 0) back to p."""
    import numba

    km = K._mod()
    from icmltools.core.device import numba_target_has

    if not numba_target_has("avx2") or numba_target_has("avx512f"):
        pytest.skip("numba's target is not x86 with AVX2 and without AVX-512: masked stores are not avoided there")
    keep32m = km._keep32m

    @numba.njit(cache=False)
    def keep_all(x, taken, bits):
        c = np.uint32(0)
        for b in range(bits.shape[0]):
            c ^= keep32m(x, 32 * b, taken, bits[b])
        return c

    x, taken, bits = np.ones(64, np.float32), np.zeros(64, np.bool_), np.array([5, 7], np.uint32)
    keep_all(x, taken, bits)
    asm = keep_all.inspect_asm(keep_all.signatures[0])
    stores = re.findall(r"v(?:p)?maskmov\w+\s+%[xy]mm\d+,\s*%[xy]mm\d+,\s*\S*\(", asm)
    assert not stores, stores
    assert x[:3].tolist() == [1.0, 0.0, 1.0] and taken[32:35].tolist() == [True, True, True]


@needs_numba
@pytest.mark.parametrize("nm", [(4, 32), (3, 8), (5, 7), (1, 1), (7, 7), (1, 4), (2, 3), (24, 40), (64, 256)])
@pytest.mark.parametrize("use_taken", [False, True])
def test_nm_loop_equals_the_torch_mask_with_ties_and_tails(nm, use_taken):
    from icmltools.cabs import prune as P

    n, m = nm
    g = torch.Generator().manual_seed(n * 100 + m)
    for numel in (m * 9, m * 9 + m - 1, m * 4 + 1, 3):
        x = (torch.randint(-4, 5, (numel,), generator=g) * 0.25).float()  # many equal |x| in every block
        taken = torch.rand(numel, generator=g) < 0.4 if use_taken else None
        for tail in ("pad", "drop"):
            box = [0]
            mask = P.nm_mask(x, n, m, None if taken is None else taken.clone(), tail, box)
            y, t2 = x.clone(), (None if taken is None else taken.clone())
            short = K.nm_prune(y, n, m, t2, tail == "pad")
            assert torch.equal(y, x.masked_fill(~mask, 0)), (nm, numel, tail)
            assert short == box[0]
            if t2 is not None:
                assert torch.equal(t2, taken | mask)


@needs_numba
def test_radix_select_and_chunked_topk_loops_equal_the_torch_path():
    g = torch.Generator().manual_seed(3)
    x = (torch.randint(-6, 7, (5003,), generator=g) * 0.125).float()  # heavy ties at every threshold
    for k in (1, 17, 2500, 5002):
        thr, n_gt, n_eq = K.radix_select(x, k)
        a = x.abs()
        assert thr == E.kth_largest(a, k) == float(torch.kthvalue(a, a.numel() - k + 1).values)
        assert (n_gt, n_eq) == (int((a > thr).sum()), int((a == thr).sum()))
        for keep_ties in (False, True):
            fast = E.TopK(x, k, keep_ties)
            with K.torch_only():
                ref = E.TopK(x, k, keep_ties)
            for a0 in range(0, x.numel(), 700):  # chunk boundaries inside the run of ties
                c = x[a0:a0 + 700]
                want = c.masked_fill(~ref.mask(c, 0), 0)
                assert torch.equal(fast.prune(c.clone(), 0), want), (k, keep_ties, a0)


def test_bucket_windows_cover_the_sampled_quantile_within_their_cap():
    desc = np.zeros(1 << 15, np.int64)
    desc[901:1001] = 100  # 10,000 sampled values, 100 in each bucket from 1000 down to 901
    # the 20 % quantile is sample index 1999 (bucket 981), 4 standard errors are 160 places: indices 1839-2159
    assert K.bucket_windows(desc, [200_000], 1_000_000) == [(979, 4)]  # buckets 982 down to 979
    assert K.bucket_windows(desc, [200_000], 1_000_000, most=3) == [(980, 3)]  # capped: centred on 981
    assert K.bucket_windows(desc, [200_000, 800_000], 1_000_000) == [(919, 4), (979, 4)]  # two, sorted
    assert K.bucket_windows(desc, [200_000, 200_010], 1_000_000) == [(979, 4)]  # overlapping: one
    assert K.bucket_windows(desc, [200_000, 240_000], 1_000_000, most=3) == [(976, 3), (980, 3)]  # apart
    assert K.bucket_windows(desc, [200_000, 230_000], 1_000_000, most=3) == [(977, 6)]  # touching: one
    assert K.bucket_windows(desc, [800_000, 200_000, 800_010], 1_000_000) == [(919, 4), (979, 4)]  # three: joined
    assert K.bucket_windows(desc, [0, 1_000_000], 1_000_000) == [] == K.bucket_windows(desc * 0, [5], 10)



def test_from_top_finds_the_bucket_where_the_count_from_the_top_reaches_k():
    """_from_top (the radix select's and the windows' walk, from a forward cumsum) on exact cases, its edges, and
    against a direct count from the top on random histograms with empty buckets."""
    counts = np.array([0, 3, 0, 2, 0], np.int64)  # from the top: bucket 3 holds the 1st-2nd, bucket 1 the 3rd-5th
    below = np.cumsum(counts)
    assert [K._from_top(below, k) for k in (1, 2, 3, 5)] == [(3, 0), (3, 0), (1, 2), (1, 2)]
    assert K._from_top(below, 0) == (4, 0) and K._from_top(below, 6) == (-1, 5)  # k <= 0: the last; past: -1
    rng = np.random.default_rng(4)
    for _ in range(200):
        c = rng.integers(0, 3, int(rng.integers(1, 40))) * (rng.random() < 0.9)
        for k in range(1, int(c.sum()) + 1):
            b = max(i for i in range(c.size) if c[i:].sum() >= k)
            assert K._from_top(np.cumsum(c), k) == (b, int(c[b + 1:].sum()))

@needs_numba
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_models_sampled_on_threads_count_what_one_sample_at_a_time_holds(dtype):
    """sample_hi_models (each model's sample on a thread of its own, counted in the loop) gives, for every model,
    the counts np.bincount takes of sample_hi_tau's sample of that model: 1 to 8 models, 1 and 2 threads."""
    km = K._mod()
    numba = km.numba
    g = torch.Generator().manual_seed(6)
    n = 300_001
    base = (torch.randn(n, generator=g) * 0.05).to(dtype)
    starts = K._sample_starts(n)
    sample = np.empty(K._SAMPLE_BLOCKS * K._SAMPLE_WIDTH, np.uint32)
    for n_models in (1, 3, 8):
        raws = tuple(K._np((base.float() + torch.randn(n, generator=g) * 10.0 ** -(1 + i % 3)).to(dtype))
                     for i in range(n_models))
        b = K._np(base)
        want = []
        for r in raws:
            km.sample_hi_tau(r, b, None, starts, K._SAMPLE_WIDTH, sample)
            want.append(np.bincount(sample, minlength=1 << 15))
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            old = numba.get_num_threads()
            numba.set_num_threads(threads)
            try:
                got = np.full((n_models, 1 << 15), -1, np.int64)
                km.sample_hi_models(b, raws, starts, K._SAMPLE_WIDTH, got)
            finally:
                numba.set_num_threads(old)
            assert all(np.array_equal(got[k], want[k]) for k in range(n_models)), (n_models, threads)
            assert got.sum() == n_models * sample.size


@needs_numba
def test_radix_select_tau_with_bucket_windows_equals_the_low_pass(counted, monkeypatch):
    """On a tensor large enough for the sample (2^21 elements), the thresholds, counts above and ties come from
    the low histograms counted in the high pass when the windows hold the buckets (no low pass runs), and from
    the low pass when they do not: the same as two passes either way, with `taken` and bf16 or float32 inputs."""
    g = torch.Generator().manual_seed(5)
    n = K.WINDOW_MIN + 4099
    base = (torch.randn(n, generator=g) * 0.05).to(torch.bfloat16)
    step = torch.randint(-7, 8, (n,), generator=g) * 2.0 ** -10  # bf16 task vectors: many equal |tau|
    raw = (base.float() + step * (1 + torch.rand(n, generator=g))).to(torch.bfloat16)
    taken = torch.rand(n, generator=g) < 0.3
    cases = [(raw, base, None), (raw.float(), base, taken), (raw, base.float(), None)]
    for r, b, tk in cases:
        for ks in ([n // 5], [n // 5, n // 100], [n // 5, n // 5 + 3], [1, n - 1, n // 2]):
            with monkeypatch.context() as mp:
                mp.setattr(K, "WINDOW_MIN", 1 << 62)
                want = K.radix_select_tau(r, b, ks, tk)
            counted.calls.clear()
            before = dict(K.WINDOWS)
            assert K.radix_select_tau(r, b, ks, tk) == want, ks
            assert counted.calls.get("hist_tau_windows") == 1 and not counted.calls.get("hist_hi_tau")
            if len(ks) <= 2:  # the sample placed every bucket: no low pass
                assert K.WINDOWS["hit"] == before["hit"] + 1 and not counted.calls.get("hist_lo_tau"), ks
            with monkeypatch.context() as mp:  # windows that miss: the low pass runs, same answer
                mp.setattr(K, "bucket_windows", lambda desc, ks, n: [(1, 3), (9, 2)])
                counted.calls.clear()
                assert K.radix_select_tau(r, b, ks, tk) == want, ks
                assert counted.calls.get("hist_lo_tau"), ks
    bad = raw.clone()
    bad[n - 3] = float("inf")
    assert K.radix_select_tau(bad, base, [n // 5])[1] == 1


def _deferred_inputs(k_models, dtype, seed=7, least=None):
    """A base and k_models fine-tuned copies of DEFER_MIN (or `least`) + 4099 elements; the first one's task
    vector on a grid of 2^-12 steps (|tau| ties by the thousand at any threshold), the others Gaussian of growing
    scale."""
    g = torch.Generator().manual_seed(seed)
    n = (K.DEFER_MIN if least is None else least) + 4099
    base = (torch.randn(n, generator=g) * 0.02).to(dtype)
    raws = [(base.float() + torch.randn(n, generator=g) * 0.002 * (k + 1)).to(dtype) for k in range(k_models)]
    raws[0] = (base.float() + (torch.randn(n, generator=g) * 8).round() / 4096).to(dtype)
    return n, base, raws


def _scanned(raws, base, ks, keep_ties):
    """Each model's TopK selection as the scan finds it (the windows off: two passes)."""
    n = base.numel()
    return [E.TopK(None, k, keep_ties, K.radix_select_tau(r, base, [k])[0][0], n).selection(0)
            for r, k in zip(raws, ks)]


@needs_numba
@pytest.mark.parametrize("dtype,k_models", [(torch.bfloat16, 3), (torch.float32, 2)])
def test_deferred_thresholds_merge_as_the_scan_bitwise(dtype, k_models, monkeypatch):
    """topk_merge_deferred (no scan: the thresholds found in the merge's pass, the stored window elements merged
    again) gives the scan-then-merge loop's result bitwise: the merged chunk or the output written as it goes,
    nonzeros, ties met, kept pairs, the non-finite output flag; with a quota that splits the ties at a threshold,
    every tie kept (trim=keep_ties), magnitude and TIES, equal and unequal densities and weights."""
    n, base, raws = _deferred_inputs(k_models, dtype)
    monkeypatch.setattr(K, "_DEFER_SEGMENT", 300_001)  # the pass in 8 segments (entries: positions made the tensor's)
    split = 0
    for consensus in (False, True):
        for keep in (False, True):
            for dens in ([0.2] * k_models, [0.1, 0.5, 0.3][:k_models]):
                ks = [max(1, math.ceil(d * n)) if keep else int(d * n) for d in dens]
                ws = [1.0] * k_models if not consensus else [0.7, -1.3, 0.5][:k_models]
                sels = _scanned(raws, base, ks, keep)
                split += sum(not s[2] for s in sels)  # a quota that keeps some of the ties only
                for emit in (None, (0.6, -1)):
                    o1, o2 = torch.empty(n), torch.empty(n)
                    e1 = e2 = None
                    if emit:
                        e1, e2 = ((torch.empty(n, dtype=dtype), *emit) for _ in range(2))
                    want = K.topk_merge_raw(base, raws, sels, ws, consensus, True, o1, emit=e1)
                    before = dict(K.DEFERRED)
                    released = []
                    got = K.topk_merge_deferred(base, raws, ks, keep, ws, consensus, True, o2, emit=e2,
                                                release=lambda a, b, r=released: r.append((a, b)))
                    # each piece's range once it is done: the tensor tiled once, no range across segments
                    released.sort()
                    assert released[0][0] == 0 and released[-1][1] == n, released
                    assert all(x[1] == y[0] for x, y in zip(released, released[1:])), released
                    assert all(a // 300_001 == (b - 1) // 300_001 for a, b in released), released
                    assert len(released) >= -(-n // 300_001)
                    case = (consensus, keep, dens, emit)
                    assert got is not None and K.DEFERRED["found"] == before["found"] + 1, case
                    if emit:
                        assert torch.equal(e1[0].view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                                           e2[0].view(torch.int16 if dtype == torch.bfloat16 else torch.int32)), case
                        assert got[4] == want[4] == 0, case
                    else:
                        assert torch.equal(o1.view(torch.int32), o2.view(torch.int32)), case
                        assert got[4] is None and want[4] is None
                    assert (got[1], got[2]) == (want[1], want[2]) and np.array_equal(got[3], want[3]), case
                    assert got[5] == [tuple(K.radix_select_tau(r, base, [k])[0][0]) for r, k in zip(raws, ks)]
    assert split >= 4  # the ties model's quota split its ties in the cases without keep_ties


@needs_numba
def test_deferred_passes_release_each_piece_once_it_is_done(monkeypatch):
    """The deferred passes (topk_merge_deferred; ca_thresholds' and ca_merge_deferred's) call `release` with each
    piece's range as soon as that piece is done, not once per segment: the calls tile the tensor once, none
    crosses a segment, several per segment, and at each call the piece's output is already written (the output
    filled with NaN before)."""
    n, base, raws = _deferred_inputs(3, torch.bfloat16)
    seg = 1 << 20  # 4 pieces of 2^18 per full segment
    monkeypatch.setattr(K, "_DEFER_SEGMENT", seg)

    def check(calls):
        calls.sort()
        assert calls[0][0] == 0 and calls[-1][1] == n
        assert all(x[1] == y[0] for x, y in zip(calls, calls[1:]))
        assert all(a // seg == (b - 1) // seg for a, b in calls)
        assert len(calls) >= 2 * -(-n // seg)

    ks = [int(0.2 * n)] * 3
    for run in ("topk", "ca_merge", "ca_thresholds"):
        out = torch.full((n,), float("nan"))
        calls, unwritten = [], []

        def release(a, b, calls=calls, unwritten=unwritten, out=out, run=run):
            calls.append((a, b))
            if run != "ca_thresholds" and torch.isnan(out[a:b]).any():
                unwritten.append((a, b))

        if run == "topk":
            got = K.topk_merge_deferred(base, raws, ks, False, [1.0] * 3, False, True, out, release=release)
        elif run == "ca_merge":
            got = K.ca_merge_deferred(base, raws, ks, [1.0] * 3, out, release=release)
        else:
            got = K.ca_thresholds(base, raws, ks, release=release)
        assert got is not None, run
        check(calls)
        assert unwritten == [], run


@needs_numba
def test_deferred_sample_narrows_the_windows_it_stores(monkeypatch):
    """topk_merge_deferred's windows come from a sample of _DEFER_SAMPLE_BLOCKS runs (512: 2^17 elements, twice the
    scan's): on four Gaussian bf16 task vectors (the benchmark's kind) the pass stores under 5 % of the elements
    (summed over the models) and at most 0.8x what a sample of the scan's 256 runs makes it store (5.8-6.4 % there,
    measured), both merging as the scan does."""
    g = torch.Generator().manual_seed(3)
    n = K.DEFER_MIN
    base = (torch.randn(n, generator=g) * 0.02).to(torch.bfloat16)
    raws = [(base.float() + torch.randn(n, generator=g) * 0.002).to(torch.bfloat16) for _ in range(4)]
    ks, ws = [n // 5] * 4, [1.0] * 4
    want = torch.empty(n)
    K.topk_merge_raw(base, raws, _scanned(raws, base, ks, False), ws, 1, True, want)
    real = K._deferred_segments
    stored = {}

    def counted(*a):
        got = real(*a)
        stored[K._DEFER_SAMPLE_BLOCKS] = int((got[4] - got[3]).sum())  # the entries' regions (first, end)
        return got

    monkeypatch.setattr(K, "_deferred_segments", counted)
    assert K._DEFER_SAMPLE_BLOCKS == 512
    for blocks in (512, 256):
        monkeypatch.setattr(K, "_DEFER_SAMPLE_BLOCKS", blocks)
        out = torch.empty(n)
        assert K.topk_merge_deferred(base, raws, ks, False, ws, 1, True, out) is not None
        assert torch.equal(out.view(torch.int32), want.view(torch.int32)), blocks
    assert stored[512] < 0.05 * n and stored[512] <= 0.8 * stored[256], stored


@needs_numba
def test_deferred_band_merges_as_the_scan_bitwise():
    """Breadcrumbs' band deferred (`tops`: each model's top dropped too, its window above the first and the
    elements above it stored): bitwise the scan-then-merge loop with both TopKs per model, the merged chunk or
    the output, nonzeros, ties at both thresholds, overlap counts, and both selections the scan's."""
    n, base, raws = _deferred_inputs(3, torch.bfloat16)
    ran = 0
    for dens, gamma in (([0.2] * 3, 0.01), ([0.1, 0.5, 0.3], 0.02)):
        ks, tops = [], []
        for d in dens:
            target, n_top = int(d * n), int(gamma * n)
            ks.append(target + n_top)
            tops.append(n_top)
        sels = _scanned(raws, base, ks, False)
        sels2 = _scanned(raws, base, tops, False)
        for emit in (None, (0.6, -1)):
            o1, o2 = torch.empty(n), torch.empty(n)
            e1 = e2 = None
            if emit:
                e1, e2 = ((torch.empty(n, dtype=torch.bfloat16), *emit) for _ in range(2))
            ws = [0.7, -1.3, 0.5]
            want = K.topk_merge_raw(base, raws, sels, ws, False, False, o1, emit=e1, tops=sels2)
            got = K.topk_merge_deferred(base, raws, ks, False, ws, False, False, o2, emit=e2, tops=tops)
            assert got is not None, (dens, gamma)
            ran += 1
            if emit:
                assert torch.equal(e1[0].view(torch.int16), e2[0].view(torch.int16)) and got[4] == want[4] == 0
            else:
                assert torch.equal(o1.view(torch.int32), o2.view(torch.int32))
            assert (got[1], got[2], got[6]) == (want[1], want[2], want[5]) and np.array_equal(got[3], want[3])
            assert got[5] == [tuple(K.radix_select_tau(r, base, [k])[0][0]) for r, k in zip(raws + raws, ks + tops)]
    assert ran == 4 and any(not s[2] for s in sels + sels2)  # a quota split ties at some threshold


@needs_numba
def test_marked_positions_are_listed_in_order():
    """_list_marked lists exactly the positions whose marks share a bit with `bits`, in order: rows shorter and
    longer than its 64-mark words, with a partial last word, none, some or every position marked."""
    km = K._mod()
    g = np.random.default_rng(1)
    for n in (0, 1, 63, 64, 65, 127, 2047, 2048, 4113):
        for share in (0.0, 0.03, 0.5, 1.0):
            q = np.zeros(n, np.uint8)
            hit = g.random(n) < share
            q[hit] = g.integers(1, 256, int(hit.sum())).astype(np.uint8)
            for bits in (0xFF, 0x01, 0x80, 0x06):
                idx = np.full(n + 1, -7, np.int64)
                c = km._list_marked(q, np.uint8(bits), idx)
                want = np.nonzero(q & bits)[0]
                assert c == len(want) and np.array_equal(idx[:c], want), (n, share, bits)


@needs_numba
def test_marked_entries_packed_in_registers_equal_the_listed_ones():
    """_store_packed (64 positions compressed in vector registers, where the CPU has AVX-512 VBMI2) stores exactly
    the entries _store_listed stores, whatever the block (a partial last word, none to every position marked),
    the dtype (bf16 bits, float32), the model count, with or without positions, rows of a column slice (the
    pass's own), and room (the share's end within 64 of the start: one by one, or overflowing: -1 for both);
    neither writes before the start or past the end."""
    km = K._mod()
    from icmltools.core.device import numba_target_has

    if not numba_target_has("avx512f", "avx512bw", "avx512vbmi2"):
        pytest.skip("numba's target lacks AVX-512 VBMI2: the listed path is the only one")
    g = np.random.default_rng(4)
    for trial in range(240):
        L = int(g.choice([1, 63, 64, 65, 200, 2047, 2048]))
        s = int(g.integers(0, 300))
        share = float(g.choice([0.0, 0.02, 0.3, 1.0]))
        pp = ((g.random(L) < share) * g.integers(1, 256, L)).astype(np.uint8)
        dt = (np.uint16, np.float32)[trial % 2]
        base = g.integers(0, 1 << 16, s + L).astype(dt)
        rs = tuple(g.integers(0, 1 << 16, L).astype(dt) for _ in range(int(g.integers(1, 9))))
        m0, cap = 3, int(g.integers(5, L + 80))  # the end, cap - 2, at the start or after it
        got = []
        for store in ("listed", "packed"):
            pos = np.full(cap + 5, -7, np.int32) if trial % 3 else None
            pat = np.full(cap + 5, 99, np.uint8)
            whole = np.full((len(rs) + 1, cap + 9), 7, dt)
            vals = whole[:, 2:cap + 7]  # a column slice, as the pass's share of the rows
            idx = np.empty(L, np.int64)
            args = (pp, idx, s, base, rs, None if pos is None else pos[:cap], pat[:cap], vals[:, :cap - 2], m0,
                    cap - 2)
            m = getattr(km, f"_store_{store}")(*args)
            got.append((m, pos, pat, whole))
        (m, pos, pat, whole), (m2, pos2, pat2, whole2) = got
        want = np.nonzero(pp)[0]
        assert m == m2 == (m0 + len(want) if m0 + len(want) <= cap - 2 else -1), (trial, m, m2)
        end = m if m >= 0 else m0
        assert np.array_equal(pat[:end], pat2[:end]) and np.array_equal(whole[:, :end + 2], whole2[:, :end + 2])
        assert pos is None or np.array_equal(pos[:end], pos2[:end])
        assert (pat2[:m0] == 99).all() and (whole2[:, :m0 + 2] == 7).all() and (whole2[:, cap:] == 7).all()
        assert (pat2[cap - 2:] == 99).all() and (pos2 is None or (pos2[cap - 2:] == -7).all())
        if m >= 0:
            assert np.array_equal(pat2[m0:m], pp[want]) and np.array_equal(whole2[0, m0 + 2:m + 2], base[s + want])
            assert pos2 is None or np.array_equal(pos2[m0:m], s + want)


@needs_numba
@pytest.mark.parametrize("k_models", [2, 4])
def test_fused_loop_flags_what_is_not_finite_kept_or_not(k_models):
    """The fused loop's non-finite flag (top-k: from the largest |x_k|'s bits, no x_k held to the loop's end) is 1
    for a NaN task-vector element (no threshold keeps it: it never reaches the sum), for an inf (kept), for finite
    values whose weighted sum overflows, and 0 for finite ones: the plain top-k loop, the deferred pass's (windows)
    and Breadcrumbs' (windows and its top), the sum and TIES."""
    import numba

    km = K._mod()

    @numba.njit
    def run(bs, rs, consensus, which, o, pt, pw):
        k = len(rs)
        tv, tf, one = np.full(k, 0.5, np.float32), np.ones(k, np.bool_), np.ones(k, np.float32)
        s32 = np.empty((2, bs.shape[0]), np.uint32)
        lo, wd = np.full(k, 0x3E000000, np.uint32), np.full(k, 0x00800000, np.uint32)
        if which == 0:
            return km._fused_span(bs, rs, None, tv, tf, one, one, consensus, True, o, pt, None, None, None, None,
                                  None, s32)[0]
        if which == 1:
            return km._fused_span(bs, rs, None, tv, tf, one, one, consensus, True, o, pt, None, None, lo, wd, pw,
                                  s32)[0]
        tv2 = np.full(k, np.inf, np.float32)
        top = np.full(k, 0x7F800000, np.uint32)
        return km._fused_span(bs, rs, None, tv, tf, one, one, False, True, o, pt, tv2, tf, (lo, lo, top), (wd, wd),
                              pw, s32)[0]

    n = 67
    g = np.random.default_rng(k_models)
    base = np.zeros(n, np.float32)
    finite = [(g.standard_normal(n) * 0.6).astype(np.float32) for _ in range(k_models)]
    o, pt, pw = np.empty(n, np.float32), np.empty(n, np.uint8), np.empty(n, np.uint8)
    for which, consensus in ((0, False), (0, True), (1, False), (1, True), (2, False)):
        case = (which, consensus)
        assert run(base, tuple(finite), consensus, which, o, pt, pw) == 0, case
        for bad in (np.nan, np.inf, -np.inf):
            rs = [r.copy() for r in finite]
            rs[-1][41] = bad
            rs[0][41] = 0.1  # dropped by its threshold (0.5)
            assert run(base, tuple(rs), consensus, which, o, pt, pw) == 1, (case, bad)
        big = [r.copy() for r in finite]
        for r in big:
            r[5] = 3e38  # each kept and finite; their sum is not
        assert run(base, tuple(big), consensus, which, o, pt, pw) == 1, case


@needs_numba
def test_window_bits_mark_the_models_inside_their_windows():
    """The deferred pass's fused loop marks, exactly, bit k where model k's |tau| has float32 bits in [los[k],
    los[k] + wds[k]) (both signs, the window's last value in, its end out) and counts the positions marked; with
    Breadcrumbs' top (tv2) it marks the second window too and counts each model's elements from his2[k] on. The
    merge is the one without windows; the pass keeps every tie at tv (tf all True) and counts none."""
    import numba

    km = K._mod()
    lo, hi = np.uint32(0x3C000000), np.uint32(0x3C030000)  # buckets 0x3C00 .. 0x3C02
    edge = np.array([lo - 1, lo, hi - 1, hi, 0x3C010000], np.uint32).view(np.float32)
    base = np.zeros(5, np.float32)
    a = np.concatenate([edge[:4], [0.0]]).astype(np.float32)
    b = -np.concatenate([[0.0], edge[1:]]).astype(np.float32)
    los, wds = np.array([lo, lo], np.uint32), np.array([hi - lo, hi - lo], np.uint32)

    @numba.njit
    def fused(bs, rs, wl, ww, pw, o, pt):
        tv, tf, one = np.full(2, hi - 1, np.uint32).view(np.float32), np.ones(2, np.bool_), np.ones(2, np.float32)
        return km._fused_span(bs, rs, None, tv, tf, one, one, False, True, o, pt, None, None, wl, ww, pw,
                              np.empty((2, bs.shape[0]), np.uint32))

    @numba.njit
    def fused_top(bs, rs, wl, ww, pw, o, pt):  # Breadcrumbs' pass, its top at inf: nothing dropped by it
        tv, tf, one = np.full(2, hi - 1, np.uint32).view(np.float32), np.ones(2, np.bool_), np.ones(2, np.float32)
        tv2 = np.full(2, 0x7F800000, np.uint32).view(np.float32)
        return km._fused_span(bs, rs, None, tv, tf, one, one, False, True, o, pt, tv2, tf, wl, ww, pw,
                              np.empty((2, bs.shape[0]), np.uint32))

    none, zero = np.array([0xFFFFFFFF] * 2, np.uint32), np.zeros(2, np.uint32)
    # no second window, nothing counted; then a second window for a: [hi, hi + 1) (its last value hi), counted
    # from lo on: a 3 (lo, hi - 1, hi), b 4
    for los2, wds2, his2, marks, counts in ((zero, zero, none, [0, 3, 3, 0, 2], [0, 0]),
                                            (np.array([hi, 0], np.uint32), np.array([1, 0], np.uint32),
                                             np.array([lo, lo], np.uint32), [0, 3, 3, 1, 2], [3, 4])):
        pp, o, pt, o2, pt2 = np.full(5, 9, np.uint8), *(np.empty(5, t) for t in (np.float32, np.uint8) * 2)
        got = fused_top(base, (a, b), (los, los2, his2), (wds, wds2), pp, o, pt)
        assert pp.tolist() == marks and got[4] == sum(m != 0 for m in marks)
        assert [km._unpack(got[3], k) for k in range(8)] == counts + [0] * 6 and got[2] == (0, 0, 0, 0)
        fused(base, (a, b), None, None, None, o2, pt2)
        assert np.array_equal(o.view(np.uint32), o2.view(np.uint32)) and np.array_equal(pt, pt2)
    for marked in (np.zeros(5, np.uint8), np.full(5, 255, np.uint8)):  # magnitude's and TIES' one window
        o, pt, o2, pt2 = np.empty(5, np.float32), np.empty(5, np.uint8), np.empty(5, np.float32), np.empty(5, np.uint8)
        got = fused(base, (a, b), los, wds, marked, o, pt)
        assert marked.tolist() == [0, 3, 3, 0, 2] and got[4] == 3
        plain = fused(base, (a, b), None, None, None, o2, pt2)
        assert plain[4] == 0 and got[:2] == plain[:2] and got[3] == plain[3]
        assert got[2] == (0, 0, 0, 0) and plain[2] == (65537, 0, 0, 0)  # a's and b's tie at hi - 1: counted plain
        assert np.array_equal(o.view(np.uint32), o2.view(np.uint32)) and np.array_equal(pt, pt2)
        assert pt.tolist() == [0, 0, 3, 3, 0]  # kept: |tau| from the window's last value (hi - 1) on


@needs_numba
def test_deferred_thresholds_decline_what_they_cannot_place():
    """topk_merge_deferred runs only where it can: None (the scan's path then decides) for a tensor below
    DEFER_MIN, a k of 0 or n, windows holding a large share of the tensor (a task vector mostly 0), a window that
    misses the k-th (its pass run, then declined), a non-finite task vector."""
    n, base, raws = _deferred_inputs(2, torch.bfloat16)
    out = torch.empty(n)
    ks = [n // 5, n // 3]
    small = K.DEFER_MIN - 1
    assert K.topk_merge_deferred(base[:small], [r[:small] for r in raws], ks, False, [1, 1], False, True,
                                 out[:small]) is None
    assert K.topk_merge_deferred(base, raws, [0, n // 3], False, [1, 1], False, True, out) is None
    assert K.topk_merge_deferred(base, raws, [n, n // 3], False, [1, 1], False, True, out) is None
    mostly_zero = base.clone()
    mostly_zero[: n // 50] += 0.01
    before = dict(K.DEFERRED)
    assert K.topk_merge_deferred(base, [mostly_zero, raws[1]], ks, False, [1, 1], False, True, out) is None
    assert K.DEFERRED == before  # declined before its pass
    bad = raws[1].clone()
    bad[n - 5] = float("nan")
    assert K.topk_merge_deferred(base, [raws[0], bad], ks, False, [1, 1], False, True, out) is None
    real = K.bucket_windows
    try:  # a window above the k-th: too many elements above it
        K.bucket_windows = lambda counts, ks_, n_: [(w[0] + 40, w[1]) for w in real(counts, ks_, n_)]
        before = dict(K.DEFERRED)
        assert K.topk_merge_deferred(base, raws, ks, False, [1, 1], False, True, out) is None
        assert K.DEFERRED == {"tried": before["tried"] + 1, "found": before["found"]}
    finally:
        K.bucket_windows = real


@needs_numba
@pytest.mark.parametrize("name", ["magnitude", "ties", "breadcrumbs", "breadcrumbs_ties"])
def test_engine_defers_the_scan_and_falls_back_bitwise(tmp_path, monkeypatch, name):
    """The engine merges a tensor of at least DEFER_MIN elements in one chunk with the thresholds found in the
    pass (no scan; Breadcrumbs: both of each model's), a small one or a float16 one by scan then merge, and a
    tensor whose deferral is declined by scan then merge again (where one model's window missed, that model alone
    scanned): the written file and every figure of the summary equal the scan's path (deferral off)."""
    n, b, raws = _deferred_inputs(3, torch.bfloat16)
    monkeypatch.setattr(K, "_DEFER_SEGMENT", 1 << 19)  # the pass in 5 segments
    half = slice(0, K.DEFER_MIN)  # float16: not a dtype of the one-pass loops, never deferred (chunked)
    base = {"big": b, "small": b[:5000].clone(), "half": b[half].half()}
    models = [{"big": r, "small": r[:5000].clone(), "half": r[half].half()} for r in raws]
    plan = E.make_plan(name, 3, weights=[0.7, -1.3, 0.5], densities=[0.3, 0.2, 0.45])
    with monkeypatch.context() as mp:
        mp.setattr(K, "DEFER_MIN", 1 << 62)
        want = _merge_bytes(tmp_path, "scanned", base, models, plan, 0.6, -1)
    before = dict(K.DEFERRED)
    got = _merge_bytes(tmp_path, "deferred", base, models, plan, 0.6, -1)
    assert K.DEFERRED == {"tried": before["tried"] + 1, "found": before["found"] + 1}
    for d in (got[1], want[1]):
        d.pop("seconds"), d.pop("read_gb_per_s")
    assert got[0] == want[0] and got[1] == want[1]
    with monkeypatch.context() as mp:  # every window misses: declined after its pass, then scanned and merged
        wrong = itertools.cycle([[(1, 3)], [(32000, 2)]])  # below every k-th largest, then above (a top's)
        mp.setattr(K, "bucket_windows", lambda counts, ks, n_: next(wrong))
        before = dict(K.DEFERRED)
        again = _merge_bytes(tmp_path, "declined", base, models, plan, 0.6, -1)
        assert K.DEFERRED == {"tried": before["tried"] + 1, "found": before["found"]}
    again[1].pop("seconds"), again[1].pop("read_gb_per_s")
    assert again[0] == want[0] and again[1] == want[1]
    real, real_select = K.bucket_windows, K.radix_select_tau
    calls, scanned = itertools.count(), []
    miss = 3 if name.startswith("breadcrumbs") else 1  # model 1's window (Breadcrumbs: its top's)

    def one_misses(counts, ks, n_, *a, **kw):
        w = real(counts, ks, n_, *a, **kw)
        return [(w[0][0] + 40, w[0][1])] + w[1:] if n_ == n and next(calls) == miss else w

    def select(raw, *a, **kw):
        scanned.append(raw.numel())
        return real_select(raw, *a, **kw)

    with monkeypatch.context() as mp:  # one window misses: only its model is scanned, then the tensor merged
        mp.setattr(K, "bucket_windows", one_misses)
        mp.setattr(K, "radix_select_tau", select)
        before = dict(K.DEFERRED)
        once = _merge_bytes(tmp_path, "one_missed", base, models, plan, 0.6, -1)
        assert K.DEFERRED == {"tried": before["tried"] + 1, "found": before["found"]}
    assert scanned.count(n) == 1
    once[1].pop("seconds"), once[1].pop("read_gb_per_s")
    assert once[0] == want[0] and once[1] == want[1]
    chunked = E.make_plan(name, 3, weights=[0.7, -1.3, 0.5], densities=[0.3, 0.2, 0.45], chunk_elems=1 << 20)
    spans = {nm: [c[:2] for c in chunks] for nm, _, chunks in
             E.iter_merged(MemoryReader(base), [MemoryReader(m) for m in models], chunked, list(base))}
    assert spans["big"] == [(0, n)] and len(spans["half"]) == 2  # deferred: one chunk; float16: chunked


def _ca_scanned(raws, base, ks):
    """CA-magnitude's thresholds as its scan finds them, model after model: the ks[k]-th largest |tau_k| with the
    slots taken at 0 (radix_select_tau, the windows off), then the slots it keeps marked taken."""
    taken = torch.zeros(base.numel(), dtype=torch.bool)
    got = []
    for r, k in zip(raws, ks):
        got.append(K.radix_select_tau(r, base, [k], taken)[0][0][0])
        assert K.mark_above_tau(r, base, got[-1], taken)
    return got


@needs_numba
@pytest.mark.parametrize("dtype,k_models", [(torch.bfloat16, 3), (torch.float32, 3), (torch.bfloat16, 1),
                                            (torch.bfloat16, 2)])
def test_ca_thresholds_in_one_pass_equal_the_scan_model_by_model(dtype, k_models, monkeypatch):
    """kernels.ca_thresholds (every model's threshold from one pass over all of them and the entries it stores)
    gives the thresholds of the scan model by model, exactly: equal and unequal densities, a model whose |tau| ties
    by the thousand, the pass in several segments, one to three models (each count its own generated loop)."""
    n, base, raws = _deferred_inputs(k_models, dtype, seed=9, least=K.WINDOW_MIN)
    monkeypatch.setattr(K, "_DEFER_SEGMENT", 300_001)  # the pass in 8 segments
    monkeypatch.setattr(K, "WINDOW_MIN", 1 << 62)  # the reference's selections without windows
    want = {}
    for dens in ([0.2] * 3, [0.05, 0.4, 0.1], [0.3, 0.02, 0.25]):
        ks = [n - int((1 - d) * n) for d in dens[:k_models]]
        want[tuple(dens)] = ks, _ca_scanned(raws, base, ks)
    monkeypatch.undo()
    monkeypatch.setattr(K, "_DEFER_SEGMENT", 300_001)
    for ks, thr in want.values():
        before = dict(K.CA_THRESHOLDS)
        assert K.ca_thresholds(base, raws, ks) == thr, ks
        assert K.CA_THRESHOLDS == {"tried": before["tried"] + 1, "found": before["found"] + 1}
        assert all(t > 0 for t in thr)


@needs_numba
def test_ca_thresholds_decline_what_they_cannot_place(monkeypatch):
    """ca_thresholds runs only where it can: None (the scan model by model then decides) for a tensor below
    WINDOW_MIN, a k of 0 or n, a threshold at 0 (the slots taken would count in its window), windows holding a
    large share of the tensor, a non-finite task vector, a window that misses its threshold (its pass run, then
    declined)."""
    n, base, raws = _deferred_inputs(3, torch.bfloat16, seed=9, least=K.WINDOW_MIN)
    ks = [n // 5] * 3
    small = K.WINDOW_MIN - 1
    before = dict(K.CA_THRESHOLDS)
    assert K.ca_thresholds(base[:small], [r[:small] for r in raws], ks) is None
    assert K.ca_thresholds(base, raws, [0, n // 5, n // 5]) is None
    assert K.ca_thresholds(base, raws, [n, n // 5, n // 5]) is None
    assert K.ca_thresholds(base, raws, [n // 2] * 3) is None  # the third model's threshold is 0
    mostly_zero = base.clone()
    mostly_zero[: n // 50] += 0.01
    assert K.ca_thresholds(base, [mostly_zero, raws[1], raws[2]], ks) is None
    assert K.CA_THRESHOLDS == before  # each declined before its pass
    bad = raws[1].clone()
    bad[n - 5] = float("nan")
    assert K.ca_thresholds(base, [raws[0], bad, raws[2]], ks) is None
    real = K.bucket_windows
    for shift in (40, -40):  # a window above the threshold (too many above it), then below it (too few)
        monkeypatch.setattr(K, "bucket_windows", lambda counts, ks_, n_, most, d=shift: [
            (w[0] + d, w[1]) for w in real(counts, ks_, n_, most)])
        assert K.ca_thresholds(base, raws, ks) is None
    assert K.CA_THRESHOLDS == {"tried": before["tried"] + 3, "found": before["found"]}


def _same_results(a, b) -> bool:
    """Two one-pass loops' results (flags, counts, kept pairs as arrays) equal."""
    return len(a) == len(b) and all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
                                    for x, y in zip(a, b))


@needs_numba
@pytest.mark.parametrize("dtype,k_models", [(torch.bfloat16, 3), (torch.float32, 2), (torch.bfloat16, 1),
                                            (torch.bfloat16, 4)])
def test_ca_merged_in_the_thresholds_pass_equals_the_merge_after_them(dtype, k_models, monkeypatch):
    """kernels.ca_merge_deferred (the slots the windows decide merged in the thresholds' pass, the stored ones
    merged again once the thresholds are found) gives ca_merge_raw's results with ca_thresholds' thresholds,
    bitwise: the merged tensor, or the output written as it goes (lambda 1, lambda with sign -1), nonzeros, kept
    pairs, the thresholds; negative weights, equal and unequal densities, the pass in several segments."""
    n, base, raws = _deferred_inputs(k_models, dtype, seed=5, least=K.DEFER_MIN)
    monkeypatch.setattr(K, "_DEFER_SEGMENT", 700_001)  # the pass in 4 segments
    ws = [0.7, -1.3, 2.0, 0.5][:k_models]
    ib = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for dens in ([0.2] * 4, [0.05, 0.4, 0.1, 0.3]):
        ks = [n - int((1 - d) * n) for d in dens[:k_models]]
        thr = K.ca_thresholds(base, raws, ks)
        want_out = torch.empty(n)
        want = K.ca_merge_raw(base, raws, thr, ws, want_out)
        before = dict(K.CA_DEFERRED)
        got_out = torch.full((n,), 3.0)
        got = K.ca_merge_deferred(base, raws, ks, ws, got_out)
        assert K.CA_DEFERRED == {"tried": before["tried"] + 1, "found": before["found"] + 1}
        assert _same_results(got[:4], want) and got[4] == thr and want[1] > 0
        assert torch.equal(got_out.view(torch.int32), want_out.view(torch.int32))
        for lam, sign in ((1.0, 1), (0.6, -1)):
            e_want, e_got = torch.empty(n, dtype=dtype), torch.zeros(n, dtype=dtype)
            want = K.ca_merge_raw(base, raws, thr, ws, want_out, emit=(e_want, lam, sign))
            got = K.ca_merge_deferred(base, raws, ks, ws, got_out, emit=(e_got, lam, sign))
            assert _same_results(got[:4], want) and want[3] == 0
            assert torch.equal(e_got.view(ib), e_want.view(ib))


@needs_numba
def test_ca_merged_in_the_thresholds_pass_declines_what_it_cannot_do(monkeypatch):
    """ca_merge_deferred returns None (the scan and ca_merge_raw then decide) before its pass for a tensor below
    DEFER_MIN, a k of 0 or n, a weight of 0, windows it cannot place; after it for a non-finite task vector, a
    window that misses its threshold, a result that overflows."""
    n, base, raws = _deferred_inputs(3, torch.bfloat16, seed=9, least=K.DEFER_MIN)
    ks, ws = [n // 5] * 3, [1.0, 0.5, 2.0]
    out = torch.empty(n)
    small = K.DEFER_MIN - 1
    before = dict(K.CA_DEFERRED)
    assert K.ca_merge_deferred(base[:small], [r[:small] for r in raws], ks, ws, out[:small]) is None
    assert K.ca_merge_deferred(base, raws, [0, n // 5, n // 5], ws, out) is None
    assert K.ca_merge_deferred(base, raws, [n, n // 5, n // 5], ws, out) is None
    assert K.ca_merge_deferred(base, raws, ks, [1.0, 0.0, 2.0], out) is None
    assert K.ca_merge_deferred(base, raws, [n // 2] * 3, ws, out) is None  # the third model's threshold is 0
    assert K.CA_DEFERRED == before
    bad = raws[1].clone()
    bad[n - 5] = float("nan")
    assert K.ca_merge_deferred(base, [raws[0], bad, raws[2]], ks, ws, out) is None
    real = K.bucket_windows
    with monkeypatch.context() as mp:
        mp.setattr(K, "bucket_windows", lambda counts, ks_, n_, most: [(w[0] + 40, w[1])
                                                                      for w in real(counts, ks_, n_, most)])
        assert K.ca_merge_deferred(base, raws, ks, ws, out) is None
    big = raws[1].clone()
    big[:1000] += 4  # kept by model 1: 4 * 3e38 overflows float32
    assert K.ca_merge_deferred(base, [raws[0], big, raws[2]], ks, [1.0, 3e38, 2.0], out) is None
    assert K.CA_DEFERRED == {"tried": before["tried"] + 3, "found": before["found"]}
    assert K.ca_merge_deferred(base, [raws[0], big, raws[2]], ks, ws, out) is not None


@needs_numba
def test_ca_merged_in_the_thresholds_pass_flags_a_nan_no_model_keeps():
    """ca_merge_deferred's pass declines (None, after its pass) a tensor with a NaN on a slot an earlier model took:
    no model keeps it, so it never reaches the sum, and the pass's flag (the largest |x_k|'s bits) names it; the
    same tensor without the NaN merges."""
    n, base, raws = _deferred_inputs(3, torch.bfloat16, seed=9, least=K.DEFER_MIN)
    ks, ws = [n // 5] * 3, [1.0, 0.5, 2.0]
    out = torch.empty(n)
    at = int((raws[0].float() - base.float()).abs().argmax())  # model 0's largest |tau|: its slot taken first
    assert K.ca_merge_deferred(base, raws, ks, ws, out) is not None
    bad = raws[1].clone()
    bad[at] = float("nan")
    before = dict(K.CA_DEFERRED)
    assert K.ca_merge_deferred(base, [raws[0], bad, raws[2]], ks, ws, out) is None
    assert K.CA_DEFERRED == {"tried": before["tried"] + 1, "found": before["found"]}


@needs_numba
def test_engine_finds_ca_magnitude_thresholds_in_one_pass_bitwise(tmp_path, monkeypatch):
    """The engine's CA-magnitude merges a tensor of at least DEFER_MIN elements read from files in the pass that
    finds its thresholds (ca_merge_deferred), a small one model by model, and a tensor whose pass is declined by
    ca_thresholds' pass or model by model again; with a weight of 0 (no deferral) by ca_thresholds' pass: the
    written file and every figure of the summary equal the scan model by model's; in memory (views of the held
    tensors) the same."""
    n, b, raws = _deferred_inputs(3, torch.bfloat16, seed=9, least=K.WINDOW_MIN)
    monkeypatch.setattr(K, "_DEFER_SEGMENT", 1 << 19)  # the pass in 5 segments
    base = {"big": b, "small": b[:5000].clone()}
    models = [{"big": r, "small": r[:5000].clone()} for r in raws]
    write_state_dict(base, tmp_path / "base.safetensors")
    for i, m in enumerate(models):
        write_state_dict(m, tmp_path / f"m{i}.safetensors")

    def merged(tag, weights=(0.7, -1.3, 0.5)):
        out = tmp_path / f"{tag}.safetensors"
        st = E.merge_to_checkpoint(open_checkpoint(tmp_path / "base.safetensors"),
                                   [open_checkpoint(tmp_path / f"m{i}.safetensors") for i in range(3)],
                                   E.make_plan("ca_magnitude", 3, weights=list(weights), densities=[0.3, 0.2, 0.1]),
                                   0.6, out, sign=-1)
        d = st.summary(extended=True, per_tensor=True)
        d.pop("seconds"), d.pop("read_gb_per_s")
        return out.read_bytes(), d

    from icmltools.cabs.methods import CAMagnitude

    def counts():
        return dict(K.CA_DEFERRED), dict(K.CA_THRESHOLDS)

    def added(before, deferred, together):
        (d, t), now = before, counts()
        assert now == ({"tried": d["tried"] + deferred[0], "found": d["found"] + deferred[1]},
                       {"tried": t["tried"] + together[0], "found": t["found"] + together[1]})

    with monkeypatch.context() as mp:
        mp.setattr(CAMagnitude, "scans_together", False)
        mp.setattr(CAMagnitude, "defers", lambda self, st: False)
        before = counts()
        want = merged("scanned")
        want0 = merged("scanned0", (0.7, 0.0, 0.5))
        added(before, (0, 0), (0, 0))
    with monkeypatch.context() as mp:
        mp.setattr(CAMagnitude, "defers", lambda self, st: False)
        before = counts()
        assert merged("together") == want
        added(before, (0, 0), (1, 1))
    before = counts()
    assert merged("deferred") == want
    added(before, (1, 1), (0, 0))
    assert merged("zero", (0.7, 0.0, 0.5)) == want0  # a weight of 0: not deferred, ca_thresholds' pass
    added(before, (1, 1), (1, 1))
    real = K.bucket_windows
    with monkeypatch.context() as mp:  # every window misses: declined after each pass, then scanned model by model
        mp.setattr(K, "bucket_windows", lambda counts, ks, n_, most=6: [(w[0] + 40, w[1])
                                                                        for w in real(counts, ks, n_, most)])
        before = counts()
        assert merged("declined") == want
        added(before, (1, 0), (1, 0))
    plan = E.make_plan("ca_magnitude", 3)
    before = counts()
    mem = E.merge_state_dicts(base, models, plan)[0]  # in memory: views of the held tensors
    added(before, (1, 1), (0, 0))
    with monkeypatch.context() as mp:
        mp.setattr(CAMagnitude, "scans_together", False)
        mp.setattr(CAMagnitude, "defers", lambda self, st: False)
        ref = E.merge_state_dicts(base, models, plan)[0]
    assert mem.keys() == ref.keys() and all(torch.equal(mem[k], ref[k]) for k in mem)
    for weights, whole in (([0.7, -1.3, 0.5], True), ([0.7, 0.0, 0.5], False)):  # deferred: one chunk; a 0: chunked
        chunked = E.make_plan("ca_magnitude", 3, weights=weights, chunk_elems=1 << 20)
        spans = {nm: [c[:2] for c in chunks] for nm, _, chunks in
                 E.iter_merged(MemoryReader(base), [MemoryReader(m) for m in models], chunked, list(base))}
        assert (spans["big"] == [(0, n)]) == whole and len(spans["big"]) >= 1


@needs_numba
def test_windowed_high_pass_adds_into_its_histograms():
    """hist_tau_windows adds its counts to the histograms it is given (as hist_hi_tau and hist_lo_tau do): twice
    into the same arrays is twice once, a window's bucket included, and once equals the two passes."""
    km = K._mod()
    g = torch.Generator().manual_seed(11)
    n = 300_001
    base = (torch.randn(n, generator=g) * 0.05).to(torch.bfloat16)
    raw = (base.float() + torch.randint(-7, 8, (n,), generator=g) * 2.0 ** -10).to(torch.bfloat16)
    r, b = K._np(raw).reshape(-1), K._np(base).reshape(-1)
    hi = np.zeros(1 << 15, np.int64)
    km.hist_hi_tau(r, b, hi, None)
    s0, s1 = (int(x) for x in np.argsort(hi)[-2:])  # two busy buckets, one window each
    one, rows = np.zeros(1 << 15, np.int64), np.zeros((2, 1 << 16), np.int64)
    km.hist_tau_windows(r, b, one, None, s0, 1, s1, 1, rows, 2)
    assert (one == hi).all()
    for d, bucket in enumerate((s0, s1)):
        lo = np.zeros(1 << 16, np.int64)
        km.hist_lo_tau(r, b, bucket, lo, None)
        assert (rows[d] == lo).all() and rows[d].sum() == hi[bucket] > 0
    twice, rows2 = one.copy(), rows.copy()
    km.hist_tau_windows(r, b, twice, None, s0, 1, s1, 1, rows2, 2)
    assert (twice == 2 * one).all() and (rows2 == 2 * rows).all()


@needs_numba
@pytest.mark.parametrize("seed", [0, 1, 2 ** 32 + 5, 2 ** 63 - 1])
def test_compiled_dare_stream_draws_torch_rand_numbers(seed):
    """DARE's compiled MT19937 stream: torch.rand's float32 numbers for the same seed, across chunk sizes that
    cross the 624-word state refills, and its drop is `u < p` for p at the float32 edges."""
    g = torch.Generator().manual_seed(seed)
    mt = K.mt_stream(seed)
    for n in (1, 623, 624, 625, 5000, 70001):
        assert torch.equal(mt.uniforms(torch.empty(n)), torch.rand(n, generator=g)), n
    for p in (1e-9, 2.0 ** -24, 0.1, 0.5, 1 - 2.0 ** -24, 0.99999999):
        g, mt = torch.Generator().manual_seed(seed), K.mt_stream(seed)
        x = torch.randn(3001, generator=torch.Generator().manual_seed(1))
        want = x.masked_fill(torch.rand(3001, generator=g) < p, 0)
        got = x.clone()
        assert K.dare_zero_mt(got[:1000], mt, p) and K.dare_zero_mt(got[1000:], mt, p)
        assert torch.equal(got, want), p


@needs_numba
def test_dare_draws_from_states_on_their_own_cache_lines(monkeypatch, tmp_path):
    """A DARE merge hands dare_masks the models' MT19937 states in one C-ordered array starting on a 64-byte line,
    624 words (39 lines) a row, so the threads twisting neighbouring rows share no line (numpy's own 16-byte
    alignment made them: false sharing); line_aligned_zeros gives such zeros for any shape and dtype."""
    for shape, dtype in (((4, 624), np.uint32), ((3, 5), np.float64), ((7,), np.uint8)):
        a = K.line_aligned_zeros(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and not a.any()
        assert a.ctypes.data % 64 == 0
    km, seen = K._mod(), []
    own = km.dare_masks

    def spy(mts, poss, thrs, masks):
        seen.append((mts.ctypes.data % 64, mts.strides, mts.flags.c_contiguous))
        return own(mts, poss, thrs, masks)

    monkeypatch.setattr(km, "dare_masks", spy)
    base, models = _tied_models()
    bs, ms = MemoryReader(base, name="base"), [MemoryReader(m, name=f"model{i}") for i, m in enumerate(models)]
    E.merge_to_checkpoint(bs, ms, E.make_plan("dare", 3, chunk_elems=512), 1.0, tmp_path / "o.safetensors")
    assert seen and set(seen) == {(0, (624 * 4, 4), True)}


@needs_numba
def test_compiled_loops_still_name_non_finite_tensors(tmp_path):
    base, models = _tied_models()
    models[1]["b"][700] = float("inf")  # float32 tensor, in the second chunk of 512
    models[2]["a"].view(-1)[40] = float("nan")  # bf16
    bs, ms = MemoryReader(base, name="base"), [MemoryReader(m, name=f"model{i}") for i, m in enumerate(models)]
    for name in ("task_arithmetic", "ties", "cabs", "magnitude") + ONE_PASS:
        with pytest.raises(BadInputError, match=r"model[12]: tensor '[ab]' holds 1 NaN/inf"):
            E.merge_to_checkpoint(bs, ms, E.make_plan(name, 3, chunk_elems=512), 1.0, tmp_path / "o.safetensors")
    assert list(tmp_path.iterdir()) == []
    big = {"w": torch.full((40,), 3e38).to(torch.bfloat16)}
    up = {"w": torch.linspace(3.1e38, 3.3e38, 40).to(torch.bfloat16)}  # unequal: a threshold keeps some
    for kernels in (True, False):
        for name in ONE_PASS:  # with the kernels, each one-pass loop writes (and counts) the output chunk itself
            n = 2  # one model would compile every top-k loop again for a count no other test needs
            with K.torch_only(not kernels), pytest.raises(RuntimeFailure, match="tensor 'w'.*not finite in bfloat16"):
                E.merge_to_checkpoint(MemoryReader(big), [MemoryReader(up)] * n, E.make_plan(name, n), 5.0,
                                      tmp_path / "o.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_without_numba_the_torch_path_runs(tmp_path, monkeypatch):
    """numba missing (the module not importable): every kernel declines and the merge still runs, same bytes."""
    base, models = _tied_models()
    plan = E.make_plan("ties", 3, densities=[0.3], chunk_elems=96)
    ref = _merge_bytes(tmp_path, "ref", base, models, plan, 1.0)[0]
    monkeypatch.setitem(K._state, "mod", None)
    monkeypatch.setitem(K._state, "tried", True)
    assert not K.available() and K.load_tau(torch.zeros(3), torch.zeros(3), torch.zeros(3)) is None
    assert _merge_bytes(tmp_path, "torch", base, models, plan, 1.0)[0] == ref
    code = "import icmltools.merge.engine, icmltools.merge.methods, sys; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # numba is imported on the first kernel call, not with the engine


@needs_numba
def test_kept_bits_are_counted_exactly_by_nibbles_and_by_histograms():
    """_count_bytes (the kept-model bits behind every overlap matrix) equals np.bincount: bytes below 16 through
    the word-wise nibble count (lengths around its 8-byte words and 255-word runs, unaligned starts, a run of one
    value), others through the four histograms; rows added to, not overwritten."""
    import numpy as np

    from icmltools.merge import _kernels_numba as km

    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 8, 9, 255 * 8 - 1, 255 * 8, 255 * 8 + 3, 4096, 70001):
        for top in (1, 2, 16, 17, 256):
            for off in (0, 3):
                a = rng.integers(0, top, n + off).astype(np.uint8)[off:]
                h = np.zeros((4, 256), np.int64)
                h[2, 5] = 7
                km._count_bytes(a, h)
                want = np.bincount(a, minlength=256)
                want[5] += 7
                assert (h.sum(axis=0) == want).all(), (n, top, off)
    a = np.full(300 * 8, 15, np.uint8)  # every lane's count at its most in each run of 255 words
    h = np.zeros((4, 256), np.int64)
    km._count_bytes(a, h)
    assert h.sum(axis=0)[15] == a.size and h.sum() == a.size


@needs_numba
@pytest.mark.parametrize("k", [1, 4, 5, 7])
@pytest.mark.parametrize("dare,band", [(False, False), (True, False), (False, True)])
def test_the_generated_span_loop_equals_pruning_rows_then_combining_them(k, dare, band):
    """The one-pass loops' generated per-model-count span (_fused_span) gives, bitwise, the block-by-block path:
    each model's task vector pruned in its own row by the same rule (top-k: |x| > t, or >= t where ties are kept,
    a model keeping none or all; with a band (Breadcrumbs), not also in the top: |x| > t2, or >= t2 where its
    ties are in the top; DARE: x / d where the mask keeps, a model with p = 0 as is), then _combine_block; model
    counts the file-level tests do not reach, both combinations, weighted and not, with ties at every threshold
    (counted per model and threshold, packed 16 bits a model) and a non-finite task vector counted."""
    import numba
    import numpy as np

    from icmltools.merge import _kernels_numba as km

    @numba.njit
    def fused(bs, rs, ms, tv, tf, dv, ws, consensus, normalize, o, pt, tv2, tf2):
        return km._fused_span(bs, rs, ms, tv, tf, dv, ws, consensus, normalize, o, pt, tv2, tf2, None, None, None,
                              np.empty((2, bs.shape[0]), np.uint32))

    rng = np.random.default_rng(k + 10 * dare + 100 * band)
    n = 3000
    base = (rng.integers(-40, 40, n) * 2.0 ** -8).astype(np.float32)
    raws = tuple((base + rng.integers(-6, 7, n) * 2.0 ** -9).astype(np.float32) for _ in range(k))
    raws[k - 1][17] = np.inf
    absx = [np.abs(r - base) for r in raws]
    tv = np.array([np.quantile(a, 0.6) for a in absx], np.float32)  # on a value: ties at every threshold
    tf = rng.random(k) < 0.5
    if not dare and k > 1:
        tv[0], tf[0] = np.inf, False  # keeps none
        tv[1] = -1.0  # keeps all
    tv2 = np.array([np.quantile(a, 0.9) for a in absx], np.float32) if band else None
    tf2 = (rng.random(k) < 0.5) if band else None
    if band and k > 1:
        tv2[0] = -1.0  # the whole tensor in the top: keeps none
    masks = (rng.random((k, n)) < 0.4).astype(np.uint8)
    dv = np.where(tf, 1.0, rng.choice([0.3, 0.5, 0.9], k)).astype(np.float32) if dare else np.ones(k, np.float32)
    rows = np.empty((k, n), np.float32)
    for i in range(k):
        x = (raws[i] - base).astype(np.float32)
        if dare:
            rows[i] = np.where(tf[i] | (masks[i] != 0), x / dv[i], np.float32(0))
        else:
            a = np.abs(x)
            keep = (a > tv[i]) | (tf[i] & (a == tv[i]))
            if band:
                keep &= ~((a > tv2[i]) | (tf2[i] & (a == tv2[i])))
            rows[i] = np.where(keep, x, np.float32(0))
    for weights in (np.ones(k, np.float32), rng.choice([0.5, -1.25, 2.0], k).astype(np.float32)):
        weighted = bool((weights != 1).any())
        for consensus in (False, True):
            o, pt = np.empty(n, np.float32), np.empty(n, np.uint8)
            got = fused(base, raws, tuple(masks) if dare else None, tv, tf, dv, weights, consensus, True, o, pt, tv2,
                        tf2)
            ref, rpt = np.empty(n, np.float32), np.empty(n, np.uint8)
            h4 = np.zeros((4, 256), np.int64)
            want = km._combine_block(rows, n, weights.astype(np.float64), weighted, consensus, True, ref, rpt, h4,
                                     np.empty((3, n), np.float32))
            assert got[1] == want[1] and got[0] != 0  # the inf of the last model flagged (its count: model by model)
            assert np.array_equal(o.view(np.uint32), ref.view(np.uint32)) and np.array_equal(pt, rpt)
            for packed, t in ((got[2], None if dare else tv), (got[3], tv2)):  # the ties, 16 bits a model
                counts = [km._unpack(packed, i) for i in range(k)]
                assert counts == ([0] * k if t is None else [int((absx[i] == t[i]).sum()) for i in range(k)])
    fin = tuple(np.where(np.isfinite(r), r, base) for r in raws)
    big = tuple(np.where(np.arange(n) == 3, np.float32(3e38), r) for r in fin)  # finite, but twice it is not
    masks[:, 3] = 1
    for consensus in (False, True):  # the flag: 0 when every task-vector element and result is finite
        o, pt = np.empty(n, np.float32), np.empty(n, np.uint8)
        top = None if tv2 is None else np.full(k, np.inf, np.float32)  # nothing in the top: the large values stay
        args = (tuple(masks) if dare else None, tv, tf, dv, np.full(k, 2.0, np.float32), consensus, True, o, pt, top,
                tf2)
        assert fused(base, fin, *args)[0] == 0 and fused(base, big, *args)[0] != 0


def test_ties_span_counts_each_of_eight_models_apart():
    """_ties_span's packed counts (16 bits a model, two models a word), exact for 8 models and up to 65535 ties
    a model in one span: model k has its |tau| at the threshold in its own count of positions."""
    km = K._mod()
    n = 65535
    rng = np.random.default_rng(3)
    base = rng.integers(-64, 64, n).astype(np.float32) / 4  # exact: x - base is exactly +-0.5 or 2
    want = [n, 0, 1, 2047, 40000, 65534, 12345, 3]
    tv = np.full(8, 0.5, np.float32)
    rs = []
    for c in want:
        x = base + np.float32(2.0)
        at = rng.permutation(n)[:c]
        x[at] = base[at] + np.where(rng.random(c) < 0.5, np.float32(0.5), np.float32(-0.5))
        assert (np.abs(x - base) == 0.5).sum() == c
        rs.append(x)
    got = km._ties_span(base, tuple(rs), tv)
    assert [km._unpack(got, k) for k in range(8)] == want


def test_borrowed_spans_view_their_parent_without_a_reference():
    """_span / _rowspan: a[lo:hi] and a[k, lo:hi] of contiguous arrays as views (same elements, writes reach the
    parent) whose meminfo is null, so the loops' spans run no atomic reference count; a plain slice shares its
    parent's meminfo (what the probe sees), and arrays that are not contiguous take the plain slice. _unref: a
    whole array (any layout) or a tuple's arrays borrowed the same way, None as it is."""
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    km = K._mod()

    @intrinsic
    def meminfo_of(typingctx, a):
        def codegen(context, builder, sig, args):
            mi = context.make_array(sig.args[0])(context, builder, args[0]).meminfo
            return builder.ptrtoint(mi, ir.IntType(64))
        return types.int64(a), codegen

    @njit
    def probe(x, m, s):
        v, r, w = km._span(x, 2, 5), km._rowspan(m, 1, 1, 3), x[2:5]
        v[0] = 7.0
        r[1] = 9.0
        sv, sr = km._span(s, 1, 3), km._rowspan(m.T, 0, 1, 3)
        return ((meminfo_of(v), meminfo_of(r), meminfo_of(w) == meminfo_of(x), meminfo_of(sv) == meminfo_of(s) != 0),
                v.copy(), r.copy(), sv.copy(), sr.copy())

    x = np.arange(10, dtype=np.float32)
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    (mv, mr, w_shares, sv_shares), v, r, sv, sr = probe(x, m, x[::2])
    assert mv == 0 and mr == 0 and w_shares and sv_shares
    assert x[2] == 7.0 and m[1, 2] == 9.0
    assert v.tolist() == [7.0, 3.0, 4.0] and r.tolist() == [5.0, 9.0]
    assert sv.tolist() == x[::2][1:3].tolist() and sr.tolist() == m.T[0, 1:3].tolist()

    @njit
    def whole(m, t, s):  # _unref: the same views (any layout; each array of a tuple), a null meminfo; None as is
        a, b = km._unref(m.T), km._unref(t)
        a[0, 1] = -1.0
        return (meminfo_of(a), meminfo_of(b[0]), meminfo_of(b[1]), km._unref(s) is None, a.strides[0] == m.strides[1]),\
            a.copy(), b[1].copy()

    (ma, mb0, mb1, none_kept, strides_kept), a, b1 = whole(m, (x, m), None)
    assert ma == mb0 == mb1 == 0 and none_kept and strides_kept
    assert m[1, 0] == -1.0 and a.tolist() == m.T.tolist() and b1.tolist() == m.tolist()


def test_pieces_stay_below_2_30_elements_so_their_counts_fit_32_bits():
    """_n_pieces / _piece: up to 8 pieces (none below 2^18 elements) that cover [0, n) in order, at block
    boundaries, more only where a piece would pass 2^30 elements (the loops count a piece in 32 bits)."""
    km = K._mod()
    for n in (1, 4095, 1 << 18, (1 << 21) + 5, 1 << 30, (1 << 33) - 1, 1 << 33, (1 << 33) + 12345, 1 << 36):
        T = km._n_pieces(n, 4096)
        assert T == max(1, min(8, n >> 18), -(-n >> 30))
        ends = [km._piece(n, t, T, 4096) for t in range(T)]
        assert ends[0][0] == 0 and ends[-1][1] == n and all(a[1] == b[0] for a, b in zip(ends, ends[1:]))
        assert all(lo % 4096 == 0 and hi - lo < 1 << 31 and (hi - lo <= (1 << 30) + 4096) for lo, hi in ends)
