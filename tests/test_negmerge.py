"""NegMerge: exact mask cases, streamed merges vs closed forms, lambda rule, eval command, CLI, demo effect."""
import json
import os
import pickle
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.negmerge import merge as M
from icmltools.negmerge import search as S
from icmltools.taskvec import MemoryReader, open_checkpoint, read_record, write_state_dict

torch.set_num_threads(1)


def _closed_form(taus):
    """The spec's formula: where(|sum_i sign(tau_i)| == N, sum_i tau_i / N, 0)."""
    st = torch.stack(taus)
    n = len(taus)
    return torch.where(torch.sign(st).sum(0).abs() == n, st.sum(0) / n, torch.zeros(()))


def _dyadic(shape, g, scale=8):
    """Random multiples of 1/8 in [-2, 2]: sums of a few are exact in float32, so float checks can be exact."""
    return (torch.randint(-2 * scale, 2 * scale + 1, shape, generator=g) / scale).float()


# --------------------------------------------------------------------------------------------- kernels


def test_hand_made_mask_case():
    # columns: all positive, all negative, mixed signs, an exact zero in one model
    taus = [torch.tensor([1.0, -1.0, 1.0, 1.0]),
            torch.tensor([2.0, -2.0, -1.0, 0.0]),
            torch.tensor([3.0, -6.0, 2.0, 2.0])]
    merged, kept = M.negmerge_tensor(taus)
    assert merged.tolist() == [2.0, -3.0, 0.0, 0.0]
    assert kept == 2


def test_negmerge_equals_closed_form():
    g = torch.Generator().manual_seed(0)
    for n in (2, 3, 7):
        taus = [_dyadic((13, 9), g) for _ in range(n)]
        merged, kept = M.negmerge_tensor(taus)
        assert torch.equal(merged, _closed_form(taus))
        assert kept == int((torch.sign(torch.stack(taus)).sum(0).abs() == n).sum())


def test_kept_fraction_never_grows_with_more_candidates():
    g = torch.Generator().manual_seed(1)
    taus = [torch.randn(500, generator=g) + 0.3 for _ in range(12)]
    kept = [M.negmerge_tensor(taus[:k])[1] for k in range(2, 13)]
    assert all(a >= b for a, b in zip(kept, kept[1:]))
    assert kept[0] > kept[-1]


def test_baseline_kernels():
    taus = [torch.tensor([1.0, -4.0, 0.5, 0.0]), torch.tensor([-3.0, 2.0, 0.25, 0.0])]
    assert M.uniform_tensor(taus)[0].tolist() == [-1.0, -1.0, 0.375, 0.0]
    mm, kept = M.magmax_tensor(taus)
    assert mm.tolist() == [-3.0, -4.0, 0.5, 0.0] and kept == 3
    # TIES with k=1 (no trimming): elected sign = sign of the sum; mean of the agreeing entries
    t3 = [torch.tensor([1.0, -4.0, 2.0]), torch.tensor([3.0, 2.0, -1.0]), torch.tensor([-1.0, -2.0, 4.0])]
    ties, _ = M.ties_tensor(t3, k=1.0)
    assert ties.tolist() == [2.0, -3.0, 3.0]
    # trimming keeps the top-k magnitudes of each task vector
    assert M._trim_top_k(torch.tensor([0.1, -5.0, 3.0, 0.2, -0.3]), 0.4).tolist() == [0.0, -5.0, 3.0, 0.0, 0.0]


def test_dare_is_seeded_and_rescaled():
    t = torch.ones(20000)
    cfg = M.MergeConfig("task_arithmetic", dare_p=0.5, seed=3)
    a, _ = M.merge_tensor([t], cfg, name="w")
    b, _ = M.merge_tensor([t], cfg, name="w")
    assert torch.equal(a, b)
    assert set(a.unique().tolist()) == {0.0, 2.0}
    assert abs(a.mean().item() - 1.0) < 0.05


# --------------------------------------------------------------------------------------------- streamed merges


