"""CABS (icmltools.cabs): exact n:m counts, zero overlap, equality with re-typed official loops, chunking,
lambda 0, n = m; the demo; the command (file mode, mergekit configs, bad inputs)."""
from __future__ import annotations

import pytest
import torch

from icmltools.cabs import prune as P
from icmltools.cabs import stats as S


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _models(k=4, shape=(64, 96), dtype=torch.float32, seed=0):
    g = _g(seed)
    base = torch.randn(shape, generator=g).to(dtype)
    return base, [(base.float() + 0.1 * torch.randn(shape, generator=g)).to(dtype) for _ in range(k)]


# ------------------------------------------------------------------ re-typed official loops (test-only)


def official_mergekit_prune(tensor, n_val, m_val):
    """mergekit cabs.py `prune_n_m_structural` (authors' PR), re-typed: zero-pad to m, topk per row."""
    shape, flat = tensor.shape, tensor.flatten().clone()
    if n_val == m_val:
        return tensor.clone(), torch.ones_like(tensor, dtype=torch.bool)
    padding = (m_val - flat.numel() % m_val) % m_val
    if padding:
        flat = torch.cat((flat, torch.zeros(padding, dtype=tensor.dtype)))
    rows = flat.reshape(-1, m_val)
    _, idx = torch.topk(rows.abs(), k=n_val, dim=1)
    mask = torch.zeros_like(rows, dtype=torch.bool)
    mask.scatter_(1, idx, True)
    mask = mask.flatten()
    if padding:
        mask = mask[:-padding]
    mask = mask.reshape(shape)
    return tensor * mask, mask


def official_mergekit_merge(base, models, nms, weights):
    """mergekit CABSTask.execute, re-typed: accumulate in the base dtype, cumulative mask of picks."""
    acc = base.clone()
    cum = torch.zeros_like(base, dtype=torch.bool)
    for model, (n, m), w in zip(models, nms, weights):
        tv = model - base
        cand = tv * (~cum).to(tv.dtype)
        pruned, mask = official_mergekit_prune(cand, n, m)
        acc += w * pruned.to(acc.dtype)
        cum = torch.logical_or(cum, mask)
    return acc


def official_roberta_nm(param, n, m):
    """RoBERTa prune_task_vector.py `n_m_block_pruning`, re-typed: per block of m, skip the last partial."""
    param = param.clone()
    mask = torch.zeros_like(param)
    flat = param.flatten()
    for i in range(0, flat.size(0), m):
        block = flat[i:i + m]
        if block.size(0) < m:
            break
        idx = torch.topk(block.abs(), n, sorted=False)[1]
        mask.view(-1)[i:i + m].scatter_(0, idx, 1)
    return param * mask, mask


def official_roberta_topk(param, sparsity_level):
    """RoBERTa `topk_values_mask`, re-typed: keep |x| > sorted(|x|)[int(s * numel)]."""
    srt = torch.sort(param.flatten().abs(), descending=False)[0]
    thr = srt[int(sparsity_level * len(srt))]
    mask = (param.abs() > thr).float()
    return param * mask, mask


# ------------------------------------------------------------------ exact n:m


def test_exact_n_per_block():
    tau = torch.randn(64, 96, generator=_g())
    mask = P.nm_mask(tau, 3, 32)
    assert (mask.view(-1, 32).sum(1) == 3).all()
    # the kept ones are the block's 3 largest magnitudes
    a = tau.abs().view(-1, 32)
    kept_min = torch.where(mask.view(-1, 32), a, torch.full_like(a, float("inf"))).min(1).values
    dropped_max = torch.where(mask.view(-1, 32), torch.zeros_like(a), a).max(1).values
    assert (kept_min > dropped_max).all()


def test_tail_rules():
    tau = torch.randn(10, 7, generator=_g())   # 70 = 2 * 32 + 6
    pad = P.nm_mask(tau, 3, 32, tail="pad").reshape(-1)
    drop = P.nm_mask(tau, 3, 32, tail="drop").reshape(-1)
    assert [int(pad[:32].sum()), int(pad[32:64].sum()), int(pad[64:].sum())] == [3, 3, 3]
    assert [int(drop[:32].sum()), int(drop[32:64].sum()), int(drop[64:].sum())] == [3, 3, 0]
    # a tail shorter than n keeps all of it
    tiny = P.nm_mask(torch.randn(34, generator=_g(1)), 4, 32)
    assert int(tiny[32:].sum()) == 2 and int(tiny[:32].sum()) == 4


