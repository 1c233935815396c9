"""NegMerge: exact mask cases, streamed merges vs closed forms, lambda rule, eval command, CLI, demo effect."""
import json
import os
import pickle
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
    cands = [{k: v + (0.1 * torch.randn(v.shape, generator=g) + 0.02).to(v.dtype) for k, v in base.items()}
             for _ in range(6)]
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