def _models(n=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    base = {"a.w": _dyadic((6, 5), g).to(dtype), "a.b": _dyadic((5,), g).to(dtype),
            "bn.num_batches_tracked": torch.tensor(9), "h": _dyadic((3, 6), g).to(torch.bfloat16)}
    cands = []
    for _ in range(n):
        c = {k: (v + _dyadic(v.shape, g).to(v.dtype) if v.is_floating_point() else v + 1) for k, v in base.items()}
        cands.append(c)
    return base, cands


@pytest.mark.parametrize("method", M.METHODS)
def test_stream_to_file_matches_in_memory(tmp_path, method):
    base, cands = _models()
    write_state_dict(base, tmp_path / "base.safetensors")
    paths = []
    for i, c in enumerate(cands):
        write_state_dict(c, tmp_path / f"c{i}.safetensors")
        paths.append(tmp_path / f"c{i}.safetensors")
    cfg = M.MergeConfig(method, index=1)
    b = open_checkpoint(tmp_path / "base.safetensors")
    stats = M.merge_to_checkpoint(b, [open_checkpoint(p) for p in paths], cfg, 1.5, tmp_path / "out.safetensors")
    out = open_checkpoint(tmp_path / "out.safetensors")
    tau, _ = M.merged_task_vector(MemoryReader(base), [MemoryReader(c) for c in cands], cfg)
    for k, v in base.items():
        got = out.get(k)
        assert got.dtype == v.dtype
        if not v.is_floating_point():
            assert torch.equal(got, v)  # integer buffers are copied from the base, not merged
        else:
            assert torch.equal(got, (v.float() - 1.5 * tau[k]).to(v.dtype))
    assert stats.skipped_non_float == ["bn.num_batches_tracked"]
    assert read_record(tmp_path / "out.safetensors")["method"] == method


def test_negmerge_file_output_equals_formula_and_lambda_zero_is_base(tmp_path):
    base, cands = _models(n=5, dtype=torch.float64)
    b = MemoryReader(base)
    cs = [MemoryReader(c) for c in cands]
    M.merge_to_checkpoint(b, cs, M.MergeConfig(), 2.0, tmp_path / "m.safetensors")
    M.merge_to_checkpoint(b, cs, M.MergeConfig(), 0.0, tmp_path / "zero.safetensors")
    out, zero = open_checkpoint(tmp_path / "m.safetensors"), open_checkpoint(tmp_path / "zero.safetensors")
    for k, v in base.items():
        assert torch.equal(zero.get(k), v) and zero.get(k).dtype == v.dtype
        if k in ("a.w", "a.b"):  # float64 tensors: exact closed form
            taus = [c[k] - v for c in cands]
            expect = v - 2.0 * _closed_form(taus).double()
            assert torch.equal(out.get(k), expect)


def test_merge_input_errors():
    base, cands = _models(n=3)
    b = MemoryReader(base)
    with pytest.raises(BadInputError, match="at least 2 candidates"):
        M.open_and_check(b, [MemoryReader(cands[0])], M.MergeConfig())
    M.open_and_check(b, [MemoryReader(cands[0])], M.MergeConfig("task_arithmetic"))
    bad = dict(cands[1])
    bad["a.w"] = torch.zeros(6, 4)
    with pytest.raises(BadInputError, match="'a.w' has shape"):
        M.open_and_check(b, [MemoryReader(cands[0]), MemoryReader(bad)], M.MergeConfig())
    with pytest.raises(BadInputError, match="^ties_k: must be in") as ei:
        M.MergeConfig(ties_k=0).validate(3)
    assert ei.value.param == "ties_k"  # the library names its parameter; the CLI shows it as --ties-k
    with pytest.raises(BadInputError, match="out of range"):
        M.MergeConfig("task_arithmetic", index=3).validate(3)


# --------------------------------------------------------------------------------------------- lambda rule


def test_select_lambda_rule():
    rows = [{"lam": 0.0, "forget_acc": 0.9, "retain_acc": 1.0},
            {"lam": 1.0, "forget_acc": 0.5, "retain_acc": 0.96},
            {"lam": 2.0, "forget_acc": 0.5, "retain_acc": 0.955},   # tie: the first wins
            {"lam": 3.0, "forget_acc": 0.1, "retain_acc": 0.94}]    # below 0.95 x 1.0
    sel = S.select_lambda(rows, 1.0)
    assert (sel.lam, sel.feasible) == (1.0, True)
    sel = S.select_lambda(rows[1:], 1.0, ratio=0.999)
    assert (sel.lam, sel.feasible) == (1.0, False)  # nothing feasible: highest retain, flagged


def test_search_patience_stops_early():
    calls = []

    def ev(lam):
        calls.append(lam)
        return {"forget_acc": 1 - lam / 10, "retain_acc": 1 - lam / 5}

    rows, sel = S.search(ev, [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 1.0, patience=2)
    assert calls == [0, 0.1, 0.2, 0.3, 0.4] and sel.lam == 0.2
    rows, sel = S.search(ev, [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 1.0)
    assert len(rows) == 7 and sel.lam == 0.2


def test_parse_grid():
    assert S.parse_grid("0:1:0.25") == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert S.parse_grid("2, 0.5,1") == [0.5, 1.0, 2.0]
    for bad in ("", "1:0:0.1", "a,b", "0:1", "0:1:-1"):
        with pytest.raises(BadInputError):
            S.parse_grid(bad)


def test_command_evaluator(tmp_path):
    script = tmp_path / "ev.py"
    script.write_text("import sys, json\nprint('log line')\n"
                      "print(json.dumps({'forget_acc': 0.25, 'retain_acc': 0.5, 'path': sys.argv[-1]}))\n")
    ev = S.CommandEvaluator(f"{sys.executable} {script} --ckpt {{checkpoint}}")
    assert ev("/x/y.safetensors") == {"forget_acc": 0.25, "retain_acc": 0.5, "path": "/x/y.safetensors"}
    bad = tmp_path / "bad.py"
    bad.write_text("print('{\"forget_acc\": 1}')\n")
    with pytest.raises(RuntimeFailure, match="retain_acc"):
        S.CommandEvaluator(f"{sys.executable} {bad}")("p")
    fail = tmp_path / "fail.py"
    fail.write_text("import sys\nsys.exit('boom')\n")
    with pytest.raises(RuntimeFailure, match="status 1.*boom"):
        S.CommandEvaluator(f"{sys.executable} {fail}")("p")
    with pytest.raises(BadInputError, match="not found"):
        S.CommandEvaluator("no-such-program-xyz")("p")


# --------------------------------------------------------------------------------------------- CLI, files


def _write_models(tmp_path, fmt="safetensors", n=3):
    base, cands = _models(n=n)
    ext = {"safetensors": ".safetensors", "torch": ".pt", "hf_safetensors": "", "hf_torch": ""}[fmt]
    write_state_dict(base, tmp_path / f"base{ext}", fmt=fmt)
    paths = []
    for i, c in enumerate(cands):
        p = tmp_path / f"c{i}{ext}"
        if fmt == "torch":
            torch.save({"state_dict": c, "epoch": 1}, p)  # wrapped, as training scripts save
        else:
            write_state_dict(c, p, fmt=fmt)
        paths.append(str(p))
    return base, cands, str(tmp_path / f"base{ext}"), paths


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "hf_safetensors", "hf_torch"])
def test_cli_merge_keeps_base_format(tmp_path, run_cli, fmt):
    base, cands, bpath, cpaths = _write_models(tmp_path, fmt)
    args = ["negmerge", "-q", "--base", bpath, "--lam", "1.0", "--out", str(tmp_path / "run")]
    for c in cpaths:
        args += ["-c", c]
    res, doc = run_cli(args)
    r = doc["result"]
    assert r["output_format"] == fmt and doc["device"]["resolved"] == "cpu"
    out = open_checkpoint(r["output"])
    assert out.format == fmt
    tau, stats = M.merged_task_vector(MemoryReader(base), [MemoryReader(c) for c in cands], M.MergeConfig())
    assert abs(r["kept_fraction"] - stats.kept_fraction) < 1e-12
    for k, v in base.items():
        expect = v if k not in tau else (v.float() - tau[k]).to(v.dtype)
        assert torch.equal(out.get(k), expect)
    assert json.loads((tmp_path / "run" / "result.json").read_text())["lam"] == 1.0


def test_cli_lambda_grid_with_eval_command(tmp_path, run_cli):
    base, cands, bpath, cpaths = _write_models(tmp_path)
    script = tmp_path / "ev.py"
    # reads a.w with numpy only (fast start); forget accuracy falls with lambda, retain more slowly
    script.write_text(
        "import sys, json, struct\nimport numpy as np\n"
        "def aw(p):\n"
        "    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])\n"
        "    s, e = h['a.w']['data_offsets']; return np.frombuffer(b[8 + n + s:8 + n + e], dtype='<f4')\n"
        f"d = float(np.abs(aw(sys.argv[1]) - aw({bpath!r})).mean())\n"
        "print(json.dumps({'forget_acc': 1 - d, 'retain_acc': 1 - d / 4}))\n")
    args = ["negmerge", "-q", "--base", bpath, "--lam-grid", "0,0.5,1,2", "--eval-cmd", f"{sys.executable} {script}",
            "--out", str(tmp_path / "run")]
    for c in cpaths:
        args += ["-c", c]
    res, doc = run_cli(args)
    ls = doc["result"]["lambda_search"]
    assert [r["lam"] for r in ls["rows"]] == [0.0, 0.5, 1.0, 2.0]
    assert ls["rows"][2]["forget_acc"] < ls["rows"][1]["forget_acc"] < ls["rows"][0]["forget_acc"]
    feasible = [r for r in ls["rows"] if r["retain_acc"] >= 0.95 * ls["original"]["retain_acc"]]
    assert ls["selected_lam"] == min(feasible, key=lambda r: r["forget_acc"])["lam"]
    assert doc["result"]["lam"] == ls["selected_lam"]
    assert read_record(doc["result"]["output"])["lam"] == ls["selected_lam"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "config.json", "merged.safetensors", "merged.safetensors.json", "result.json"]


def test_cli_bad_inputs_leave_nothing(tmp_path, run_cli):
    base, cands, bpath, cpaths = _write_models(tmp_path)
    raw = Path(cpaths[1]).read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(raw[:-9])
    (tmp_path / "corrupt.safetensors").write_bytes(b"\xff" * 64)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"state_dict": {"a.w": Evil()}}))
    other = dict(cands[0])
    other["extra.w"] = torch.zeros(2)
    write_state_dict(other, tmp_path / "extra.safetensors")
    shp = dict(cands[0])
    shp["a.b"] = torch.zeros(4)
    write_state_dict(shp, tmp_path / "shape.safetensors")
    cases = [
        ([cpaths[0], str(tmp_path / "missing.safetensors")], "no such file"),
        ([cpaths[0], str(tmp_path / "trunc.safetensors")], "truncated"),
        ([cpaths[0], str(tmp_path / "corrupt.safetensors")], "corrupt"),
        ([cpaths[0], str(tmp_path / "evil.pt")], "refused"),
        ([cpaths[0], str(tmp_path / "extra.safetensors")], "'extra.w' is not in the base"),
        ([cpaths[0], str(tmp_path / "shape.safetensors")], "'a.b' has shape"),
        ([cpaths[0]], "at least 2 candidates"),
    ]
    for cands_, msg in cases:
        out = tmp_path / "run"
        args = ["negmerge", "-q", "--base", bpath, "--lam", "1", "--out", str(out)]
        for c in cands_:
            args += ["-c", c]
        res, _ = run_cli(args, expect_code=2)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error:") and msg in lines[0], (msg, res.stderr)
        assert "Traceback" not in res.stderr
        assert not out.exists()
    res, _ = run_cli(["negmerge", "-q", "--base", bpath, "-c", cpaths[0], "-c", cpaths[1]], expect_code=2)
    assert "--lam" in res.stderr
    res, _ = run_cli(["negmerge", "-q", "--lam", "1", "--lam-grid", "0:1:0.5"], expect_code=2)
    res, _ = run_cli(["negmerge", "-q", "--ties-k", "0"], expect_code=2)