def test_conflict_aware_disjoint_and_counts():
    base, models = _models(4, (64, 96))
    taus = P.task_vectors(base, models)
    masks = P.cabs_masks(taus, [(8, 32)] * 4)
    stacked = torch.stack([m.reshape(-1) for m in masks]).sum(0)
    assert int(stacked.max()) == 1
    for mk in masks:
        assert (mk.view(-1, 32).sum(1) == 8).all()
    pruned = [P.prune(t, mk) for t, mk in zip(taus, masks)]
    ov = S.overlap_of(pruned)
    assert ov["max_pairwise"] == 0 and all(ov["counts"][i][i] == 8 * 64 * 96 // 32 for i in range(4))
    for nm, want in (((10, 32), [10, 10, 10, 2]), ((2, 4), [2, 2, 0, 0])):
        masks = P.cabs_masks(taus, [nm] * 4)
        m = nm[1]
        for mk, w in zip(masks, want):
            assert (mk.reshape(-1, m).sum(1) == w).all()
        assert P.overfull_warning([nm] * 4)
    assert P.overfull_warning([(4, 32)] * 4) is None


def test_bs_overlaps_and_ca_magnitude_disjoint():
    base, models = _models(4, (64, 96))
    taus = P.task_vectors(base, models)
    bs = P.bs_masks(taus, [(8, 32)] * 4)
    assert int(torch.stack([m.reshape(-1) for m in bs]).sum(0).max()) > 1   # BS alone overlaps
    ca = P.ca_magnitude_masks(taus, [0.25] * 4)
    assert int(torch.stack([m.reshape(-1) for m in ca]).sum(0).max()) == 1


# ------------------------------------------------------------------ official equivalence


@pytest.mark.parametrize("nm", [(3, 32), (4, 32), (10, 32), (2, 4)])
@pytest.mark.parametrize("shape", [(64, 96), (10, 7), (33, 65)])
def test_equals_mergekit_loop(nm, shape):
    base, models = _models(4, shape, seed=sum(shape) + nm[0])
    lams = [0.7, 1.1, 0.4, 0.9]
    ours, _ = P.merge_tensor("cabs", base, models, [nm] * 4, lams, tail="pad")
    ref = official_mergekit_merge(base, models, [nm] * 4, lams)
    assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))   # bitwise


@pytest.mark.parametrize("nm", [(3, 32), (8, 32), (2, 4)])
def test_equals_roberta_loop(nm):
    n, m = nm
    base, models = _models(2, (33, 65), seed=7)
    taus = P.task_vectors(base, models)
    p1, mask1 = official_roberta_nm(taus[0], n, m)
    p2, _ = official_roberta_nm(taus[1] * (1 - mask1), n, m)
    masks = P.cabs_masks(taus, [nm, nm], tail="drop")
    assert torch.equal(P.prune(taus[0], masks[0]), p1)
    assert torch.equal(P.prune(taus[1], masks[1]), p2)
    # model_merge.add_model_params: base + (lamb1 * p1 + lamb2 * p2); disjoint, so equal to the ordered sum
    ours, _ = P.merge_tensor("cabs", base, models, [nm, nm], [0.6, 0.9], tail="drop")
    assert torch.equal(ours.view(torch.int32), (base + (p1 * 0.6 + p2 * 0.9)).view(torch.int32))


def test_ca_magnitude_equals_roberta_branch():
    base, models = _models(2, (40, 50), seed=3)
    taus = P.task_vectors(base, models)
    d = 0.2
    p1, mask1 = official_roberta_topk(taus[0], 1 - d)
    p2, _ = official_roberta_topk(taus[1] * (1 - mask1), 1 - d)
    m1, m2 = P.ca_magnitude_masks(taus, [d, d])
    assert torch.equal(P.prune(taus[0], m1), p1) and torch.equal(P.prune(taus[1], m2), p2)


# ------------------------------------------------------------------ chunking, lambda 0, n = m


@pytest.mark.parametrize("method", ["cabs", "bs"])
@pytest.mark.parametrize("tail", ["pad", "drop"])
def test_chunked_equals_unchunked(method, tail):
    base, models = _models(4, (97, 53), seed=11)
    nms = [(4, 32), (3, 16), (4, 32), (1, 8)]
    lams = [1.0, 0.5, 0.8, 1.2]
    full, fm = P.merge_tensor(method, base, models, nms, lams, tail)
    chunked, cm = P.merge_tensor(method, base, models, nms, lams, tail, chunk_elems=1024)
    assert P.aligned_chunk(1024, [32, 16, 8]) == 1024 and P.aligned_chunk(100, [32, 24]) == 96
    assert torch.equal(full, chunked)
    assert all(torch.equal(a, b) for a, b in zip(fm, cm))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["cabs", "bs", "ca_magnitude"])
def test_lambda_zero_returns_base_bitwise(dtype, method):
    base, models = _models(3, (16, 64), dtype)
    base.view(-1)[:5] = -0.0
    out, _ = P.merge_tensor(method, base, models, [(4, 32)] * 3, [0.0, 0.0, 0.0])
    assert out.dtype == dtype
    assert torch.equal(out.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       base.view(torch.int16 if dtype != torch.float32 else torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_n_equals_m_one_model_is_task_arithmetic(dtype):
    base, (model,) = _models(1, (33, 65), dtype)
    out, _ = P.merge_tensor("cabs", base, [model], [(32, 32)], [0.7])
    ta = (base.float() + 0.7 * (model.float() - base.float())).to(dtype)
    assert torch.equal(out, ta)


def test_nm_settings():
    assert P.resolve_nms(4) == [(4, 32)] * 4
    assert P.resolve_nms(20) == [(1, 32)] * 20
    assert P.resolve_nms(3, "8:32", ["1=2:4"]) == [(8, 32), (2, 4), (8, 32)]
    from icmltools.core.errors import BadInputError

    for bad in ("33:32", "0:32", "a:b", "4"):
        with pytest.raises(BadInputError):
            P.parse_nm(bad)
    with pytest.raises(BadInputError):
        P.resolve_nms(2, "4:32", ["2=4:32"])
