"""icml lowrank: exact checks of the compressor (spec acceptance), the nets' cost formulas, the sweep's
stages, the tabular protocol, the CLI and bad inputs."""
from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
import torch
from click.testing import CliRunner

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive
from icmltools.lowrank import approx, compress, nets, options, svd, uci
from icmltools.lowrank.options import ApproxConfig, CompressConfig, TrainConfig, UciConfig
from icmltools.taskvec import open_checkpoint, write_state_dict


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def trained_like(width=64, depth=3, seed=0):
    """A classical net with spread-out singular values (random init is enough for exact checks)."""
    with derive(seed, "test", "net", width).torch_init():
        return nets.build_net(4, 1, depth, width)


def state_of(path) -> dict:
    with open_checkpoint(path) as rd:
        return {k: rd.get(k) for k in rd.keys()}


def compressed(tmp_path, net, name="m.safetensors", **cfg):
    src = tmp_path / name
    write_state_dict({k: v.detach() for k, v in net.state_dict().items()}, src,
                     fmt="torch" if name.endswith(".pt") else "safetensors")
    res = compress.compress_checkpoint(src, tmp_path / "out", CompressConfig(**cfg))
    return src, res


# --------------------------------------------------------------------------------------------- exact checks


def test_full_rank_reproduces_outputs(tmp_path):
    net = trained_like()
    _, res = compressed(tmp_path, net, rank_ratio=1.0, force=True)
    small = nets.build_net(4, 1, 3, 64)
    nets.load_factored(small, state_of(res["output"]), json.loads((tmp_path / "out" / options.MAP_NAME).read_text()))
    x = torch.rand(512, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert float((small(x) - net(x)).abs().max()) < 1e-5
    assert all(r["rel_fro_err"] < 1e-6 for r in res["layers"]) and [r["rank"] for r in res["layers"]] == [64, 64]


@pytest.mark.parametrize("rank", [1, 7, 21, 40])
def test_singular_value_error_equals_the_measured_error(rank):
    w = torch.randn(48, 80, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    f = svd.exact(w, rank)
    assert abs(f.rel_fro_err - svd.measured_error(w, f.up, f.down)) < 1e-5
    assert f.up.shape == (48, rank) and f.down.shape == (rank, 80)


@pytest.mark.parametrize("shape,dtype", [((96, 96), torch.float32), ((150, 60), torch.float32), ((60, 150), torch.float32),
                                         ((80, 120), torch.float16), ((64, 64), torch.bfloat16)])
def test_gram_solver_matches_the_float64_svd(shape, dtype):
    """The exact solver for 32/16-bit weights (float64 Gram eigendecomposition) against LAPACK's float64 SVD of the
    same matrix: the same Eckart-Young error and singular values to float32 resolution, and a product as close
    to the float64 truncation as float32 factors can be."""
    g = torch.Generator().manual_seed(sum(shape))
    k = min(shape)
    u, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=g, dtype=torch.float64))
    s = 0.93 ** torch.arange(k, dtype=torch.float64)               # decaying spectrum, distinct values
    w = ((u * s) @ v.T).to(dtype)
    w64 = w.double()
    u0, s0, vh0 = torch.linalg.svd(w64, full_matrices=False)
    for rank in (1, k // 3, k):
        f = svd.exact(w, rank)
        assert f.solver == "gram" and f.up.dtype == torch.float32 and f.up.shape == (shape[0], rank)
        assert abs(f.rel_fro_err - svd.tail_error(s0, rank)) < 1e-6
        best = (u0[:, :rank] * s0[:rank]) @ vh0[:rank]
        assert float((f.up.double() @ f.down.double() - best).norm() / w64.norm()) < 2e-6
        assert abs(svd.measured_error(w.float(), f.up, f.down) - f.rel_fro_err) < 1e-5
    assert svd.exact(w64, 3).solver == "svd"                          # float64 weights keep LAPACK's SVD


@pytest.mark.parametrize("shape", [(70, 50), (64, 64), (40, 90)])
def test_exact_solver_reads_the_weight_in_row_blocks(shape):
    """Streamed use: a tall or square W is read only in row blocks (twice: for G, then for the factors), so the
    peak is G and the vectors, never W whole beside them; a wide W is read whole once, for WW'. Same bits as the
    solver on the tensor itself."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    calls = []

    def rows(a, b):
        calls.append(b - a)
        return w[a:b].clone()

    f = svd.exact(svd.Rows(shape, w.dtype, rows), 10)
    ref = svd.exact(w, 10)
    assert torch.equal(f.up, ref.up) and torch.equal(f.down, ref.down) and f.rel_fro_err == ref.rel_fro_err
    step = svd._step(shape[0])
    if shape[0] >= shape[1]:
        assert max(calls) == step < shape[0] and sum(calls) == 2 * shape[0]
    else:
        assert calls[0] == shape[0] and max(calls[1:]) == step and sum(calls[1:]) == shape[0]


def test_streamed_exact_refuses_non_finite_rows(tmp_path):
    sd = {"a.weight": torch.randn(64, 64)}
    sd["a.weight"][40, 3] = float("inf")
    write_state_dict(sd, tmp_path / "x.safetensors")
    with open_checkpoint(tmp_path / "x.safetensors") as rd:
        with pytest.raises(BadInputError, match="'a.weight' has 1 non-finite"):
            svd.exact(compress.row_source(rd, "a.weight", "cpu"), 5)


def test_randomized_error_is_never_below_the_exact_error():
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(200, 120, generator=g))
    v, _ = torch.linalg.qr(torch.randn(150, 120, generator=g))
    w = (u * (0.9 ** torch.arange(120.0))) @ v.T  # decaying spectrum
    for rank in (5, 20, 60):
        ex = svd.exact(w, rank).rel_fro_err
        rnd = svd.randomized(w, rank, 10, 2, derive(0, "t", rank))
        assert rnd.rel_fro_err >= ex - 1e-6                  # Eckart-Young
        assert rnd.rel_fro_err < ex * 1.5 + 1e-3             # and close with q = r + 10, two power iterations


def test_randomized_is_reproducible_from_its_stream():
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    a, b = (svd.randomized(w, 8, 10, 2, derive(5, "k")) for _ in range(2))
    assert torch.equal(a.up, b.up) and torch.equal(a.down, b.down)


def test_mac_and_param_formulas():
    for w in (6, 32, 64, 128, 129):
        for depth in (2, 3, 4):
            for rank in (None, w // 3, w // 2):
                net = nets.build_net(5, 2, depth, w, rank)
                c = nets.cost(net)
                assert c["macs"] == nets.net_macs(5, 2, depth, w, rank)
                hidden = w * w if rank is None else w * rank + rank * w + w
                assert c["params"] == 5 * w + w + (depth - 1) * (hidden + (w if rank is None else 0)) + 2 * w + 2
        r = nets.rank_for(w, Fraction(1, 3))
        assert r == int(w / 3) and 2 * w * r <= w * w * 2 / 3        # >= 1/3 saved per hidden layer
        half = nets.rank_for(w - w % 2, Fraction(1, 2))
        ww = w - w % 2
        assert nets.cost(nets.build_net(3, 1, 3, ww, half))["params"] == nets.cost(nets.build_net(3, 1, 3, ww))["params"]


def test_spec_reference_macs():
    assert nets.net_macs(4, 1, 3, 32, None) == 2208 and nets.net_macs(4, 1, 3, 32, 10) == 1440
    assert nets.net_macs(4, 1, 3, 128, None) == 33408 and nets.net_macs(4, 1, 3, 128, 42) == 22144


def test_factored_file_loads_strictly_into_the_low_rank_net(tmp_path):
    net = trained_like(width=96)
    _, res = compressed(tmp_path, net)  # default ratio 1/3: the paper's r = int(W/3)
    lowrank_net = nets.build_net(4, 1, 3, 96, rank=int(96 / 3))
    lowrank_net.load_state_dict(state_of(res["output"]), strict=True)
    assert res["totals"]["param_saving"] == pytest.approx(1 - 32 * 192 / 96 ** 2)


def test_safetensors_round_trip_is_bitwise(tmp_path):
    net = trained_like().to(torch.float16)
    src, res = compressed(tmp_path, net)
    inp, out = state_of(src), state_of(res["output"])
    for k in ("0.weight", "0.bias", "6.weight", "6.bias"):         # copied tensors: bitwise
        assert torch.equal(out[k], inp[k]) and out[k].dtype == torch.float16
    for key, r in (("2.weight", 21), ("4.weight", 21)):             # factors: bitwise what the SVD gave
        f = svd.exact(inp[key].float(), r)
        p = key[:-len(".weight")]
        assert torch.equal(out[p + ".up.weight"], f.up.half()) and torch.equal(out[p + ".down.weight"], f.down.half())
        assert torch.equal(out[p + ".up.bias"], inp[p + ".bias"])
    assert "2.bias" not in out and "2.weight" not in out


def test_dense_format_keeps_keys_and_error(tmp_path):
    net = trained_like()
    src, res = compressed(tmp_path, net, fmt="dense", rank_ratio=0.25)
    inp, out = state_of(src), state_of(res["output"])
    assert list(out) == list(inp)
    for r in res["layers"]:
        w = inp[r["key"]]
        assert abs(float((out[r["key"]] - w).norm() / w.norm()) - r["rel_fro_err"]) < 1e-5


def test_energy_rank():
    s = torch.tensor([3.0, 2.0, 1.0])            # energies 9, 4, 1 of 14
    assert [svd.rank_from_energy(s, e) for e in (0.5, 9 / 14, 0.9, 13 / 14, 0.95, 1.0)] == [1, 1, 2, 2, 3, 3]
    assert svd.rank_from_ratio((64, 30), 1 / 3) == 10 and svd.rank_from_ratio((5, 5), 0.01) == 1


def test_energy_mode_keeps_the_energy(tmp_path):
    _, res = compressed(tmp_path, trained_like(), energy=0.8, force=True)
    for r in res["layers"]:
        assert r["rel_fro_err"] ** 2 <= 0.2 + 1e-6


def test_torch_and_sharded_inputs_keep_their_format(tmp_path):
    net = trained_like()
    sd = {k: v.detach() for k, v in net.state_dict().items()}
    _, res = compressed(tmp_path, net, name="m.pt")
    assert res["output"].endswith("compressed.pt") and "2.down.weight" in state_of(res["output"])
    folder = tmp_path / "hf"
    write_state_dict(sd, folder, fmt="hf_safetensors", shards=[["0.weight", "0.bias", "2.weight", "2.bias"],
                                                                ["4.weight", "4.bias", "6.weight", "6.bias"]])
    res = compress.compress_checkpoint(folder, tmp_path / "out2", CompressConfig())
    out = tmp_path / "out2" / "compressed"
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["2.down.weight"] == index["2.up.bias"] != index["4.up.weight"]
    assert set(state_of(out)) == set(state_of(res["output"]))


def test_skips_are_reported(tmp_path):
    sd = {"embed.weight": torch.randn(100, 32), "a.weight": torch.randn(64, 64), "b.weight": torch.randn(8, 64),
          "c.weight": torch.randn(4, 4, 4), "i.weight": torch.ones(64, 64, dtype=torch.int32),
          "h.weight": torch.randn(64, 300)}
    write_state_dict(sd, tmp_path / "x.safetensors")
    res = compress.compress_checkpoint(tmp_path / "x.safetensors", tmp_path / "o", CompressConfig(rank_ratio=0.5))
    why = {s["key"]: s["reason"] for s in res["skipped"]}
    assert [(r["key"], r["rank"]) for r in res["layers"]] == [("h.weight", 32)]
    assert why["embed.weight"] == "excluded" and "smaller than 16" in why["b.weight"] and "3-D" in why["c.weight"]
    assert "int32" in why["i.weight"] and "saves nothing" in why["a.weight"]


def test_non_finite_weight_is_named_and_nothing_is_written(tmp_path):
    sd = {"a.weight": torch.randn(64, 64), "z.weight": torch.randn(64, 64)}
    sd["z.weight"][3, 4] = float("nan")
    write_state_dict(sd, tmp_path / "x.safetensors")
    with pytest.raises(BadInputError, match="'z.weight' has 1 non-finite"):
        compress.compress_checkpoint(tmp_path / "x.safetensors", tmp_path / "o", CompressConfig())
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_shape_mismatch_on_load_names_the_tensor(tmp_path):
    _, res = compressed(tmp_path, trained_like())
    state = state_of(res["output"])
    lmap = json.loads((tmp_path / "out" / options.MAP_NAME).read_text())
    wrong = {k: dict(v, rank=v["rank"] + 1) for k, v in lmap.items()}
    with pytest.raises(BadInputError, match=r"tensor '2.down.weight' has shape \[21, 64\], the model expects \[22, 64\]"):
        nets.load_factored(nets.build_net(4, 1, 3, 64), state, wrong, source="f")


# --------------------------------------------------------------------------------------------- the study


SMALL = ApproxConfig(widths=(16,), ratios=("full", "1/2"), n_train=256, n_test=256, seeds=2, train=TrainConfig(epochs=2))


def test_pareto_exact():
    assert approx.pareto([(1, 5), (2, 3), (3, 4), (2, 3), (4, 1)]) == [True, True, False, True, True]


def test_holder_target_is_normalised_and_seeded():
    from icmltools.lowrank.targets import holder_target

    f, g = holder_target(0, 0, 4, 1.5), holder_target(0, 0, 4, 1.5)
    x = derive(0, "t").numpy().uniform(0, 1, (5000, 4))
    assert float(abs(f(x)).max()) <= 1.05 and (f(x) == g(x)).all() and f.scale > 0
    assert not (holder_target(0, 1, 4, 1.5)(x) == f(x)).all()


def test_stage_alone_equals_the_pipeline():
    res = approx.run(SMALL, 7)
    data = approx.make_data(SMALL, 7, 1, 1.5)
    alone = approx.fit_one(SMALL, 7, 1, 1.5, 16, "1/2", Fraction(1, 2), data)
    inside = [r for r in res["runs"] if (r["rep"], r["ratio"]) == (1, "1/2")][0]
    assert alone["rel_rmse"] == inside["rel_rmse"] and alone["params"] == inside["params"]
    row = [r for r in res["summary"] if r["ratio"] == "1/2"][0]
    assert row["seeds"] == 2 and set(row["vs_full"]) >= {"p_classical_better", "p_lowrank_better", "n"}


def test_bad_ratios():
    with pytest.raises(BadInputError, match="outside"):
        nets.parse_ratio("3/2")
    with pytest.raises(BadInputError, match="not a ratio"):
        nets.parse_ratio("third")
    assert nets.parse_ratio("full") is None and nets.parse_ratio("0.5") == Fraction(1, 2)


@pytest.mark.slow
def test_classical_w128_reaches_the_acceptance_error():
    """Spec acceptance: classical W = 128, beta = 1.5 reaches rel_rmse < 0.1 under the spec's training protocol
    (100 epochs; the 60-epoch default of the quick sweep gives 0.115 on seed 0). Low-rank vs classical is
    reported, not asserted."""
    cfg = ApproxConfig(widths=(128,), ratios=("full",), train=TrainConfig(epochs=100))
    res = approx.run(cfg, 0)
    assert res["summary"][0]["rel_rmse"] < 0.1


# --------------------------------------------------------------------------------------------- tabular


def test_uci_protocol_runs_on_iris():
    cfg = UciConfig(dataset="iris", folds=3, epochs=3, depths=(2,), width_mults=(4, 5))
    r = uci.run(cfg, 0)
    assert r["task"] == "classification" and r["rows"] == 150 and len(r["grid_search"]["grid"]) == 2
    assert r["rank"] == int(r["width"] / 3) and len(r["classical"]["scores"]) == 3
    assert r["lowrank"]["macs"] < r["classical"]["macs"]


def test_csv_dummies_task_and_errors(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,colour,y\n0.1,red,1.5\n0.2,blue,2.5\n0.3,red,3.25\n0.5,green,0.5\n")
    x, y_raw, names, tname = uci.read_csv(p, None)
    assert names == ["a", "colour=blue", "colour=green", "colour=red"] and tname == "y" and x.shape == (4, 4)
    assert uci.infer_task(y_raw, "auto") == "regression" and uci.infer_task(["0", "1", "1"], "auto") == "classification"
    (tmp_path / "e.csv").write_text("a,y\n1,2\n,3\n4,5\n")
    with pytest.raises(BadInputError, match="line 3, column 'a' is empty"):
        uci.read_csv(tmp_path / "e.csv", None)
    with pytest.raises(BadInputError, match="no column 'q'"):
        uci.read_csv(p, "q")


# --------------------------------------------------------------------------------------------- CLI


def test_compress_cli(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_state_dict({k: v.detach() for k, v in trained_like().state_dict().items()}, tmp_path / "m.safetensors")
    _, doc = run_cli(["lowrank", "compress", "-q", "m.safetensors", "--out", "o", "--svd", "randomized", "--device", "cpu"])
    r = doc["result"]
    assert doc["command"] == "lowrank" and "Low-Rank Swish" in doc["reference"]["title"]
    assert [x["rank"] for x in r["layers"]] == [21, 21] and r["totals"]["mac_saving"] == pytest.approx(1 - 21 * 128 / 4096)
    assert {p.name for p in (tmp_path / "o").iterdir()} == {"config.json", "result.json", "compressed.safetensors",
                                                             "compressed.safetensors.json", options.MAP_NAME}


def test_check_cli_loads_a_factored_file_strictly(run_cli, tmp_path, monkeypatch):
    """`icml lowrank check`: the run folder (map found there), the file with its record, and the dense model."""
    monkeypatch.chdir(tmp_path)
    net = trained_like(width=96)
    write_state_dict({k: v.detach() for k, v in net.state_dict().items()}, tmp_path / "m.safetensors")
    compress.compress_checkpoint(tmp_path / "m.safetensors", tmp_path / "run", CompressConfig())
    _, doc = run_cli(["lowrank", "check", "-q", "run"])
    r = doc["result"]
    assert r["strict_load"] and r["map"].endswith(options.MAP_NAME) and r["model"] is None
    assert [(x["prefix"], x["shape"], x["rank"], x["params_factored"]) for x in r["layers"]] == \
        [("2", [96, 96], 32, 32 * 192), ("4", [96, 96], 32, 32 * 192)]
    assert r["totals"]["tensors_checked"] == 6 and r["totals"]["tensors_not_checked"] == 4
    _, doc = run_cli(["lowrank", "check", "-q", "run/compressed.safetensors", "--model-ckpt", "m.safetensors"])
    assert doc["result"]["map"].endswith("(record)") and doc["result"]["totals"]["tensors_checked"] == 10
    assert doc["result"]["totals"]["param_saving"] == pytest.approx(1 - 32 * 192 / 96 ** 2)
    dense = compress.compress_checkpoint(tmp_path / "m.safetensors", tmp_path / "dense", CompressConfig(fmt="dense"))
    _, doc = run_cli(["lowrank", "check", "-q", dense["output"], "--map", dense["map"], "--model-ckpt", "m.safetensors"])
    assert [x["format"] for x in doc["result"]["layers"]] == ["dense", "dense"]


def test_approx_cli_with_plot(run_cli, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    _, doc = run_cli(["lowrank", "approx", "-q", "--widths", "8,16", "--ratios", "full,1/3", "--epochs", "1",
                      "--n-train", "64", "--n-test", "64", "--plot", "f.png"])
    assert len(doc["result"]["summary"]) == 4 and (tmp_path / "f.png").stat().st_size > 1000
    assert any(r["pareto"] for r in doc["result"]["summary"])


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.fixture
def bad_files(tmp_path):
    good = {k: v.detach() for k, v in trained_like().state_dict().items()}
    write_state_dict(good, tmp_path / "m.safetensors")
    nan = dict(good)
    nan["4.weight"] = nan["4.weight"].clone()
    nan["4.weight"][0, 0] = float("inf")
    write_state_dict(nan, tmp_path / "nan.safetensors")
    torch.save({"w": Evil()}, tmp_path / "evil.pt")
    (tmp_path / "t.csv").write_text("a,y\n1,2\n,3\n4,5\n")
    compress.compress_checkpoint(tmp_path / "m.safetensors", tmp_path / "run", CompressConfig())
    fac = state_of(tmp_path / "run" / "compressed.safetensors")
    lmap = json.loads((tmp_path / "run" / options.MAP_NAME).read_text())
    (tmp_path / "rank22.json").write_text(json.dumps({k: dict(v, rank=22) for k, v in lmap.items()}))
    (tmp_path / "rank99.json").write_text(json.dumps({k: dict(v, rank=99) for k, v in lmap.items()}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{")
    write_state_dict({k: v for k, v in fac.items() if k != "4.up.bias"}, tmp_path / "nobias.safetensors")
    write_state_dict(dict(fac, extra=torch.zeros(3)), tmp_path / "extra.safetensors")
    nan_f = dict(fac, **{"4.up.weight": fac["4.up.weight"].clone()})
    nan_f["4.up.weight"][1, 2] = float("nan")
    write_state_dict(nan_f, tmp_path / "nanfac.safetensors")
    write_state_dict({k: v.detach() for k, v in trained_like(width=32).state_dict().items()}, tmp_path / "w32.safetensors")
    return tmp_path


C = ["lowrank", "compress", "m.safetensors"]
BAD_INPUTS = [
    (C + ["--rank-ratio", "0"], 2, "--rank-ratio: must be in (0, 1]"),
    (C + ["--rank-ratio", "1.5", "--out", "o"], 2, "--rank-ratio: must be in (0, 1]"),
    (C + ["--energy", "0"], 2, "--energy: must be in (0, 1]"),
    (C + ["--energy", "2", "--out", "o"], 2, "--energy: must be in (0, 1]"),
    (C + ["--energy", "nan"], 2, "--energy"),
    (C + ["--rank-ratio", "0.5", "--energy", "0.9"], 2, "not both"),
    (C + ["--include", "("], 2, "--include: not a regular expression"),
    (C + ["--include", "nothing-matches"], 2, "no tensor to factor"),
    (["lowrank", "compress", "nan.safetensors", "--out", "o"], 2, "tensor '4.weight' has 1 non-finite"),
    (["lowrank", "compress", "evil.pt", "--out", "o"], 2, "refused to load"),
    (["lowrank", "compress", "missing.safetensors"], 2, "no such file"),
    (["lowrank", "compress"], 2, "give a CHECKPOINT, or --demo"),
    (["lowrank", "approx", "--ratios", "full,2/1"], 2, "--ratios: ratio 2/1 is outside (0, 1]"),
    (["lowrank", "approx", "--widths", "8.5"], 2, "--widths: widths must be positive integers"),
    (["lowrank", "check", "run/compressed.safetensors", "--map", "rank22.json"], 2,
     "tensor '2.down.weight' has shape [21, 64], the low-rank model expects [22, 64]"),
    (["lowrank", "check", "run", "--model-ckpt", "w32.safetensors"], 2,
     "tensor '2.weight' has shape [32, 32], the low-rank map says [64, 64]"),
    (["lowrank", "check", "run/compressed.safetensors", "--map", "rank99.json"], 2, "--map: rank99.json: entry '2' has rank 99"),
    (["lowrank", "check", "run/compressed.safetensors", "--map", "list.json"], 2, "--map: list.json: a low-rank map is"),
    (["lowrank", "check", "run/compressed.safetensors", "--map", "broken.json"], 2, "--map: broken.json: not a JSON"),
    (["lowrank", "check", "run/compressed.safetensors", "--map", "nope.json"], 2, "--map: nope.json: no such map file"),
    (["lowrank", "check", "m.safetensors"], 2, "--map: m.safetensors: no low-rank map found"),
    (["lowrank", "check", "nobias.safetensors", "--map", "run/lowrank_map.json"], 2, "tensor '4.up.bias' is missing"),
    (["lowrank", "check", "extra.safetensors", "--map", "run/lowrank_map.json", "--model-ckpt", "m.safetensors"], 2,
     "tensor 'extra' is not in the model"),
    (["lowrank", "check", "nanfac.safetensors", "--map", "run/lowrank_map.json"], 2, "tensor '4.up.weight' has 1 non-finite"),
    (["lowrank", "check", "missing.safetensors", "--map", "run/lowrank_map.json"], 2, "no such file"),
    (["lowrank", "uci", "--csv", "t.csv", "--out", "o"], 2, "column 'a' is empty"),
    (["lowrank", "uci", "--csv", "nope.csv"], 2, "no such file"),
    (["lowrank", "uci", "--target", "y"], 2, "--target goes with --csv"),
    (["lowrank", "uci", "--depth", "2"], 2, "--depth: give both depth and width"),
    (["lowrank", "uci", "--dataset", "iris", "--folds", "60", "--depth", "2", "--width", "8"], 2, "fewer than 60 folds"),
]


@pytest.mark.parametrize("argv,code,needle", BAD_INPUTS, ids=[" ".join(r[0][1:4]) + f" {i}" for i, r in enumerate(BAD_INPUTS)])
def test_bad_inputs(argv, code, needle, bad_files, monkeypatch, check_bad_input):
    from icmltools.commands.cli import cli

    monkeypatch.chdir(bad_files)
    before = check_bad_input.snapshot(bad_files)
    res = CliRunner().invoke(cli, argv)
    check_bad_input(res, code, needle, root=bad_files, before=before)


def test_no_heavy_import_in_options():
    import subprocess
    import sys

    code = "import sys, icmltools.lowrank.options; print(any(m in sys.modules for m in ('torch', 'numpy', 'scipy')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    assert math.isclose(options.DEFAULT_RANK_RATIO, 1 / 3)


def test_measured_error_keeps_small_errors():
    """A nearly low-rank matrix: the randomized error (measured) is small but never below the exact one (an
    expanded-norm formula lost it to float32 rounding and reported 0)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(512, 128, generator=g) @ torch.randn(128, 512, generator=g) + 0.01 * torch.randn(512, 512, generator=g)
    ex = svd.exact(w, 170)
    rnd = svd.randomized(w, 170, 10, 2, derive(0, "small"))
    assert 0 < ex.rel_fro_err < 0.01 and rnd.rel_fro_err >= ex.rel_fro_err - 1e-7
    assert abs(svd.measured_error(w, ex.up, ex.down) - ex.rel_fro_err) < 1e-6
