"""CABS (icmltools.cabs): exact n:m counts, zero overlap, equality with re-typed official loops, chunking,
lambda 0, n = m; the demo; the command (file mode, mergekit configs, bad inputs)."""
from __future__ import annotations

import re

import pytest
import torch

from icmltools.cabs import prune as P
from icmltools.cabs import stats as S
from icmltools.core.errors import BadInputError


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
    # the streamed count of short blocks (from the topk values) equals a count on the masks
    taken = torch.zeros(taus[0].shape, dtype=torch.bool)
    for tau in taus:
        box = [0]
        mk = P.nm_mask(tau, 10, 32, taken, "pad", box)
        taken |= mk
        assert box[0] == S.short_blocks(mk, 10, 32, "pad")
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
    # and on the engine: CABS 32:32 == the engine's task_arithmetic, same weight
    from icmltools.cabs import api
    from icmltools.merge import engine as E

    outs = [E.merge_state_dicts({"w": base}, [{"w": model}], plan, lam=1.0, sign=1)[0]["w"]
            for plan in (api.engine_plan("cabs", 1, [(32, 32)], weights=[0.7]),
                         api.engine_plan("task_arithmetic", 1, [(32, 32)], weights=[0.7]))]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], ta)


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


# ------------------------------------------------------------------ the engine's method classes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", ["cabs", "bs", "ca_magnitude"])
@pytest.mark.parametrize("chunk", [None, 1024])
def test_engine_classes_equal_the_kernels(dtype, method, chunk):
    from icmltools.cabs import api
    from icmltools.merge import engine as E

    base, models = _models(4, (97, 53), dtype, seed=5)
    nms = [(4, 32), (3, 16), (4, 32), (1, 8)]
    lams = [1.0, 0.5, 0.0, 1.2]   # a zero lambda keeps its place in the order
    plan = api.engine_plan(method, 4, nms, weights=lams, chunk_elems=chunk)
    out, stats = E.merge_state_dicts({"w": base}, [{"w": m} for m in models], plan, lam=1.0, sign=1)
    ref, masks = P.merge_tensor(method, base, models, nms, lams)
    assert torch.equal(out["w"].view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       ref.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    s = stats.summary(extended=True)
    taus = P.task_vectors(base, models)
    want = S.overlap_of([P.prune(t, m) for t, m in zip(taus, masks)])
    assert s["overlap"]["counts"] == want["counts"]
    if method != "bs":
        assert s["overlap"]["max_pairwise"] == 0


def test_registered_methods_work_with_engine_defaults():
    """The registry's instances run from a bare make_plan (CABS/BS: the default n:m for K models; CA-magnitude:
    the engine's default density), as any engine caller would use them."""
    from icmltools.cabs import methods as CM  # noqa: F401  (registers cabs, bs, ca_magnitude)
    from icmltools.merge import engine as E

    base, models = _models(4, (16, 64))
    out, stats = E.merge_state_dicts({"w": base}, [{"w": m} for m in models], E.make_plan("cabs", 4), lam=1.0, sign=1)
    ref, _ = P.merge_tensor("cabs", base, models, [(4, 32)] * 4, [1.0] * 4)
    assert torch.equal(out["w"], ref) and stats.summary(extended=True)["overlap"]["max_pairwise"] == 0
    for name in ("bs", "ca_magnitude"):
        E.merge_state_dicts({"w": base}, [{"w": m} for m in models], E.make_plan(name, 4), lam=1.0, sign=1)
    with pytest.raises(Exception, match="n:m needs"):
        E.make_plan("cabs", 2, model_options=[{"n": 5, "m": 4}, {}])


@pytest.mark.parametrize("method", ["cabs", "ca_magnitude"])
def test_engine_all_zero_lambdas_return_base_bytes(method, tmp_path):
    from icmltools.cabs import api
    from icmltools.merge import engine as E
    from icmltools.taskvec import MemoryReader, open_checkpoint

    base, models = _models(2, (16, 64), torch.bfloat16)
    base.view(-1)[:3] = -0.0
    plan = api.engine_plan(method, 2, [(4, 32)] * 2, weights=[0.0, 0.0])
    E.merge_to_checkpoint(MemoryReader({"w": base}), [MemoryReader({"w": m}) for m in models], plan, 1.0,
                          tmp_path / "o.safetensors", sign=1)
    out = open_checkpoint(tmp_path / "o.safetensors").get("w")
    assert torch.equal(out.view(torch.int16), base.view(torch.int16))


# ------------------------------------------------------------------ the command: files and configs


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """base + 3 models (safetensors, torch, HF sharded folder) with a float32, a bfloat16, an int tensor."""
    from icmltools.taskvec import write_state_dict

    d = tmp_path_factory.mktemp("cabs_ckpts")
    g = _g(9)
    base = {"a.weight": torch.randn(64, 96, generator=g), "a.bias": torch.randn(70, generator=g),
            "h.weight": torch.randn(33, 65, generator=g).to(torch.bfloat16), "steps": torch.tensor([3])}
    models = [{k: (v.float() + 0.1 * torch.randn(v.shape, generator=g)).to(v.dtype) if v.is_floating_point() else v
               for k, v in base.items()} for _ in range(3)]
    for name, sd in [("base", base)] + [(f"m{i}", m) for i, m in enumerate(models)]:
        write_state_dict(sd, d / f"{name}.safetensors")
        write_state_dict(sd, d / f"{name}.pt", fmt="torch")
        write_state_dict(sd, d / f"{name}_hf", fmt="hf_safetensors", shards=[["a.weight"], ["a.bias", "h.weight", "steps"]])
    bad = dict(base, **{"a.weight": torch.randn(64, 95, generator=g)})
    write_state_dict(bad, d / "shape.safetensors")
    nan = {k: v.clone() for k, v in models[1].items()}
    nan["a.bias"][5] = float("inf")
    write_state_dict(nan, d / "nan.safetensors")
    raw = (d / "m2.safetensors").read_bytes()
    (d / "trunc.safetensors").write_bytes(raw[: len(raw) // 2])
    bf = dict(models[2], **{"a.bias": models[2]["a.bias"].to(torch.bfloat16)})
    write_state_dict(bf, d / "bf16.safetensors")

    class _Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"a.weight": _Evil()}, d / "evil.pt")
    (d / "unknown.yml").write_text("merge_method: slerp\nbase_model: base.safetensors\nmodels: [{model: m0.safetensors}]\n")
    (d / "dtype.yml").write_text("merge_method: ties\nbase_model: base.safetensors\nmodels: [{model: m0.safetensors}]\n"
                                 "dtype: int8\n")
    (d / "field.yml").write_text("merge_method: ties\nbase_model: base.safetensors\nmodels: [{model: m0.safetensors}]\n"
                                 "chat_template: chatml\n")
    (d / "param.yml").write_text("merge_method: cabs\nbase_model: base.safetensors\n"
                                 "models: [{model: m0.safetensors, parameters: {density: 0.5}}]\n")
    return d, base, models


def _cli(args, tmp_path, monkeypatch, ckpt_dir):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    monkeypatch.chdir(tmp_path)
    if not (tmp_path / "in").exists():
        (tmp_path / "in").symlink_to(ckpt_dir)
    return CliRunner().invoke(cli, ["cabs-merge", "-q", "--threads", "1", *args])


def _load(path):
    from icmltools.taskvec import open_checkpoint

    r = open_checkpoint(path)
    return {k: r.get(k) for k in r.keys()}


@pytest.mark.parametrize("fmt,suffix", [("safetensors", ".safetensors"), ("torch", ".pt"), ("hf", "_hf")])
def test_cli_file_merge_matches_kernels(fmt, suffix, ckpts, tmp_path, monkeypatch):
    import json

    d, base, models = ckpts
    ms = ",".join(f"in/m{i}{suffix}" for i in (2, 0, 1))   # the order given is the pruning order
    res = _cli(["--base", f"in/base{suffix}", "--models", ms, "--nm", "8:32", "--nm-for", "1=4:16",
                "--lam", "0.6,0.4,0.5", "--chunk-elems", "1000", "--out", "run"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    out = _load(r["output"])
    order = [models[2], models[0], models[1]]
    for k, v in base.items():
        if v.is_floating_point():
            ref, _ = P.merge_tensor("cabs", v, [m[k] for m in order], [(8, 32), (4, 16), (8, 32)], [0.6, 0.4, 0.5])
            assert torch.equal(out[k], ref) and out[k].dtype == v.dtype, k
        else:
            assert torch.equal(out[k], v)
    assert r["overlap"]["max_pairwise"] == 0 and r["skipped_non_float"] == ["steps"]
    assert [m["n"] for m in r["models"]] == [8, 4, 8] and r["order"][0].endswith(f"m2{suffix}")
    assert r["output_format"] == {"hf": "hf_safetensors"}.get(fmt, fmt)
    assert all(t["min"] <= t["max"] for t in r["tensor_density"])


def test_cli_repeated_lambdas_stay_per_model(ckpts, tmp_path, monkeypatch):
    """--lam 0.5,0.5,0.2 is three lambdas (a de-duplicating list would have made it two)."""
    import json

    d, _, _ = ckpts
    res = _cli([*B, "--models", "in/m0.safetensors,in/m1.safetensors,in/m2.safetensors", "--lam", "0.5,0.5,0.2",
                "--out", "l"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    assert [m["lam"] for m in json.loads(res.stdout)["result"]["models"]] == [0.5, 0.5, 0.2]


def test_cli_config_equals_flags(ckpts, tmp_path, monkeypatch):
    import json

    d, _, _ = ckpts
    (tmp_path / "mk.yml").write_text(
        "models:\n  - model: in/m0.safetensors\n    parameters: {weight: 0.6, n_m_ratio: [8, 32]}\n"
        "  - model: in/m1.safetensors\n    parameters: {weight: 0.4, n_m_ratio: [4, 32]}\n"
        "merge_method: cabs\nbase_model: in/base.safetensors\n"
        "parameters: {pruning_order: [in/m1.safetensors, in/m0.safetensors]}\ndtype: float32\n")
    res = _cli(["--config", "mk.yml", "--out", "a"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    a = json.loads(res.stdout)["result"]
    res = _cli(["--base", "in/base.safetensors", "-m", "in/m1.safetensors", "-m", "in/m0.safetensors",
                "--nm", "4:32", "--nm-for", "1=8:32", "--lam", "0.4,0.6", "--dtype", "float32", "--out", "b"],
               tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    b = json.loads(res.stdout)["result"]
    assert a["warnings"] == [] and a["output_dtype"] == b["output_dtype"] == "float32"   # the config's dtype: float32
    fa, fb = _load(a["output"]), _load(b["output"])
    assert fa["h.weight"].dtype == torch.float32 and fa["steps"].dtype == torch.int64   # the bf16 tensor written as f32
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


def _ties_yml(params: str = "normalize: true") -> str:
    """test_cli_config_ties_runs's mergekit file (the base listed among the models; dtype and out_dtype both set),
    with `params` as its top-level parameters."""
    return ("models:\n  - model: in/base.safetensors\n  - model: in/m0.safetensors\n"
            "    parameters: {weight: 1.0, density: 0.5}\n  - model: in/m1.safetensors\n"
            "    parameters: {weight: 0.5, density: 0.5}\n"
            f"merge_method: ties\nbase_model: in/base.safetensors\nparameters: {{{params}}}\n"
            "dtype: float32\nout_dtype: torch.bfloat16\n")


TIES_FLAGS = ["--exclude", "h.*", "--exclude", "lm_head.*"]


def test_cli_config_ties_runs(ckpts, tmp_path, monkeypatch):
    import json

    d, _, _ = ckpts
    (tmp_path / "t.yml").write_text(_ties_yml())   # mergekit writes out_dtype when both are set
    res = _cli(["--config", "t.yml", *TIES_FLAGS, "--out", "t"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    assert r["method"] == "ties" and [m["density"] for m in r["models"]] == [0.5, 0.5]
    assert r["excluded"] == ["h.weight"]
    assert r["warnings"] == ["exclude glob 'lm_head.*' matches no tensor name of in/base.safetensors"]
    out = _load(r["output"])
    assert r["output_dtype"] == "bfloat16" and out["a.weight"].dtype == torch.bfloat16 and out["steps"].dtype == torch.int64
    assert r["overlap"]["max_pairwise"] > 0


def test_cli_config_int8_mask_changes_nothing(ckpts, tmp_path, monkeypatch):
    """mergekit's examples/ties.yml (and many published configs) set `int8_mask: true`: the dtype of its sign mask
    (-1, 0, 1 are exact in int8 and in the weights' dtype), so the bytes are those of the same file with false or
    without it; a value that is not a boolean is refused (normalize's too). test_cli_config_ties_runs's file and
    flags: the same compiled loops (with dare_ties and no out_dtype this test compiled its own, 30 s of a clean-clone
    run)."""
    import json
    from pathlib import Path

    d, _, _ = ckpts
    outs = []
    for i, extra in enumerate(["", ", int8_mask: true", ", int8_mask: false"]):
        (tmp_path / f"t{i}.yml").write_text(_ties_yml("normalize: true" + extra))
        res = _cli(["--config", f"t{i}.yml", *TIES_FLAGS, "--out", f"o{i}"], tmp_path, monkeypatch, d)
        assert res.exit_code == 0, res.stderr
        r = json.loads(res.stdout)["result"]
        assert r["method"] == "ties" and r["excluded"] == ["h.weight"]
        outs.append(Path(r["output"]).read_bytes())
    assert outs[0] == outs[1] == outs[2]
    (tmp_path / "b.yml").write_text("merge_method: ties\nbase_model: in/base.safetensors\n"
                                    "models: [{model: in/m0.safetensors, parameters: {weight: 1, density: 0.5}}]\n"
                                    "parameters: {int8_mask: 1}\n")
    res = _cli(["--config", "b.yml", "--out", "b"], tmp_path, monkeypatch, d)
    assert res.exit_code == 2 and "parameters.int8_mask: expected true or false, got 1" in res.stderr
    (tmp_path / "n.yml").write_text(_ties_yml('normalize: "no"'))   # a string would have been truthy: normalized
    res = _cli(["--config", "n.yml", "--out", "n"], tmp_path, monkeypatch, d)
    assert res.exit_code == 2 and "parameters.normalize: expected true or false, got 'no'" in res.stderr


def test_mergekit_settings_evaluate_as_mergekit():
    """mergekit's evaluate_setting (config.py) and 0.1.5's planner's layer position t (plan.py), exact small cases:
    a gradient is linear between its neighbouring values, conditions give their first match (unset or "*"
    matches every name), none matching gives None (the next level applies)."""
    from icmltools.cabs.mkconfig import evaluate, layer_positions

    g = ("gradient", (0.25, 1.0))
    assert [evaluate(g, "x", t) for t in (0.0, 0.5, 1.0)] == [0.25, 0.625, 1.0]
    tri = ("gradient", (0.0, 1.0, 0.0))
    assert [evaluate(tri, "x", t) for t in (0.0, 0.25, 0.5, 0.75, 1.0)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    assert evaluate(("gradient", (0.5,)), "x", 0.7) == 0.5 and evaluate(0.3, "x", 0.7) == 0.3
    conds = ("conds", (("self_attn", 0.5), ("mlp", g)))
    assert evaluate(conds, "l.3.self_attn.q.weight", 1.0) == 0.5 and evaluate(conds, "l.3.mlp.up", 0.5) == 0.625
    assert evaluate(conds, "norm.weight", 0.0) is None
    assert evaluate(("conds", (("mlp", 0.5), (None, 0.125))), "norm.weight", 0.0) == 0.125
    llama = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"] + \
        [f"model.layers.{i}.{p}" for i in range(5) for p in ("mlp.up_proj.weight", "input_layernorm.weight")]
    t = layer_positions(llama)
    assert [t(f"model.layers.{i}.mlp.up_proj.weight") for i in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert (t("model.embed_tokens.weight"), t("model.norm.weight"), t("lm_head.weight")) == (0.0, 0.0, 0.0)  # 0.1.5
    gpt2 = layer_positions(["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
                            "transformer.h.1.attn.c_attn.weight", "transformer.h.2.mlp.c_fc.weight"])
    assert [gpt2(f"transformer.h.{i}.attn.c_attn.weight") for i in (0, 1)] == [0.0, 0.5]
    assert layer_positions(["layers.0.w"])("layers.0.w") == 1.0   # one layer: mergekit's t = 1


@pytest.fixture(scope="module")
def layered(tmp_path_factory):
    """A three-layer Llama-named base and two fine-tuned models (float32 safetensors)."""
    from icmltools.taskvec import write_state_dict

    d = tmp_path_factory.mktemp("cabs_layered")
    g = _g(4)
    base = {"model.embed_tokens.weight": torch.randn(48, 16, generator=g),
            "model.norm.weight": torch.randn(16, generator=g), "lm_head.weight": torch.randn(48, 16, generator=g)}
    for i in range(3):
        base[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn(16, 16, generator=g)
        base[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(40, 16, generator=g)
    models = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(2)]
    for name, sd in [("base", base)] + [(f"m{i}", m) for i, m in enumerate(models)]:
        write_state_dict(sd, d / f"{name}.safetensors")
    return d, base, models


PER_TENSOR_YML = """merge_method: ties
base_model: in/base.safetensors
models:
  - model: in/m0.safetensors
    parameters:
      weight: [{filter: mlp, value: 0.5}, {value: [0.25, 1.0]}]
      density: 0.5
  - model: in/m1.safetensors
    parameters:
      weight: 0.75
      density: [{filter: self_attn, value: [0.25, 0.75]}]
parameters: {density: 0.625, normalize: true}
dtype: float32
"""


def test_cli_config_per_tensor_filters_and_gradients(layered, tmp_path, monkeypatch):
    """mergekit's per-tensor settings: each tensor of the output is the plain TIES merge with the weights and
    densities that mergekit's lookup gives it (written out by hand here: layer i of 3 at t = i / 2; embeddings,
    norm and lm_head at t = 0, as mergekit 0.1.5; model 1's density falls back to the top-level 0.625 where its
    only filter does not match)."""
    import json

    from icmltools.merge import engine as E

    d, base, models = layered
    (tmp_path / "c.yml").write_text(PER_TENSOR_YML)
    res = _cli(["--config", "c.yml", "--out", "o"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    out = _load(r["output"])
    grad = {0: 0.25, 1: 0.625, 2: 1.0}   # [0.25, 1.0] at t = 0, 1/2, 1
    for name in base:
        layer = int(name.split(".")[2]) if ".layers." in name else 0
        w = [0.5 if "mlp" in name else grad[layer], 0.75]
        dens = [0.5, {0: 0.25, 1: 0.5, 2: 0.75}[layer] if "self_attn" in name else 0.625]
        plan = E.make_plan("ties", 2, weights=w, densities=dens, options={"normalize": True})
        ref, _ = E.merge_state_dicts({name: base[name]}, [{name: m[name]} for m in models], plan)
        assert torch.equal(out[name], ref[name]), name
    assert [(m["lam"], m["lam_range"], m["density_range"]) for m in r["models"]] == \
        [(None, [0.25, 1.0], [0.5, 0.5]), (None, [0.75, 0.75], [0.25, 0.75])]


def test_cli_config_normalize_as_mergekit(layered, tmp_path, monkeypatch):
    """`normalize: true` on task_arithmetic divides the weighted sum by the sum of the weights (mergekit's
    divisor without a consensus; it used to be ignored), written to the file by the one-pass path. Unset, normalize
    is mergekit 0.1.5's default: true for ties only, so not for dare_ties (our own dare_ties' default is true) nor
    breadcrumbs_ties (those two read as plans: their merges are the engine's, tested there; a run of each here
    compiled loops of its own, 27 s of a cold cache)."""
    import json

    from icmltools.cabs import api

    d, base, models = layered
    yml = ("merge_method: METHOD\nbase_model: in/base.safetensors\nmodels:\n"
           "  - {model: in/m0.safetensors, parameters: {weight: 0.5}}\n"
           "  - {model: in/m1.safetensors, parameters: {weight: 0.75}}\n")
    (tmp_path / "ta.yml").write_text(yml.replace("METHOD", "task_arithmetic") + "parameters: {normalize: true}\n")
    res = _cli(["--config", "ta.yml", "--out", "ta"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    out = _load(json.loads(res.stdout)["result"]["output"])
    for k, b in base.items():
        tau = (models[0][k] - b) * 0.5 + (models[1][k] - b) * 0.75
        assert torch.equal(out[k], b + tau / torch.tensor([0.5, 0.75]).view(-1, 1).sum(0)), k
    for method, normalize in (("ties", True), ("dare_ties", False), ("breadcrumbs_ties", False),
                              ("task_arithmetic", False), ("dare_linear", False), ("breadcrumbs", False)):
        (tmp_path / f"{method}.yml").write_text(yml.replace("METHOD", method))
        plan = api.prepare_config(tmp_path / f"{method}.yml").plan
        assert plan.options["normalize"] is normalize, method
        # mergekit's sign election: a weighted sum of 0 elects + (ours by default: no sign, the paper's)
        assert plan.options.get("elect_zero") == ("plus" if method.endswith("ties") else None), method


def test_config_rescale_as_mergekit(layered, tmp_path, monkeypatch):
    """`rescale`, a parameter of every mergekit GTA method: DARE's (default true; ours divides by the density) can
    be false, the drop alone (it was refused; the merge itself: test_merge_engine); the other methods' false (their
    default) is accepted, their true (mergekit's L1-norm match after the trim) refused naming it."""
    from icmltools.cabs import api

    d, _, _ = layered
    yml = ("merge_method: METHOD\nbase_model: in/base.safetensors\nmodels:\n"
           "  - {model: in/m0.safetensors, parameters: {weight: 0.5, density: 0.5}}\nparameters: {rescale: FLAG}\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").symlink_to(d)
    for method, flag, want in (("dare_linear", "false", False), ("dare_ties", "false", False),
                               ("dare_ties", "true", True), ("ties", "false", None),
                               ("breadcrumbs_ties", "false", None)):
        (tmp_path / "c.yml").write_text(yml.replace("METHOD", method).replace("FLAG", flag))
        assert api.prepare_config("c.yml").plan.options.get("rescale") is want, (method, flag)
    (tmp_path / "c.yml").write_text(yml.replace("METHOD", "dare_linear").replace("parameters: {rescale: FLAG}\n", ""))
    assert api.prepare_config("c.yml").plan.options["rescale"] is True
    (tmp_path / "t.yml").write_text(yml.replace("METHOD", "ties").replace("FLAG", "true"))
    res = _cli(["--config", "t.yml", "--out", "t"], tmp_path, monkeypatch, d)
    assert res.exit_code == 2 and "parameters.rescale: true is not supported for ties" in res.stderr, res.stderr


def test_cli_config_lambda_scales_the_merged_vector(layered, tmp_path, monkeypatch):
    """mergekit's `lambda`: theta_0 + lambda * the (normalized) merged vector; refused with --lam-grid (the grid is
    that scale) and when it is not a number."""
    import json

    from icmltools.merge import engine as E

    d, base, models = layered
    yml = ("merge_method: ties\nbase_model: in/base.safetensors\nmodels:\n"
           "  - {model: in/m0.safetensors, parameters: {weight: 0.5, density: 0.5}}\n"
           "  - {model: in/m1.safetensors, parameters: {weight: 0.75, density: 0.5}}\n"
           "parameters: {lambda: LAM}\n")
    (tmp_path / "l.yml").write_text(yml.replace("LAM", "0.5"))
    res = _cli(["--config", "l.yml", "--out", "l"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    plan = E.make_plan("ties", 2, weights=[0.5, 0.75], densities=[0.5], options={"normalize": True})
    ref, _ = E.merge_state_dicts(base, models, plan, lam=0.5)
    out = _load(r["output"])
    assert r["scale"] == 0.5 and all(torch.equal(out[k], ref[k]) for k in base)
    res = _cli(["--config", "l.yml", "--lam-grid", "0.5,1", "--eval-cmd", "true", "--out", "g"], tmp_path,
               monkeypatch, d)
    assert res.exit_code == 2 and "parameters.lambda is the global scale --lam-grid searches" in res.stderr
    (tmp_path / "s.yml").write_text(yml.replace("LAM", "[0.5, 1.0]"))
    res = _cli(["--config", "s.yml", "--out", "s"], tmp_path, monkeypatch, d)
    assert res.exit_code == 2 and "parameters.lambda: expected a finite number, got [0.5, 1.0]" in res.stderr


def _vocab_json(n: int, swap: bool = False) -> str:
    """A word-level tokenizer.json of n tokens (ids 0..n-1; `swap`: two ids exchanged)."""
    import json

    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, n)}}
    if swap:
        vocab["t1"], vocab["t2"] = 2, 1
    return json.dumps({"version": "1.0", "added_tokens": [{"id": 0, "content": "<unk>", "special": True}],
                       "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}})


@pytest.fixture(scope="module")
def layered_hf(layered):
    """The layered checkpoints as Hugging Face folders with config.json (vocab_size 48, the embeddings' rows) and
    one tokenizer.json; m1x: m1 with two token ids exchanged."""
    import json
    import shutil

    from icmltools.taskvec import write_state_dict

    d, base, models = layered
    for name, sd in [("base", base)] + [(f"m{i}", m) for i, m in enumerate(models)]:
        write_state_dict(sd, d / f"{name}_hf", fmt="hf_safetensors")
        (d / f"{name}_hf" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 48}))
        (d / f"{name}_hf" / "tokenizer.json").write_text(_vocab_json(48))
    shutil.copytree(d / "m1_hf", d / "m1x_hf")
    (d / "m1x_hf" / "tokenizer.json").write_text(_vocab_json(48, swap=True))
    return d, base, models


TOK_YML = ("merge_method: ties\nbase_model: in/base_hf\nmodels:\n"
           "  - {model: in/m0_hf, parameters: {weight: 0.5, density: 0.5}}\n"
           "  - {model: in/M1, parameters: {weight: 0.75, density: 0.5}}\n")


def test_cli_config_tokenizer_source_with_one_vocabulary(layered_hf, tmp_path, monkeypatch):
    """tokenizer_source base / union where every vocabulary is the base's (ids 0..V-1, V = vocab_size): mergekit's
    vocabulary permutation is the identity, so the output is the merge without it (checked against mergekit 0.1.5 in
    benchmarks/mergekit_parity.py); the base's tokenizer goes with the output."""
    import json
    from pathlib import Path

    d, _, _ = layered_hf
    outs = {}
    for src in ("", "base", "union"):
        extra = f"tokenizer_source: {src}\n" if src else ""
        (tmp_path / f"t{src}.yml").write_text(TOK_YML.replace("M1", "m1_hf") + extra)
        res = _cli(["--config", f"t{src}.yml", "--out", f"o{src}"], tmp_path, monkeypatch, d)
        assert res.exit_code == 0, res.stderr
        r = json.loads(res.stdout)["result"]
        assert r["config"].get("tokenizer_source") == (src or None)
        outs[src] = _load(r["output"])
        assert (Path(r["output"]) / "tokenizer.json").read_text() == (d / "base_hf" / "tokenizer.json").read_text()
    assert all(torch.equal(outs[s][k], outs[""][k]) for s in ("base", "union") for k in outs[""])


@pytest.mark.parametrize("edit,msg", [
    (lambda y: y.replace("M1", "m1x_hf"), "tokenizer_source: in/m1x_hf's vocabulary is not the base's (e.g. "
                                          "[('t1', 1), ('t1', 2), ('t2', 1)]); mergekit would permute"),
    (lambda y: y.replace("M1", "m1_hf").replace("_hf", ".safetensors"), "in/base.safetensors has no tokenizer.json"),
    (lambda y: y.replace("M1", "m1_hf").replace("tokenizer_source: base", "tokenizer_source: in/m0_hf"),
     "tokenizer_source: 'in/m0_hf' is not supported (base or union"),
])
def test_cli_config_tokenizer_source_refused(edit, msg, layered_hf, tmp_path, monkeypatch):
    d, _, _ = layered_hf
    (tmp_path / "t.yml").write_text(edit(TOK_YML + "tokenizer_source: base\n"))
    res = _cli(["--config", "t.yml", "--out", "t"], tmp_path, monkeypatch, d)
    assert res.exit_code == 2 and msg in res.stderr, res.stderr
    assert not (tmp_path / "t").exists()


def test_cli_config_tokenizer_source_padded_embeddings_refused(layered_hf, tmp_path, monkeypatch):
    """vocab_size (the embeddings' rows) above the vocabulary's length: mergekit writes len(vocab) rows."""
    import json
    import shutil

    d, _, _ = layered_hf
    shutil.copytree(d / "base_hf", tmp_path / "pb")
    (tmp_path / "pb" / "tokenizer.json").write_text(_vocab_json(40))
    (tmp_path / "t.yml").write_text(TOK_YML.replace("M1", "m1_hf").replace("in/base_hf", "pb")
                                    + "tokenizer_source: base\n")
    res = _cli(["--config", "t.yml", "--out", "t"], tmp_path, monkeypatch, d)
    assert res.exit_code == 2 and "pb's vocabulary has 40 tokens (ids 0..39) for vocab_size 48" in res.stderr
    assert json.loads((tmp_path / "pb" / "config.json").read_text())["vocab_size"] == 48


@pytest.mark.parametrize("weight,msg", [
    ("{filter: mlp, value: 0.5}", "models[0].weight: a condition goes in a list"),
    ("[{filter: mlp, value: 0.5}, 0.25]", "models[0].weight[1]: expected {filter: ..., value: ...}"),
    ("[]", "models[0].weight: an empty list"),
    ("[{filter: 3, value: 0.5}]", "models[0].weight[0].filter: expected a string"),
    ("[{filter: mlp}]", "models[0].weight[0]: no value"),
    ("[{filter: mlp, value: 0.5, scale: 2}]", "models[0].weight[0]: scale not supported"),
    ("[0.5, high]", "models[0].weight[1]: expected a finite number, got 'high'"),
    ("[0.5, .nan]", "models[0].weight[1]: expected a finite number, got nan"),
])
def test_config_bad_per_tensor_settings(weight, msg, tmp_path):
    from icmltools.cabs import mkconfig

    p = tmp_path / "c.yml"
    p.write_text(f"merge_method: ties\nbase_model: b\nmodels: [{{model: m, parameters: {{weight: {weight}}}}}]\n")
    with pytest.raises(BadInputError, match=re.escape(msg)):
        mkconfig.read_config(p)


def test_cli_config_density_zero_leaves_the_model_out(layered, tmp_path, monkeypatch):
    """A density of 0 (written, or where a gradient reaches it) leaves that model out of the tensor, as mergekit's
    sparsifiers keep nothing of it (it was refused); a value outside [0, 1] is refused naming it, nothing written."""
    import json

    from icmltools.merge import engine as E

    d, base, models = layered
    (tmp_path / "z.yml").write_text(PER_TENSOR_YML.replace("value: [0.25, 0.75]", "value: [0.0, 0.75]"))
    res = _cli(["--config", "z.yml", "--out", "z"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    name = "model.layers.0.self_attn.q_proj.weight"   # model 1 at density 0; TIES' divisor counts model 0 alone
    ref, _ = E.merge_state_dicts({name: base[name]}, [{name: models[0][name]}],
                                 E.make_plan("ties", 1, weights=[0.25], densities=[0.5], options={"normalize": True}))
    assert torch.equal(_load(r["output"])[name], ref[name]) and r["models"][1]["density_range"] == [0.0, 0.75]
    (tmp_path / "s.yml").write_text("merge_method: ties\nbase_model: in/base.safetensors\n"
                                    "models: [{model: in/m0.safetensors, parameters: {weight: 1, density: 0}}]\n")
    res = _cli(["--config", "s.yml", "--out", "s"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    assert all(torch.equal(v, base[k]) for k, v in _load(json.loads(res.stdout)["result"]["output"]).items())
    (tmp_path / "g.yml").write_text(PER_TENSOR_YML.replace("value: [0.25, 0.75]", "value: [0.25, 1.5]"))
    res = _cli(["--config", "g.yml", "--out", "g"], tmp_path, monkeypatch, d)
    assert res.exit_code == 2 and "models[1].density[0].value[1]: 1.5 is outside [0.0, 1.0]" in res.stderr
    assert not (tmp_path / "g").exists()


B = ["--base", "in/base.safetensors"]
M2 = ["--models", "in/m0.safetensors,in/m1.safetensors"]
BAD_INPUTS = [
    pytest.param([*B, "--models", "in/m0.safetensors,in/missing.safetensors", "--out", "r"], 2, "no such file",
                 id="missing model"),
    pytest.param(["--base", "in/nope.safetensors", *M2, "--out", "r"], 2, "no such file", id="missing base"),
    pytest.param([*B, "--models", "in/m0.safetensors,in/shape.safetensors", "--out", "r"], 2,
                 "tensor 'a.weight' has shape [64, 95]", id="shape mismatch"),
    pytest.param([*B, "--models", "in/m0.safetensors,in/trunc.safetensors", "--out", "r"], 2, "trunc.safetensors",
                 id="truncated model"),
    pytest.param([*B, "--models", "in/m0.safetensors,in/bf16.safetensors", "--out", "r"], 2,
                 "tensor 'a.bias' has dtype bfloat16", id="dtype mismatch"),
    pytest.param([*B, "--models", "in/m0.safetensors,in/nan.safetensors", "--out", "r"], 2,
                 "nan.safetensors: tensor 'a.bias' holds 1 NaN/inf", id="non-finite task vector"),
    pytest.param([*B, *M2, "--nm", "33:32", "--out", "r"], 2, "--nm: '33:32': n:m needs 1 <= n <= m", id="n > m"),
    pytest.param([*B, *M2, "--nm", "0:32", "--out", "r"], 2, "--nm: '0:32'", id="n < 1"),
    pytest.param([*B, *M2, "--nm", "4-32", "--out", "r"], 2, "--nm: expected N:M", id="nm syntax"),
    pytest.param([*B, *M2, "--nm-for", "2=4:32", "--out", "r"], 2, "--nm-for: '2=4:32'", id="nm-for index"),
    pytest.param([*B, *M2, "--lam", "1,2,3", "--out", "r"], 2, "--lam: 3 lambdas for 2 models", id="lam count"),
    pytest.param([*B, *M2, "--lam", "nan", "--out", "r"], 2, "finite", id="lam nan"),
    pytest.param([*B, *M2, "--dtype", "int8", "--out", "r"], 2, "'int8' is not one of", id="dtype unknown"),
    pytest.param([*B, *M2, "--include", "zzz*", "--out", "r"], 2,
                 "--include: the filters leave none of the", id="include matches nothing"),
    pytest.param([*B, *M2, "--exclude", "a.*", "--exclude", "*", "--out", "r"], 2,
                 "--exclude: the filters leave none of the", id="exclude everything"),
    pytest.param([*B, *M2, "--lam", "1e39", "--out", "r"], 1, "not finite", id="lam overflows"),
    pytest.param([*B, "--models", "in/m0.safetensors,in/base.safetensors", "--out", "r"], 2, "is the base itself",
                 id="base as model"),
    pytest.param([*B, "--models", "in/m0.safetensors,in/m0.safetensors", "--out", "r"], 2, "given twice",
                 id="model twice"),
    pytest.param(["--base", "in/base.pt", "--models", "in/m0.pt,in/evil.pt", "--out", "r"], 2, "evil.pt: refused to load",
                 id="unsafe pickle"),
    pytest.param(["--config", "in/unknown.yml", "--out", "r"], 2, "merge_method 'slerp' is not supported",
                 id="config unknown method"),
    pytest.param(["--config", "in/field.yml", "--out", "r"], 2, "chat_template not supported", id="config field"),
    pytest.param(["--config", "in/param.yml", "--out", "r"], 2, "models[0].parameters: density not supported",
                 id="config parameter"),
    pytest.param(["--config", "in/missing.yml"], 2, "no such file", id="config missing"),
    pytest.param(["--config", "in/unknown.yml", "--lam", "1"], 2, "--lam does not go with --config", id="config+lam"),
    pytest.param(["--config", "in/dtype.yml", "--out", "r"], 2, "dtype: 'int8' is not supported (use float32, float16, "
                 "bfloat16)", id="config dtype"),
    pytest.param(["--config", "in/unknown.yml", "--dtype", "float16"], 2, "--dtype does not go with --config",
                 id="config+dtype"),
    pytest.param([*M2], 2, "--models applies to merges of your checkpoints only", id="models without base"),
    pytest.param([*B], 2, "give the fine-tuned checkpoints", id="base without models"),
    pytest.param([*B, *M2, "--n-seeds", "2"], 2, "--n-seeds applies to the embedded demo only", id="demo option"),
    pytest.param([*B, *M2, "-m", "in/m2.safetensors"], 2, "not both", id="models and model"),
    pytest.param(["--nm", "5:4"], 2, "--nm: '5:4'", id="demo n > m"),
    pytest.param([*B, *M2, "--lam-grid", "0:1:0.5", "--out", "r"], 2, "--eval-cmd: a lambda grid needs",
                 id="grid without eval-cmd"),
    pytest.param([*B, *M2, "--lam-grid", "0:1:0.5", "--eval-cmd", "no-such-prog-x {checkpoint}", "--out", "r"], 2,
                 "--eval-cmd: program 'no-such-prog-x' not found", id="eval-cmd missing program"),
]


@pytest.mark.parametrize("argv,code,msg", BAD_INPUTS)
def test_bad_inputs(argv, code, msg, ckpts, tmp_path, monkeypatch, check_bad_input):
    d, _, _ = ckpts
    before_inputs = check_bad_input.snapshot(d)
    res = _cli(argv, tmp_path, monkeypatch, d)
    check_bad_input(res, code, msg, root=tmp_path, before={tmp_path / "in"} | check_bad_input.snapshot(tmp_path))
    assert check_bad_input.snapshot(d) == before_inputs   # nothing written next to the inputs
    assert not (tmp_path / "r").exists()


def test_dtype_on_hf_folders_is_named_in_config_json(ckpts, tmp_path, monkeypatch):
    """--dtype on a Hugging Face folder: config.json's torch_dtype names the output dtype (as mergekit writes it),
    its other keys and the other small files unchanged; without --dtype config.json is copied byte for byte."""
    import json
    import shutil
    from pathlib import Path

    d, _, _ = ckpts
    shutil.copytree(d / "base_hf", tmp_path / "hfb")
    cfg = {"model_type": "llama", "torch_dtype": "float32", "hidden_size": 64}
    (tmp_path / "hfb" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hfb" / "tokenizer_config.json").write_text('{"a": 1}')
    outs = {}
    for name, extra in (("bf", ["--dtype", "bfloat16"]), ("same", [])):
        res = _cli(["--base", "hfb", "-m", "in/m0_hf", "-m", "in/m1_hf", *extra, "--out", name], tmp_path, monkeypatch, d)
        assert res.exit_code == 0, res.stderr
        outs[name] = Path(json.loads(res.stdout)["result"]["output"])
    assert json.loads((outs["bf"] / "config.json").read_text()) == {**cfg, "torch_dtype": "bfloat16"}
    assert _load(outs["bf"])["a.weight"].dtype == torch.bfloat16
    assert (outs["same"] / "config.json").read_bytes() == (tmp_path / "hfb" / "config.json").read_bytes()
    for o in outs.values():
        assert (o / "tokenizer_config.json").read_text() == '{"a": 1}'


def test_lambda_grid_with_eval_cmd(ckpts, tmp_path, monkeypatch):
    """The user's command scores each scale; the best one is written (here: the score prefers scale 0.5)."""
    import json
    import sys

    d, base, models = ckpts
    (tmp_path / "ev.py").write_text(   # numpy only (no torch import): a light command
        "import sys, json\nfrom safetensors import safe_open\n"
        "r, b = (safe_open(p, framework='numpy').get_tensor('a.weight') for p in sys.argv[1:3])\n"
        "dev = float(abs(r - b).sum())\n"
        "print(json.dumps({'score': -abs(dev - 0.5 * float(sys.argv[3]))}))\n")
    res = _cli([*B, *M2, "--lam", "1", "--out", "one"], tmp_path, monkeypatch, d)
    full = json.loads(res.stdout)["result"]
    dev1 = float((_load(full["output"])["a.weight"] - base["a.weight"]).abs().sum())
    cmd = f"{sys.executable} ev.py {{checkpoint}} in/base.safetensors {dev1}"
    res = _cli([*B, *M2, "--lam-grid", "0.25,0.5,1", "--eval-cmd", cmd, "--dtype", "float32", "--out", "g"], tmp_path,
               monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    assert r["lambda_search"]["selected_scale"] == 0.5 and len(r["lambda_search"]["rows"]) == 3
    out = _load(r["output"])
    assert out["h.weight"].dtype == torch.float32 and out["steps"].dtype == torch.int64  # --dtype on the search path
    assert torch.allclose(out["a.weight"] - base["a.weight"], 0.5 * (_load(full["output"])["a.weight"] - base["a.weight"]),
                          atol=1e-6)
    assert not (tmp_path / "g" / ".lambda_grid").exists()


def test_overfull_nm_warns(ckpts, tmp_path, monkeypatch):
    import json

    d, _, _ = ckpts
    res = _cli([*B, "--models", "in/m0.safetensors,in/m1.safetensors,in/m2.safetensors", "--nm", "16:32",
                "--out", "w"], tmp_path, monkeypatch, d)
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    assert "exceeds m = 32" in r["warnings"][0] and r["models"][2]["short_blocks"] > 0
    assert r["overlap"]["max_pairwise"] == 0


# ------------------------------------------------------------------ the demo


@pytest.mark.slow
def test_demo_cli_one_seed(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["cabs-merge", "-q", "--threads", "1", "--n-seeds", "1", "--methods", "cabs,bs"])
    assert res.exit_code == 0, res.stderr
    r = json.loads(res.stdout)["result"]
    rows = {m["name"]: m for m in r["summary"]}
    assert rows["cabs"]["max_pairwise_overlap"] == [0] and rows["bs"]["max_pairwise_overlap"][0] > 0
    kept = r["per_seed"][0]["methods"][0]["kept_fraction"]
    assert len(kept) == 4 and all(0.1 < k <= 0.125 for k in kept)
    cabs = r["per_seed"][0]["methods"][0]
    assert [row[i] for i, row in enumerate(cabs["overlap"]["counts"])] == [round(k * 41344) for k in kept]
    assert all(td["min"] <= td["max"] <= 0.125 for td in cabs["tensor_density"])


def test_demo_stage_alone_equals_pipeline():
    from icmltools.cabs import demo as D
    from icmltools.cabs.options import DemoConfig

    cfg = DemoConfig()
    a, b = D.make_tasks(cfg, 3), D.make_tasks(cfg, 3)
    assert all(torch.equal(x["train"][0], y["train"][0]) for x, y in zip(a, b))
    assert not torch.equal(a[0]["train"][0], D.make_tasks(cfg, 4)[0]["train"][0])


@pytest.mark.slow
def test_demo_effect_seeds_0_2():
    """Spec acceptance: CABS overlap 0 on every seed; CABS mean test accuracy >= base mean + 0.01."""
    from icmltools.cabs import api

    r = api.run_demo(api.demo_config(methods=["task_arithmetic", "cabs"]), seeds=(0, 1, 2))
    rows = {m["name"]: m for m in r["summary"]}
    assert rows["cabs"]["max_pairwise_overlap"] == [0, 0, 0]
    assert rows["cabs"]["test_avg"] >= r["base"]["avg"] + 0.01


def test_options_module_is_light():
    import subprocess
    import sys

    code = ("import sys, icmltools.cabs.options, icmltools.cabs; "
            "print(','.join(m for m in ('torch', 'numpy', 'yaml', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


def test_no_global_seeding():
    import pathlib
    import re

    src = "".join(p.read_text() for p in pathlib.Path(P.__file__).parent.glob("*.py"))
    assert not re.search(r"torch\.manual_seed|np\.random\.seed\(|default_rng|Generator\(\)\.manual_seed", src)


def test_nm_ties_go_to_the_lower_position():
    """Equal |tau| inside a block: the first positions are kept (torch path and compiled loop alike)."""
    import torch

    from icmltools.cabs import prune as P

    x = torch.tensor([0.5, -1.0, 1.0, 0.25, -1.0, 1.0, 0.5, -0.5] * 2)
    mask = P.nm_mask(x, 3, 8)
    assert mask.view(2, 8)[0].nonzero().view(-1).tolist() == [1, 2, 4]
    taken = torch.zeros(16, dtype=torch.bool)
    taken[2] = True
    assert P.nm_mask(x, 3, 8, taken).view(2, 8)[0].nonzero().view(-1).tolist() == [1, 4, 5]


@pytest.mark.parametrize("kind", ["normal", "bf16_diff", "small_ints", "zeros", "sparse"])
def test_compiled_nm_prune_equals_the_torch_masks_on_ties(kind):
    """The compiled n:m loop (every copy of the k-th key kept; only its first copies kept; fewer than k free
    slots; none free; n = m without passes) keeps what the torch path's unique-key top-k keeps, tie-heavy data
    included, with and without taken slots, padded and dropped tails; its short-block count is the torch path's."""
    from icmltools.merge import kernels as K

    if not K.available():
        pytest.skip("numba not installed")
    g = torch.Generator().manual_seed(11)
    size = 256 * 8 + 32 * 61 + 13  # a partial tail block for every m below
    x = torch.randn(size, generator=g)
    if kind == "bf16_diff":
        x = x.bfloat16().float() - torch.randn(size, generator=g).bfloat16().float()
    elif kind == "small_ints":
        x = torch.randint(-3, 4, (size,), generator=g).float()
    elif kind == "zeros":
        x = torch.zeros(size)
        x[::7] = -0.0
    elif kind == "sparse":
        x[torch.rand(size, generator=g) > 0.15] = 0
    checked = 0
    # the ranks (m = 4, 8), the sorting network (3 <= m <= 32 otherwise; m = 17 and 7 padded to 32 and 8), the
    # pair loop (m <= 2), the passes (m > 32, k < 24) and the bisection (k >= 24: 64:256, 30:50)
    nms = [(4, 32), (1, 4), (3, 7), (16, 32), (32, 32), (5, 5), (2, 16), (64, 256), (30, 50), (2, 4), (1, 2),
           (9, 17), (31, 32), (1, 3), (3, 3), (1, 1), (2, 2), (10, 33), (4, 8), (2, 6), (9, 8)]
    for n, m in nms:
        for frac in (0.0, 0.4, 0.9):
            taken0 = torch.rand(size, generator=g) < frac
            for tail in ("pad", "drop"):
                use = frac > 0
                short = [0]
                want = x.masked_fill(~P.nm_mask(x, n, m, taken0 if use else None, tail, short), 0)
                got, taken = x.clone(), taken0.clone()
                s = K.nm_prune(got, n, m, taken if use else None, tail == "pad")
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (n, m, frac, tail)
                assert s == short[0], (n, m, frac, tail)
                if use:
                    kept = P.nm_mask(x, n, m, taken0, tail)
                    assert torch.equal(taken, taken0 | kept), (n, m, frac, tail)
                checked += 1
    assert checked == len(nms) * 3 * 2


def test_sorting_networks_sort():
    """The n:m selection's networks (Batcher's odd-even merge sort, 2..32 keys) sort every 0-1 input up to 16
    keys (the 0-1 principle: then every input) and random inputs with repeats at 32."""
    from icmltools.merge import _kernels_numba as KN

    g = torch.Generator().manual_seed(2)
    for n in (2, 4, 8, 16, 32):
        pairs = KN._batcher_pairs(n)
        assert all(0 <= i < j < n for i, j in pairs)
        inputs = [[(b >> i) & 1 for i in range(n)] for b in range(1 << n)] if n <= 16 else \
            torch.randint(-2, 6, (3000, n), generator=g).tolist()
        for v in inputs:
            w = list(v)
            for i, j in pairs:
                w[i], w[j] = min(w[i], w[j]), max(w[i], w[j])
            assert w == sorted(v), (n, v)
    # each generated network has a name of its own: numba names compiled code by name, types and a per-process
    # counter, and networks of equal types compiled in two processes must not meet under one symbol (cache)
    names = {KN._defined(KN._net_src(n)).__qualname__ for n in (4, 8, 16, 32)}
    names |= {KN._defined(KN._rank_src(m)).__qualname__ for m in (4, 8)}  # the rank loops alike
    assert len(names) == 6


def test_top_networks_leave_the_largest_keys_sorted():
    """The top-L networks of the blocks of 32 (groups of L sorted, then merged two by two keeping the top L) leave
    the L largest of 32 keys, ascending, in slots 0..L-1: on random keys with repeats and on inputs of two values
    (the 0-1 principle holds for these outputs too, checked on a sample of them)."""
    from icmltools.merge import _kernels_numba as KN

    g = torch.Generator().manual_seed(5)
    inputs = torch.randint(-1, 6, (1500, 32), generator=g).tolist() + \
        (torch.rand(1500, 32, generator=g) < 0.5).int().tolist() + [list(range(32)), list(range(32))[::-1]]
    for L in (1, 2, 4, 8, 16, 32):
        pairs = KN._tree_pairs(L)
        assert all(0 <= a < 32 and 0 <= b < 32 and a != b for a, b in pairs)
        for v in inputs:
            w = list(v)
            for a, b in pairs:
                w[a], w[b] = min(w[a], w[b]), max(w[a], w[b])
            assert w[:L] == sorted(v)[32 - L:], (L, v)
    assert len(KN._tree_pairs(32)) == len(KN._batcher_pairs(32))  # L = 32: Batcher's full sort
    names = {KN._defined(KN._tree_src(L)).__qualname__ for L in (1, 2, 4, 8, 16, 32)}
    assert len(names) == 6  # a symbol of its own each (see test_sorting_networks_sort)


def test_transposition_in_vector_registers():
    """_t16 moves src[so + l * ss + i] to dst[do + 16 * i + l] for a 16 x 16 tile, and nothing else."""
    import numpy as np

    from icmltools.merge import kernels as K

    if not K.available():
        pytest.skip("numba not installed")
    import numba

    KN = K._mod()
    t16 = numba.njit(lambda src, so, ss, dst, do: KN._t16(src, so, ss, dst, do))  # an intrinsic: called compiled
    src = np.arange(40 * 37, dtype=np.int32) * 7 - 900
    dst = np.full(600, -5, np.int32)
    t16(src, 3, 37, dst, 41)
    want = np.full(600, -5, np.int32)
    want[41:41 + 256] = src[3:3 + 16 * 37].reshape(16, 37)[:, :16].T.reshape(-1)
    assert np.array_equal(dst, want)


@pytest.mark.parametrize("kind", ["bf16_diff", "small_ints", "special"])
def test_blocks_of_32_equal_the_sorting_network(kind):
    """The path of the blocks of 32 (keys transposed in registers, the top-L network, the keep bits applied two
    vectors a block) keeps what the 32-key sorting network's path keeps, bitwise, and counts the same short
    blocks: every n from 1 to past 32 (each L), taken slots or none, padded or dropped tail, a partial last group
    of blocks, ties by the hundred, zeros of both signs, NaN and infinities; and the bits of each block's slots
    left nonzero (the kept pairs' counts)."""
    import numpy as np

    from icmltools.merge import kernels as K

    if not K.available():
        pytest.skip("numba not installed")
    KN = K._mod()
    g = torch.Generator().manual_seed(23)
    size = 32 * (16 * 5 + 7) + 19  # five whole groups of 16 blocks, 7 blocks more, a tail of 19
    x = torch.randn(size, generator=g)
    if kind == "bf16_diff":
        x = (x * 0.02).bfloat16().float() - (x * 0.02 + torch.randn(size, generator=g) * 1e-3).bfloat16().float()
    elif kind == "small_ints":
        x = torch.randint(-3, 4, (size,), generator=g).float()
    else:
        x[::5] = 0.0
        x[1::5] = -0.0
        x[::37] = float("inf")
        x[3::41] = float("-inf")
        x[7::53] = float("nan")
    x = x.numpy()
    for n in (1, 2, 3, 4, 5, 8, 12, 16, 17, 31, 32, 40):
        net = KN.nm_net_of([32], [n])
        assert len(net) == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 12: 16, 16: 16}.get(n, 32)
        for frac in (0.0, 0.3):
            taken0 = torch.rand(size, generator=g).numpy() < frac
            for pad in (True, False):
                want, t1 = x.copy(), taken0.copy()
                s1 = KN._nm_net_span(want, 0, size, n, 32, t1, frac > 0, pad, None, np.empty(KN._NM_SCR, np.int32))
                got, t2, nzm = x.copy(), taken0.copy(), np.zeros(size // 32, np.uint32)
                s2 = KN._nm_span32(got, 0, size, n, t2, frac > 0, pad, net, nzm, np.empty(KN._NM_SCR, np.int32))
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (n, frac, pad)
                assert np.array_equal(t2, t1) and s2 == s1, (n, frac, pad)
                nz = want[:size // 32 * 32].reshape(-1, 32) != 0  # the blocks' nonzero slots, as bits
                assert np.array_equal(nzm, (nz * (1 << np.arange(32, dtype=np.uint64))).sum(axis=1)), (n, frac, pad)
    assert KN.nm_net_of([32, 32], [4, 9]) == (np.int8(0),) * 16  # one L for every model: the largest n's
    assert KN.nm_net_of([32, 17], [4, 4]) == np.int8(1) and KN.nm_net_of([32, 8], [4, 4]) is None


@pytest.mark.parametrize("nms", [[(9, 17), (1, 2), (2, 8), (10, 40)], [(9, 17), (4, 32), (16, 32), (3, 20)],
                                 [(4, 32)] * 4, [(4, 32), (1, 32), (9, 32), (32, 32)]],
                         ids=["every_path", "only_32_network", "blocks_of_32", "blocks_of_32_each_n"])
@pytest.mark.parametrize("method", ["cabs", "bs"])
def test_one_pass_equals_model_by_model_and_torch(method, nms, tmp_path):
    """CABS/BS's one-pass loop (every model's chunk pruned and summed span by span) gives the bytes, kept counts,
    overlap and short blocks of feeding the models one at a time and of the torch path: per-model n:m (the
    network, the ranks, the pair loop and the passes; or blocks of 17 to 32 slots only, which compile the 32-key
    network's path alone; or blocks of 32 only, the default's path), a zero weight, a padded tail, chunks,
    threaded pieces."""
    import numba

    from icmltools.cabs import methods as CM
    from icmltools.merge import engine as E
    from icmltools.merge import kernels as K
    from icmltools.taskvec.readers import MemoryReader

    if not K.available():
        pytest.skip("numba not installed")
    g = _g(9)
    base = {"big": (torch.randn(700, 1201, generator=g) * 0.05).to(torch.bfloat16),
            "f": torch.randn(3001, generator=g) * 0.05}
    models = [{k: v + (torch.randint(-3, 4, v.shape, generator=g) * 2.0 ** -9).to(v.dtype) for k, v in base.items()}
              for _ in range(4)]

    def merge(tag, chunk, tail, weights, one_pass=True, torch_only=False):
        inst = CM.for_plan(method, nms)
        plan = E.make_plan(inst, 4, weights=weights, chunk_elems=chunk, options={"tail": tail},
                           model_options=[{"n": n, "m": m} for n, m in nms])
        out = tmp_path / f"{tag}.safetensors"
        with pytest.MonkeyPatch.context() as mp, K.torch_only(torch_only):
            mp.setattr(type(inst), "one_pass", one_pass)
            st = E.merge_to_checkpoint(MemoryReader(base), [MemoryReader(m) for m in models], plan, 0.7, out)
        s = st.summary(extended=True, per_tensor=True)
        for key in ("seconds", "read_gb_per_s", "kernels"):
            s.pop(key)
        return out.read_bytes(), s, inst.short

    old = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        for chunk, tail, weights in ((None, "pad", [1.0, 0.5, 0.0, -1.2]), (68_000, "drop", [1.0] * 4)):
            fast = merge("fast", chunk, tail, weights)
            assert fast == merge("by_model", chunk, tail, weights, one_pass=False), (chunk, tail)
            assert fast == merge("slow", chunk, tail, weights, torch_only=True), (chunk, tail)
            full = sum(n / m for n, m in nms) > 1  # CABS' later models find blocks already full
            assert (sum(fast[2]) > 0) == (method == "cabs" and full)
    finally:
        numba.set_num_threads(old)
    z = torch.zeros(8)  # blocks that align only on spans over 2^16 (lcm 257 x 263), or every weight 0: model by model
    assert K.nm_merge_raw(z, [z, z], [(1, 257), (1, 263)], [1.0, 1.0], True, False, z.clone()) is None
    assert K.nm_merge_raw(z, [z, z], [(1, 4), (1, 4)], [0.0, 0.0], True, False, z.clone()) is None
    assert K.nm_merge_raw(z, [z, z], [(1, 4), (1, 4)], [1.0, 0.0], True, False, z.clone()) is not None