# --------------------------------------------------------------------------------------------- demo


@pytest.fixture(scope="module")
def demo_doc():
    """The bare command's demo (quick preset = the spec's task and 27 candidates) on seed 1, via the CLI."""
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    res = CliRunner().invoke(cli, ["negmerge", "-q", "--seed", "1", "--device", "cpu"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr[-2000:]
    assert res.stdout.count("\n") == 1
    return json.loads(res.stdout)


@pytest.mark.slow
def test_demo_contract(demo_doc):
    methods = {m["method"]: m for m in demo_doc["result"]["methods"]}
    assert set(methods) == {"original", "retrain", "task_arithmetic_best", "task_arithmetic_median",
                            "negmerge", "uniform", "ties", "magmax"}
    for m in methods.values():
        for k in ("forget_acc", "retain_acc", "test_acc", "mia", "avg_gap"):
            assert isinstance(m[k], float) and 0 <= m[k] <= 100
    assert methods["retrain"]["avg_gap"] == 0.0
    assert len(demo_doc["result"]["candidates"]) == 27
    assert demo_doc["seed"] == 1 and demo_doc["device"]["resolved"] == "cpu"


@pytest.mark.slow
def test_demo_effect_fixed_seed(demo_doc):
    """Seed 1: NegMerge forgets and keeps retain >= 0.95 x original (the issue's first two demo effects).

    The third ("Avg.Gap below the median single task vector's") does not hold with the 0:10:0.05 grid:
    seeds 0/1/2 measured NegMerge 8.47/9.17/8.75 vs the median-ranked single candidate 6.46/6.29/5.23 and the
    median of the 27 single outcomes 7.19/8.22/7.10 (streams from core.seed.derive; the first seeding measured
    7.07/8.46/10.74 vs 4.55/4.36/7.61). It is not asserted."""
    m = {r["method"]: r for r in demo_doc["result"]["methods"]}
    orig, nm = m["original"], m["negmerge"]
    assert orig["forget_acc"] > 95  # the original memorised the forget set
    assert nm["forget_acc"] < orig["forget_acc"] - 10
    assert nm["retain_acc"] >= 0.95 * orig["retain_acc"]
    assert 0 < nm["kept_fraction"] < 0.5


@pytest.mark.slow
def test_demo_places_each_method_among_all_single_task_vectors(demo_doc):
    """Every candidate is scored at its own selected lambda; `beats_candidates` is the fraction of those single
    task vectors with a larger Avg.Gap, and the best/median rows are exactly their candidates' scores."""
    res = demo_doc["result"]
    cands = res["candidates"]
    gaps = [c["avg_gap"] for c in cands]
    assert all(0 <= g <= 100 for g in gaps)
    st = res["single_task_vectors"]
    assert st["n"] == 27
    assert st["avg_gap_min"] == min(gaps) and st["avg_gap_max"] == max(gaps)
    assert st["avg_gap_min"] <= st["avg_gap_q25"] <= st["avg_gap_median"] <= st["avg_gap_q75"] <= st["avg_gap_max"]
    assert st["avg_gap_median"] == pytest.approx(sorted(gaps)[13])
    m = {r["method"]: r for r in res["methods"]}
    for row in m.values():
        assert row["beats_candidates"] == pytest.approx(sum(g > row["avg_gap"] for g in gaps) / 27)
    assert m["retrain"]["beats_candidates"] == 1.0
    for name in ("task_arithmetic_best", "task_arithmetic_median"):
        c = cands[m[name]["candidate"]]
        for k in ("forget_acc", "retain_acc", "test_acc", "mia", "avg_gap"):
            assert m[name][k] == pytest.approx(c[k], abs=1e-9), (name, k)


def test_parse_pool():
    from icmltools.negmerge.api import parse_pool

    assert parse_pool("5,10,20;0,5e-4,5e-3;0,0.05,0.1") == {
        "ft_epochs": (5, 10, 20), "ft_weight_decay": (0.0, 5e-4, 5e-3), "ft_label_smoothing": (0.0, 0.05, 0.1)}
    assert parse_pool("5,10;0;0")["ft_label_smoothing"] == (0.0,)
    for bad in ("5,10;0", "5;0;0", "a;0;0", "5,5;0;0", "0,5;0;0", "5,10;-1;0", "5,10;0;1.0", "5,10;;0"):
        with pytest.raises(BadInputError, match="^pool: ") as ei:
            parse_pool(bad)
        assert ei.value.param == "pool"


@pytest.mark.slow
def test_cli_pool_on_tiny_demo(run_cli, tmp_path):
    out = tmp_path / "demo_run"
    _, doc = run_cli(["negmerge", "-q", "--preset", "tiny", "--pool", "5,10;0;0,0.1", "--methods", "negmerge",
                      "--out", str(out)])
    res = doc["result"]
    assert len(res["candidates"]) == 4 and res["single_task_vectors"]["n"] == 4
    assert res["config"]["ft_label_smoothing"] == [0.0, 0.1]
    # the run folder: config.json with the resolved demo config (written before the run), result.json = result
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "result.json"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"] == res["config"] and cfg["config"]["methods"] == ["negmerge"]
    assert json.loads((out / "result.json").read_text())["methods"] == res["methods"]
    assert doc["reference"]["arxiv"] == "2410.05583"
    res, _ = run_cli(["negmerge", "-q", "--preset", "tiny", "--pool", "5;0;0"], expect_code=2)
    assert "at least 2 candidates" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_demo_lambda_grid_resolves_each_boundary(demo_doc):
    """The selection rule is decided on a grid fine and wide enough for every merge: the selected lambda is
    past the first non-zero grid point and short of the grid's end, and the grid point after it breaks the
    retain constraint (so the pick sits at the boundary, not a coarse step before it)."""
    res = demo_doc["result"]
    grid = res["config"]["lam_grid"]
    step = grid[1] - grid[0]
    m = {r["method"]: r for r in res["methods"]}
    thr = 0.95 * m["original"]["retain_acc"]
    for name in ("negmerge", "uniform", "ties", "magmax"):
        curve = m[name]["lambda_curve"]
        lam = m[name]["lam"]
        assert grid[1] < lam < grid[-1], (name, lam)
        nxt = [r for r in curve if abs(r["lam"] - (lam + step)) < 1e-9]
        assert nxt and nxt[0]["retain_acc"] < thr, (name, lam)
    for name in ("task_arithmetic_best", "task_arithmetic_median"):
        cand = res["candidates"][m[name]["candidate"]]
        assert not cand["lam_at_grid_end"], name


@pytest.mark.parametrize("method", M.METHODS)
@pytest.mark.parametrize("dare", [0.0, 0.3])
def test_streaming_accumulator_equals_list_kernels(method, dare):
    """The buffered one-candidate-at-a-time path equals the plain per-tensor kernels (and the closed form)."""
    g = torch.Generator().manual_seed(5)
    base = {"w": torch.randn(40, 30, generator=g), "v": torch.randn(7, generator=g).to(torch.bfloat16)}
    # 8 candidates, not 6: the one-pass loop (_merge_models) compiles per model count and dtype, the merge-engine
    # tests compile 8 anyway; 6 compiled two more (73 s cold, benchmarks/numba_compile_profile.py, 2026-12-04)
    cands = [{k: v + (0.1 * torch.randn(v.shape, generator=g) + 0.02).to(v.dtype) for k, v in base.items()}
             for _ in range(8)]
    cfg = M.MergeConfig(method, index=2, dare_p=dare, ties_k=0.3, seed=4)
    tau, stats = M.merged_task_vector(MemoryReader(base), [MemoryReader(c) for c in cands], cfg)
    for k, v in base.items():
        taus = [c[k].float() - v.float() for c in cands]
        ref, kept = M.merge_tensor(taus, cfg, name=k)
        assert torch.equal(tau[k], ref), (method, k)
        assert stats.per_tensor[k] == (v.numel(), kept)
        if method == "negmerge" and dare == 0:
            assert torch.equal(tau[k], _closed_form(taus))


# --------------------------------------------------------------------------------------------- house pattern


def test_registry_matches_the_options_list():
    from icmltools.negmerge import options

    assert set(M.REGISTRY) == set(options.METHODS)
    assert all(m.name == k and m.reference for k, m in M.REGISTRY.items())
    assert S.parse_grid(options.DEMO_LAM_GRID_SPEC) == list(options.DEMO_LAM_GRID)
    assert options.DemoConfig.preset("quick").n_candidates == 27


def test_dare_masks_come_from_named_streams():
    """DARE's mask of candidate i's tensor `name` is derive(seed, "dare", name, i), alone or in a merge."""
    from icmltools.core.seed import derive

    g = torch.Generator().manual_seed(2)
    taus = [torch.randn(300, generator=g) for _ in range(3)]
    for i in range(3):
        cfg = M.MergeConfig("task_arithmetic", index=i, dare_p=0.4, seed=7)
        got, _ = M.merge_tensor(taus, cfg, name="layer.w")
        alone = M.dare_tensor(taus[i], 0.4, derive(7, "dare", "layer.w", i).torch())
        assert torch.equal(got, alone)
    other, _ = M.merge_tensor(taus, M.MergeConfig("task_arithmetic", index=0, dare_p=0.4, seed=8), name="layer.w")
    assert not torch.equal(other, M.merge_tensor(taus, M.MergeConfig("task_arithmetic", index=0, dare_p=0.4, seed=7),
                                                  name="layer.w")[0])


def _micro_demo():
    from icmltools.negmerge.options import DemoConfig

    return DemoConfig.preset("tiny", n_samples=600, n_test=200, hidden=32, epochs=3, ft_epochs=(2, 3),
                             ft_weight_decay=(0.0,), ft_label_smoothing=(0.0, 0.1), lam_grid=(0.0, 0.5, 1.0),
                             methods=("negmerge",))


def test_demo_stages_alone_equal_the_pipeline():
    """Data, original/retrain and each candidate, run alone with their stage keys, are bitwise the models of
    the whole seed; the global torch generator neither feeds nor is moved by the demo."""
    from icmltools.core.seed import derive
    from icmltools.negmerge import demo as D

    cfg, seed = _micro_demo(), 3
    torch.manual_seed(123)
    res = D.run_seed(cfg, seed, keep_models=True)
    after = torch.get_rng_state()
    torch.manual_seed(999)
    again = D.run_seed(cfg, seed, keep_models=True)
    assert [m["avg_gap"] for m in again["methods"]] == [m["avg_gap"] for m in res["methods"]]
    torch.manual_seed(123)
    assert torch.equal(after, torch.get_rng_state())  # run_seed drew nothing from the global generator
    models = res["_models"]
    data = D.make_data(cfg, seed)
    (Xr, yr), (Xf, yf) = data["retain"], data["forget"]
    original = D.train_from_scratch(cfg, torch.cat([Xr, Xf]), torch.cat([yr, yf]), derive(seed, "train"))
    retrain = D.train_from_scratch(cfg, Xr, yr, derive(seed, "train"))
    for k in original:
        assert torch.equal(original[k], models["original"][k]) and torch.equal(retrain[k], models["retrain"][k])
    for i, hp in enumerate(D.candidate_grid(cfg)):
        cand = D.finetune_on_forget(cfg, original, Xf, yf, hp["epochs"], hp["weight_decay"], hp["label_smoothing"],
                                    derive(seed, "finetune", i))
        assert all(torch.equal(cand[k], models["candidates"][i][k]) for k in cand), i
    # different stage keys give different streams
    assert not torch.equal(D.finetune_on_forget(cfg, original, Xf, yf, 2, 0.0, 0.0, derive(seed, "finetune", 1))["0.weight"],
                           models["candidates"][0]["0.weight"])


def test_cli_usage_errors_name_the_flags(tmp_path, run_cli):
    base, cands, bpath, cpaths = _write_models(tmp_path)
    cases = [
        (["--lam", "1", "--lam-grid", "0:1:0.5"], "either --lam or --lam-grid"),
        (["-c", cpaths[0]], "--candidate needs --base"),
        (["--base", bpath, "-c", cpaths[0], "-c", cpaths[1], "--lam", "1", "--pool", "5;0;0"], "--pool applies"),
        (["--base", bpath, "-c", cpaths[0], "-c", cpaths[1], "--lam-grid", "0:1:0.5"], "needs --eval-cmd"),
        (["--base", bpath, "--lam", "1"], "-c/--candidate"),
        # library errors name their parameter; the command shows the flag
        (["--base", bpath, "-c", cpaths[0], "-c", cpaths[1], "--lam", "1", "--method", "task_arithmetic",
          "--ta-index", "2"], "--ta-index: 2 is out of range"),
        (["--base", bpath, "-c", cpaths[0], "-c", cpaths[1], "--lam-grid", "1:0:1", "--eval-cmd", "true"],
         "--lam-grid: '1:0:1'"),
        (["--preset", "tiny", "--pool", "5;0"], "--pool: '5;0'"),
    ]
    for args, msg in cases:
        res, _ = run_cli(["negmerge", "-q", *args, "--out", str(tmp_path / "run")], expect_code=2)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error:") and msg in lines[0], (msg, res.stderr)
        assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------- reliability (issue 19)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Every bad input of BAD_INPUTS, built once; each test sees it as `in/` of its own working folder."""
    d = tmp_path_factory.mktemp("negmerge_inputs")
    base, cands = _models(n=3)
    write_state_dict(base, d / "base.safetensors")
    for i, c in enumerate(cands):
        write_state_dict(c, d / f"c{i}.safetensors")

    def variant(src: dict, name: str, **change):
        sd = dict(src)
        for k, v in change.items():
            if v is None:
                sd.pop(k.replace("__", "."))
            else:
                sd[k.replace("__", ".")] = v
        write_state_dict(sd, d / name)

    nan_w = base["a.w"].clone()
    nan_w[0, 0] = float("nan")
    variant(base, "nan_base.safetensors", a__w=nan_w)
    inf_b = cands[0]["a.b"].clone()
    inf_b[1] = float("inf")
    variant(cands[0], "inf_cand.safetensors", a__b=inf_b)
    ninf_h = cands[1]["h"].clone()
    ninf_h[0, 0] = -float("inf")
    variant(cands[1], "ninf_h.safetensors", h=ninf_h)
    variant(cands[0], "int_cand.safetensors", a__w=cands[0]["a.w"].to(torch.int32))
    variant(cands[0], "half_cand.safetensors", a__w=cands[0]["a.w"].half())
    variant(cands[0], "missing_key.safetensors", a__b=None)
    variant(cands[0], "extra.safetensors", extra__w=torch.zeros(2))
    variant(cands[0], "shape.safetensors", a__b=torch.zeros(4))
    for name, sd in [("half_base", base), ("half_c0", cands[0]), ("half_c1", cands[1])]:
        write_state_dict({k: v.half() if v.is_floating_point() else v for k, v in sd.items()}, d / f"{name}.safetensors")
    raw = (d / "c1.safetensors").read_bytes()
    (d / "trunc.safetensors").write_bytes(raw[:-9])
    (d / "junk.safetensors").write_bytes(b"\xff" * 64)
    (d / "empty.safetensors").write_bytes(b"")
    (d / "junk.bin").write_bytes(b"junk" * 16)
    for fmt, ext, prefix in (("torch", ".pt", ""), ("hf_safetensors", "", "hf_"), ("hf_torch", "", "hfpt_")):
        shards = [["a.w", "a.b"], ["bn.num_batches_tracked", "h"]] if fmt.startswith("hf") else None
        write_state_dict(base, d / f"{prefix}base{ext}", fmt=fmt, shards=shards)
        for i in range(2):
            write_state_dict(cands[i], d / f"{prefix}c{i}{ext}", fmt=fmt, shards=shards)
    raw = (d / "c0.pt").read_bytes()
    (d / "trunc.pt").write_bytes(raw[: len(raw) // 2])

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (d / "evil.pt").write_bytes(pickle.dumps({"state_dict": {"a.w": Evil()}}))
    torch.save({"a.w": Evil()}, d / "evil_zip.pt")
    shutil.copytree(d / "hf_c0", d / "hf_missing")
    (d / "hf_missing" / "model-00002-of-00002.safetensors").unlink()
    (d / "hf_empty").mkdir()
    (d / "hf_empty" / "config.json").write_text("{}")
    (d / "afile").write_text("a regular file")
    (d / "evok.py").write_text("import json\nprint(json.dumps({'forget_acc': 0.5, 'retain_acc': 0.9}))\n")
    (d / "evnan.py").write_text("import json\nprint(json.dumps({'forget_acc': float('nan'), 'retain_acc': 0.9}))\n")
    (d / "evfail.py").write_text("import sys\nprint('loading', file=sys.stderr)\n"
                                 "print('boom: cannot read the model', file=sys.stderr)\nsys.exit(3)\n")
    (d / "evfail_lam.py").write_text("import json, sys\nif not sys.argv[1].endswith('in/base.safetensors'):\n"
                                     "    sys.exit('no good at this lambda')\n"
                                     "print(json.dumps({'forget_acc': 0.5, 'retain_acc': 0.9}))\n")
    (d / "evkill.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    return d


B = ["--base", "in/base.safetensors"]
C3 = ["-c", "in/c0.safetensors", "-c", "in/c1.safetensors", "-c", "in/c2.safetensors"]
PY = sys.executable


def _cands(*names):
    return [a for n in names for a in ("-c", f"in/{n}")]


def _grid(script, grid="0:1:0.5"):
    return ["--lam-grid", grid, "--eval-cmd", f"{PY} in/{script}"]


def _row(id_, argv, code, msg):
    return pytest.param(argv, code, msg, id=id_)


BAD_INPUTS = [
    # lambda: non-finite values are usage errors (the shared float check); finite ones too large for the
    # dtype turn the output non-finite: a runtime failure naming the tensor, nothing written, any format
    *[_row(f"lam {v}", [*B, *C3, "--lam", v], 2, "'--lam': must be a finite number") for v in ("nan", "inf", "-inf")],
    _row("retain-ratio nan", [*B, *C3, *_grid("evok.py"), "--retain-ratio", "nan"], 2, "must be a finite number"),
    _row("lam-grid inf", [*B, *C3, *_grid("evok.py", "0,inf")], 2, "--lam-grid: '0,inf': values must be finite"),
    _row("lam-grid overflowing stop", [*B, *C3, *_grid("evok.py", "0:1e400:1")], 2, "values must be finite"),
    _row("lam-grid overflowing count", [*B, *C3, *_grid("evok.py", "0:1:1e-320")], 2, "more than 10000 points"),
    *[_row(f"lam 1e300 {fmt}", ["--base", f"in/{p}base{x}", *_cands(f"{p}c0{x}", f"{p}c1{x}"), "--lam", "1e300",
                                "--out", "run"], 1,
           "--lam: tensor 'a.w': theta_pre - lambda * tau is not finite in float32 at lambda = 1e+300 "
           "(lambda too large for the dtype?); nothing written")
      for fmt, p, x in (("safetensors", "", ".safetensors"), ("torch", "", ".pt"), ("hf_safetensors", "hf_", ""),
                        ("hf_torch", "hfpt_", ""))],
    _row("lam -1e300 no --out", [*B, *C3, "--lam", "-1e300"], 1, "not finite in float32 at lambda = -1e+300"),
    _row("lam 1e300 --format torch", [*B, *C3, "--lam", "1e300", "--format", "torch"], 1, "not finite in float32"),
    _row("float16 overflow", ["--base", "in/half_base.safetensors", *_cands("half_c0.safetensors", "half_c1.safetensors"),
                              "--lam", "1e6"], 1, "not finite in float16 at lambda = 1e+06"),
    _row("lam-grid 1e300", [*B, *C3, *_grid("evok.py", "0,1e300"), "--out", "run"], 1,
         "--lam-grid: tensor 'a.w': theta_pre - lambda * tau is not finite in float32 at lambda = 1e+300"),
    # non-finite tensors in the inputs: refused with the file and tensor named, with every method
    _row("nan in base", ["--base", "in/nan_base.safetensors", *C3, "--lam", "1"], 2,
         "--allow-non-finite: in/nan_base.safetensors: tensor 'a.w' holds 1 NaN/inf value (of 30); non-finite "
         "inputs are refused unless allowed"),
    *[_row(f"inf in candidate {m}", [*B, *_cands("inf_cand.safetensors", "c1.safetensors", "c2.safetensors"),
                                     "--method", m, "--ta-index", "0", "--lam", "1"], 2,
           "in/inf_cand.safetensors: tensor 'a.b' holds 1 NaN/inf value (of 5)") for m in M.METHODS],
    _row("-inf in a bfloat16 tensor", [*B, *_cands("c0.safetensors", "ninf_h.safetensors"), "--lam", "1"], 2,
         "in/ninf_h.safetensors: tensor 'h' holds 1 NaN/inf value (of 18)"),
    _row("nan in base, lambda grid", ["--base", "in/nan_base.safetensors", *C3, *_grid("evok.py")], 2,
         "in/nan_base.safetensors: tensor 'a.w' holds 1 NaN/inf"),
    _row("allowed inf reaching the output", [*B, *_cands("inf_cand.safetensors", "c1.safetensors"), "--method",
                                             "uniform", "--lam", "1", "--allow-non-finite", "--out", "run"], 1,
         "--allow-non-finite: tensor 'a.b' of the output would hold NaN/inf at lambda = 1: the non-finite input "
         "values let in reach it; nothing written"),
    # mismatches between base and candidates
    _row("integer tensor", [*B, *_cands("c0.safetensors", "int_cand.safetensors"), "--lam", "1"], 2,
         "in/int_cand.safetensors: tensor 'a.w' has dtype int32, the base has float32"),
    _row("dtype", [*B, *_cands("c0.safetensors", "half_cand.safetensors"), "--lam", "1"], 2,
         "tensor 'a.w' has dtype float16, the base has float32"),
    _row("missing key", [*B, *_cands("c0.safetensors", "missing_key.safetensors"), "--lam", "1"], 2,
         "in/missing_key.safetensors: tensor 'a.b' of the base in/base.safetensors is missing"),
    _row("extra key", [*B, *_cands("c0.safetensors", "extra.safetensors"), "--lam", "1"], 2,
         "tensor 'extra.w' is not in the base"),
    _row("shape", [*B, *_cands("c0.safetensors", "shape.safetensors"), "--lam", "1"], 2,
         "tensor 'a.b' has shape [4], the base has [5]"),
    # corrupt, unreadable or mistaken files
    _row("truncated safetensors", [*B, *_cands("c0.safetensors", "trunc.safetensors"), "--lam", "1"], 2,
         "in/trunc.safetensors: corrupt or truncated safetensors file"),
    _row("junk safetensors", [*B, *_cands("c0.safetensors", "junk.safetensors"), "--lam", "1"], 2,
         "in/junk.safetensors: corrupt or truncated safetensors file"),
    _row("empty file", [*B, *_cands("c0.safetensors", "empty.safetensors"), "--lam", "1"], 2,
         "in/empty.safetensors: file is empty"),
    _row("truncated torch zip", [*B, *_cands("c0.safetensors", "trunc.pt"), "--lam", "1"], 2,
         "in/trunc.pt: corrupt or truncated torch checkpoint (its zip archive is incomplete)"),
    _row("pickle with code", [*B, *_cands("c0.safetensors", "evil.pt"), "--lam", "1"], 2,
         "in/evil.pt: refused to load"),
    _row("zip pickle with code", [*B, *_cands("c0.safetensors", "evil_zip.pt"), "--lam", "1"], 2,
         "in/evil_zip.pt: refused to load: the pickle needs code or globals that a weights-only load does not "
         "allow (Trying to load unsupported GLOBAL posix.system"),
    _row("unknown bytes", [*B, *_cands("c0.safetensors", "junk.bin"), "--lam", "1"], 2,
         "in/junk.bin: not a torch checkpoint (neither a zip archive nor a pickle)"),
    _row("the JSON record as a checkpoint", [*B, *_cands("c0.safetensors", "c1.safetensors.json"), "--lam", "1"], 2,
         "in/c1.safetensors.json: a JSON file, not a checkpoint (the record written next to a checkpoint"),
    _row("HF folder missing a shard", [*B, *_cands("c0.safetensors", "hf_missing"), "--lam", "1"], 2,
         "in/hf_missing/model-00002-of-00002.safetensors: shard listed in the index is missing"),
    _row("folder without weights", [*B, *_cands("c0.safetensors", "hf_empty"), "--lam", "1"], 2,
         "in/hf_empty: folder has none of"),
    _row("missing file", [*B, *_cands("c0.safetensors", "nope.safetensors"), "--lam", "1"], 2,
         "in/nope.safetensors: no such file or folder"),
    _row("base as a candidate", [*B, *_cands("c0.safetensors", "base.safetensors"), "--lam", "1"], 2,
         "--candidate: in/base.safetensors: is the base itself (its task vector is zero)"),
    _row("candidate twice", [*B, "-c", "in/c0.safetensors", "-c", "./in/c0.safetensors", "--lam", "1"], 2,
         "--candidate: ./in/c0.safetensors: given twice (also as in/c0.safetensors)"),
    _row("one candidate", [*B, "-c", "in/c0.safetensors", "--lam", "1"], 2, "at least 2 candidates"),
    # options of the other mode, or that would be ignored
    _row("--allow-non-finite in the demo", ["--allow-non-finite"], 2,
         "--allow-non-finite applies to merges of your checkpoints only (with --base)"),
    _row("--method in the demo", ["--method", "ties"], 2, "--method applies to merges of your checkpoints only"),
    _row("--preset with --base", [*B, *C3, "--lam", "1", "--preset", "tiny"], 2,
         "--preset applies to the embedded demo only (not with --base)"),
    _row("--eval-cmd with --lam", [*B, *C3, "--lam", "1", "--eval-cmd", f"{PY} in/evok.py"], 2,
         "--eval-cmd evaluates the checkpoints of a --lam-grid search"),
    _row("--eval-timeout 0", [*B, *C3, *_grid("evok.py"), "--eval-timeout", "0"], 2, "--eval-timeout"),
    # the evaluation command: found before any work; a failure is one line naming it, the checkpoint, the
    # exit status and the last line it printed; the run folder goes
    _row("eval program missing", [*B, *C3, "--lam-grid", "0:1:0.5", "--eval-cmd", "no-such-program-xyz {checkpoint}"],
         2, "--eval-cmd: program 'no-such-program-xyz' not found (or not executable)"),
    _row("eval fails on the base", [*B, *C3, *_grid("evfail.py"), "--out", "run"], 1,
         f"--eval-cmd: '{PY} in/evfail.py' exited with status 3 on the base in/base.safetensors: boom: cannot read "
         "the model"),
    _row("eval fails, default run folder", [*B, *C3, *_grid("evfail.py")], 1, "exited with status 3"),
    _row("eval fails at a lambda", [*B, *C3, *_grid("evfail_lam.py"), "--out", "run"], 1,
         f"'{PY} in/evfail_lam.py' exited with status 1 on the checkpoint for lambda = 0.5: no good at this lambda"),
    _row("eval killed", [*B, *C3, *_grid("evkill.py"), "--out", "run"], 1, "was killed by signal SIGKILL on the base"),
    _row("eval prints NaN", [*B, *C3, *_grid("evnan.py"), "--out", "run"], 1,
         "'forget_acc' missing or not a finite number (got nan)"),
    # outputs
    _row("--out under a file", [*B, *C3, "--lam", "1", "--out", "in/afile/run"], 1,
         "cannot write in/afile/run: not a directory"),
    _row("--out a non-empty folder", [*B, *C3, "--lam", "1", "--out", "in/hf_empty"], 2, "directory is not empty"),
    # the demo (the tiny preset fails in about a second)
    _row("demo lam 1e300", ["--preset", "tiny", "--lam", "1e300", "--out", "run"], 1,
         "tensor '0.weight': theta_pre - lambda * tau is not finite in float32 at lambda = 1e+300"),
    _row("demo pool diverges", ["--preset", "tiny", "--pool", "5,10;1e3;0", "--out", "run"], 2,
         "--pool: candidate 0 (epochs 5, weight decay 1000, label smoothing 0) diverged to NaN/inf weights"),
]


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("argv,code,msg", BAD_INPUTS)
def test_bad_inputs(argv, code, msg, inputs, tmp_path, monkeypatch):
    """Exit code, one `Error:` line holding `msg`, no traceback, nothing on stdout, no file left behind (in
    the working folder, the run folders under ICML_RUNS_DIR, or next to the inputs)."""
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").symlink_to(inputs)
    before = _snapshot(inputs)
    res = CliRunner().invoke(cli, ["negmerge", "-q", "--threads", "1", *argv])
    assert res.exit_code == code, (res.exit_code, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    assert msg in lines[0], (msg, lines[0])
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert _snapshot(inputs) == before


def test_allowed_non_finite_inputs_are_listed_and_the_output_is_finite(tmp_path):
    """With allow_non_finite, NegMerge drops an element that is NaN in one candidate (no strict sign
    consensus) and says which tensors held NaN/inf; uniform would carry it into the output: refused, with
    nothing at the output path."""
    base, cands = _models(n=3)
    cands[1]["a.w"][2, 3] = float("nan")
    b, cs = MemoryReader(base), [MemoryReader(c) for c in cands]
    with pytest.raises(BadInputError, match=r"<memory>: tensor 'a.w' holds 1 NaN/inf value \(of 30\)") as ei:
        M.merge_to_checkpoint(b, cs, M.MergeConfig(), 1.0, tmp_path / "m.safetensors")
    assert ei.value.param == "allow_non_finite"
    stats = M.merge_to_checkpoint(b, cs, M.MergeConfig(), 1.0, tmp_path / "m.safetensors", allow_non_finite=True)
    assert stats.summary()["non_finite_inputs"] == [{"file": "<memory>", "tensor": "a.w", "count": 1}]
    out = open_checkpoint(tmp_path / "m.safetensors")
    assert all(torch.isfinite(out.get(k).float()).all() for k in ("a.w", "a.b", "h"))
    clean = [dict(c) for c in cands]
    clean[1]["a.w"] = clean[1]["a.w"].clone()
    clean[1]["a.w"][2, 3] = base["a.w"][2, 3]  # a zero task-vector entry is dropped too: the same merge
    tau, _ = M.merged_task_vector(b, [MemoryReader(c) for c in clean], M.MergeConfig())
    assert torch.equal(out.get("a.w"), base["a.w"] - tau["a.w"])
    with pytest.raises(RuntimeFailure, match="tensor 'a.w' of the output would hold NaN/inf") as ei:
        M.merge_to_checkpoint(b, cs, M.MergeConfig("uniform"), 1.0, tmp_path / "u.safetensors", allow_non_finite=True)
    assert ei.value.param == "allow_non_finite" and not (tmp_path / "u.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "m.safetensors.json"]


def test_cli_allow_non_finite_reports_the_inputs(inputs, tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").symlink_to(inputs)
    _, doc = run_cli(["negmerge", "-q", *B, *_cands("inf_cand.safetensors", "c1.safetensors"), "--lam", "1",
                      "--allow-non-finite", "--out", "run"])
    stats = doc["result"]["stats"]
    assert stats["non_finite_inputs"] == [{"file": "in/inf_cand.safetensors", "tensor": "a.b", "count": 1}]
    assert read_record(doc["result"]["output"])["allow_non_finite"] is True
    out = open_checkpoint(doc["result"]["output"])
    assert all(torch.isfinite(out.get(k).float()).all() for k in ("a.w", "a.b", "h"))


def test_non_finite_output_in_memory_names_the_tensor():
    """The demo's path (apply_to_state_dict) refuses a lambda that overflows, naming tensor, dtype and lambda."""
    base, cands = _models(n=2)
    tau, _ = M.merged_task_vector(MemoryReader(base), [MemoryReader(c) for c in cands], M.MergeConfig("uniform"))
    assert M.apply_to_state_dict(base, tau, 1e30)["a.w"].isfinite().all()  # large but finite in float32
    with pytest.raises(RuntimeFailure, match=r"tensor 'h': theta_pre - lambda \* tau is not finite in bfloat16 "
                                             r"at lambda = 1e\+300") as ei:
        M.apply_to_state_dict({"h": base["h"]}, {"h": tau["h"]}, 1e300)
    assert ei.value.param is None


@pytest.mark.parametrize("method,dare", [(m, 0.0) for m in M.METHODS] + [("negmerge", 0.5)])
def test_finite_check_finds_each_input_tensor(method, dare):
    """Every float tensor read is checked, through the merge's running sum (negmerge, uniform,
    task_arithmetic: one reduction, then the inputs one by one) or input by input (magmax, ties, and any
    merge with DARE, whose drops could hide a NaN): a NaN or inf in any float tensor of the base or of a
    candidate read is found, and the first one (base, then candidates in order) is named, or all are listed
    when allowed."""
    base, cands = _models(n=3, dtype=torch.float64)
    cfg = M.MergeConfig(method, index=1, dare_p=dare)
    readers = [0, 2] if method == "task_arithmetic" else [0, 1, 2, 3]  # 0 = base; task_arithmetic reads c1 only
    for who in readers:
        for k, bad in (("a.w", float("nan")), ("a.b", float("inf")), ("h", -float("inf"))):
            sd = [dict(base)] + [dict(c) for c in cands]
            t = sd[who][k].clone()
            t.view(-1)[-1] = bad
            sd[who][k] = t
            bs, cs = MemoryReader(sd[0], name="m0"), [MemoryReader(c, name=f"m{i + 1}") for i, c in enumerate(sd[1:])]
            with pytest.raises(BadInputError, match=f"^allow_non_finite: m{who}: tensor '{k}' holds 1 NaN/inf"):
                M.merged_task_vector(bs, cs, cfg)
            _, stats = M.merged_task_vector(bs, cs, cfg, allow_non_finite=True)
            assert stats.non_finite_inputs == [{"file": f"m{who}", "tensor": k, "count": 1}]
    if method == "task_arithmetic":  # an unread candidate is not checked (it takes no part)
        sd = [dict(c) for c in cands]
        sd[0]["a.w"] = sd[0]["a.w"] * float("nan")
        M.merged_task_vector(MemoryReader(base), [MemoryReader(c) for c in sd], cfg)


def test_task_vector_overflow_from_finite_inputs_is_the_output_checks_call(tmp_path):
    """Finite inputs whose difference overflows float32 turn the running sum non-finite; every input is found
    finite, so the merge goes on and the non-finite output is refused (nothing written)."""
    base = {"w": torch.full((4,), -3e38)}
    cands = [{"w": torch.full((4,), 3e38)}, {"w": torch.full((4,), 3e38)}]
    with pytest.raises(RuntimeFailure, match="tensor 'w': theta_pre - lambda"):
        M.merge_to_checkpoint(MemoryReader(base), [MemoryReader(c) for c in cands], M.MergeConfig(), 1.0,
                              tmp_path / "m.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_demo_refuses_a_diverged_candidate():
    from icmltools.negmerge import demo as D

    state = {"w": torch.ones(3), "n": torch.tensor(2)}
    D._check_diverged(state, 0, {"epochs": 5, "weight_decay": 0.0, "label_smoothing": 0.0})
    state["w"][1] = float("inf")
    with pytest.raises(BadInputError, match=r"^pool: candidate 4 \(epochs 5, weight decay 1000, label smoothing "
                                            r"0.1\) diverged") as ei:
        D._check_diverged(state, 4, {"epochs": 5, "weight_decay": 1e3, "label_smoothing": 0.1})
    assert ei.value.param == "pool"


def test_eval_command_failures_name_the_command(tmp_path):
    """Exit status and last line of stderr, or the signal; the program is looked up when the evaluator is made."""
    fail = tmp_path / "fail.py"
    fail.write_text("import sys\nprint('step 1', file=sys.stderr)\nprint('Error: no weights', file=sys.stderr)\n"
                    "sys.exit(5)\n")
    cmd = f"{sys.executable} {fail}"
    with pytest.raises(RuntimeFailure, match=re.escape(f"'{cmd}' exited with status 5 on ckpt-7: Error: no weights")):
        S.CommandEvaluator(cmd)("p", label="ckpt-7")
    quiet = tmp_path / "quiet.py"
    quiet.write_text("import sys\nsys.exit(2)\n")
    with pytest.raises(RuntimeFailure, match=r"exited with status 2 on p: \(no output\)"):
        S.CommandEvaluator(f"{sys.executable} {quiet}")("p")
    kill = tmp_path / "kill.py"
    kill.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    with pytest.raises(RuntimeFailure, match="was killed by signal SIGTERM on p"):
        S.CommandEvaluator(f"{sys.executable} {kill}")("p")
    with pytest.raises(BadInputError, match="program 'no-such-program-xyz' not found") as ei:
        S.CommandEvaluator("no-such-program-xyz --ckpt {checkpoint}")
    assert ei.value.param == "eval_cmd"
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(5)\n")
    with pytest.raises(RuntimeFailure, match=re.escape(f"'{sys.executable} {slow}' timed out after 0.2 s on p")):
        S.CommandEvaluator(f"{sys.executable} {slow}", timeout=0.2)("p")
