"""guidedquant: exact checks of the numerics (P-step against a re-typed official lazy-block sweep, C-step against
the augmented least squares, guided H with equal saliencies, uniform grids, exact dequantization), invariants,
the pipeline on a tiny fope-train checkpoint, the CLI and its bad inputs; the demo's orderings (slow)."""
from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from icmltools.guidedquant import quant as q
from icmltools.guidedquant.options import METHODS, CalibConfig, QuantConfig

ROOT = Path(__file__).resolve().parents[1]


def _problem(d_out=32, d_in=300, G=2, K=4, seed=0, tokens=400):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(d_out, d_in, generator=g, dtype=torch.float64)
    X = torch.randn(G, tokens, d_in, generator=g, dtype=torch.float64)
    H = X.transpose(1, 2) @ X
    F = torch.rand(d_out, d_in, generator=g, dtype=torch.float64)
    labels, C = q.kmeans_init(W, F, K)
    return W, H, F, labels, C


def _official_lazy_p_step(W, H, labels, C, cd_cycles, block=128):
    """The official `update_P` re-typed (any_precision/quantization/layerwise_quantize.py): B = (W_hat - W)
    tril(Hn, -1) per cycle, column updates inside a block, then the block's change pushed to later columns."""
    G = H.shape[0]
    gs, d = W.shape[0] // G, W.shape[1]
    Hn = H / torch.diagonal(H, dim1=1, dim2=2).unsqueeze(1)
    Wg, Cg = W.reshape(G, gs, d), C.reshape(G, gs, -1)
    lab = labels.clone().reshape(G, gs, d)
    What = torch.gather(Cg, 2, lab)
    for _ in range(cd_cycles):
        B = torch.bmm(What - Wg, torch.tril(Hn, diagonal=-1))
        for s in range(0, d, block):
            e = min(s + block, d)
            for j in range(s, e):
                sol = Wg[:, :, j:j + 1] - B[:, :, j:j + 1]
                a = (sol - Cg).abs().argmin(-1)
                lab[:, :, j] = a
                What[:, :, j] = torch.gather(Cg, 2, a.unsqueeze(-1)).squeeze(-1)
                if j < e - 1:
                    B[:, :, j + 1:e] += torch.bmm(What[:, :, j:j + 1] - Wg[:, :, j:j + 1], Hn[:, j:j + 1, j + 1:e])
            B[:, :, e:] += torch.bmm(What[:, :, s:e] - Wg[:, :, s:e], Hn[:, s:e, e:])
    return lab.reshape(labels.shape)


# --------------------------------------------------------------------------------------------- exact checks


# the CPU P-step kernels: each must give the official labels (numba: a dependency; skipped where it does not import)
KERNELS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not q.numba_available(), reason="numba missing"))]


@pytest.mark.parametrize("kernel", KERNELS)
def test_p_step_equals_official_lazy_block_and_plain_sweep(kernel):
    W, H, F, labels, C = _problem(d_in=300, G=2)          # 300 columns: crosses two block boundaries
    ours = q.p_step(W, H, labels, C, cd_cycles=2, block=128, kernel=kernel)
    official = _official_lazy_p_step(W, H, labels, C, cd_cycles=2)
    plain = q.p_step_plain(W.numpy(), H.numpy(), labels.numpy(), C.numpy(), cd_cycles=2)
    assert torch.equal(ours, official)
    assert (ours.numpy() == plain).all()
    assert (ours != labels).any()                           # the sweep did something
    if kernel == "numpy":
        for block, inner in ((128, 8), (64, 16), (300, 300), (7, 3)):  # sub-block sizes change no label
            assert torch.equal(q.p_step(W, H, labels, C, cd_cycles=2, block=block, inner=inner, kernel=kernel),
                               official)
    else:
        for tile, cols in ((16, 256), (1, 7), (5, 300), (64, 64)):      # row tiles, column blocks
            lab = q._p_step_numba(W.numpy(), H.numpy(), labels.numpy(), C.numpy(), 2, tile, cols)
            assert (lab == official.numpy()).all()
    assert torch.equal(q._p_step_torch(W, H, labels, C, 2, 128), official)   # the accelerator sweep


@functools.cache
def _after_c_step_official():
    """The official sweep's labels after 3, 4, 6, 8 and 9 cycles, from the k-means labels and a C-step's
    codebook (computed once for every kernel's test)."""
    W, H, F, labels, C = _problem(d_out=48, d_in=300, G=2, K=4, tokens=3000)
    C = q.c_step(W, H, labels, 4)
    official = {3: _official_lazy_p_step(W, H, labels, C, cd_cycles=3)}   # a sweep starts from the labels only
    for c, prev, n in ((4, 3, 1), (6, 4, 2), (8, 6, 2), (9, 8, 1)):
        official[c] = _official_lazy_p_step(W, H, official[prev], C, cd_cycles=n)
    return W, H, labels, C, official


@pytest.mark.parametrize("kernel", KERNELS)
def test_p_step_after_a_c_step_sweeps_only_moving_rows(kernel):
    """As inside LNQ (after a C-step) few labels move: later cycles sweep only the rows that changed in the
    previous one, and stop when none did; the labels are still the official sweep's."""
    W, H, labels, C, official = _after_c_step_official()
    moved = (official[3] != official[4]).any(1)
    assert moved.any() and not moved.all()                 # cycle 4 moves some rows only (measured 22 of 48)
    assert torch.equal(official[8], official[9])           # converged by cycle 8
    for cycles, ref in ((4, 4), (6, 6), (10, 8)):
        assert torch.equal(q.p_step(W, H, labels, C, cd_cycles=cycles, kernel=kernel), official[ref])


@pytest.mark.parametrize("kernel", KERNELS)
def test_p_step_repeated_and_unsorted_codewords(kernel):
    """Codebooks with repeated values (unused codewords become 0 after a C-step) and in no order: the
    midpoint search returns what argmin's first-on-ties gives."""
    W, H, F, labels, C = _problem(d_out=16, d_in=150, G=2, K=8)
    C = C[:, torch.randperm(8, generator=torch.Generator().manual_seed(5))].clone()
    C[:, 2] = 0.0
    C[:, 6] = 0.0
    C[::3, 4] = C[::3, 1]
    labels = q._nearest(W, C.unsqueeze(1).expand(-1, W.shape[1], -1))
    ours = q.p_step(W, H, labels, C, cd_cycles=3, block=64, inner=8, kernel=kernel)
    assert torch.equal(ours, _official_lazy_p_step(W, H, labels, C, cd_cycles=3))
    assert not bool((ours == 6).any()) and not bool((ours[::3] == 4).any())  # a repeat takes its first index
    assert bool((ours == 2).any()) and bool((ours[::3] == 1).any())


@pytest.mark.parametrize("kernel", KERNELS)
def test_p_step_long_codebooks(kernel):
    """5 and 8 bits (32 and 256 codewords: the numba kernel's binary search over the midpoints)."""
    for K in (32, 256):
        W, H, F, labels, C = _problem(d_out=8, d_in=140, G=2, K=K)
        official = _official_lazy_p_step(W, H, labels, C, cd_cycles=2)
        assert (official != labels).any()
        assert torch.equal(q.p_step(W, H, labels, C, cd_cycles=2, kernel=kernel), official)


@pytest.mark.parametrize("kernel", KERNELS)
def test_p_step_tie_on_a_midpoint_goes_to_the_lower_codeword(kernel):
    """H = I (t = w exactly) and dyadic values: a t exactly on a midpoint takes the lower codeword, in an
    ascending codebook (where the official argmin's first-on-ties agrees) and in a descending one."""
    C = torch.tensor([[-1.0, 0.0, 0.5, 2.0], [2.0, 0.5, 0.0, -1.0]], dtype=torch.float64)  # midpoints -.5 .25 1.25
    w = torch.tensor([-0.5, 0.25, 1.25, -0.75, 0.375, 1.5, -3.0, 3.0], dtype=torch.float64)
    W, H = torch.stack([w, w]), torch.eye(8, dtype=torch.float64).expand(2, 8, 8).contiguous()    # G = 2
    labels = torch.tensor([[3] * 8, [0] * 8])
    lab = q.p_step(W, H, labels, C, cd_cycles=2, kernel=kernel)
    lower = torch.tensor([0, 1, 2, 0, 2, 3, 0, 3])
    assert torch.equal(lab[0], lower) and torch.equal(lab[1], 3 - lower)
    assert torch.equal(_official_lazy_p_step(W[:1], H[:1], labels[:1], C[:1], 2)[0], lower)


@pytest.mark.parametrize("kernel", KERNELS)
def test_p_step_is_an_exact_coordinate_minimisation(kernel):
    """No single entry can be moved to another codeword and lower f after a sweep converges."""
    W, H, F, labels, C = _problem(d_out=8, d_in=24, G=2, K=4)
    lab = q.p_step(W, H, labels, C, cd_cycles=20, block=7, kernel=kernel)
    f = q.objective(W, q.dequant(C, lab), H)
    for i in range(0, 8, 3):
        for j in range(0, 24, 5):
            for k in range(4):
                alt = lab.clone()
                alt[i, j] = k
                assert q.objective(W, q.dequant(C, alt), H) >= f - 1e-9 * abs(f)


def test_p_step_kernel_choice(monkeypatch):
    """auto: numba on CPU where installed, else numpy; torch on accelerators; explicit choices checked."""
    from icmltools.core.errors import BadInputError, MissingDependencyError

    assert q.pstep_kernel("cpu") == ("numba" if q.numba_available() else "numpy")
    assert q.pstep_kernel("cuda:0") == "torch" and q.pstep_kernel("cpu", "torch") == "torch"
    with pytest.raises(BadInputError):
        q.pstep_kernel("cuda", "numpy")
    with pytest.raises(BadInputError):
        q.pstep_kernel("cpu", "fortran")
    monkeypatch.setattr(q, "numba_available", lambda: False)
    assert q.pstep_kernel("cpu") == "numpy"
    with pytest.raises(MissingDependencyError):
        q.pstep_kernel("cpu", "numba")


@pytest.mark.parametrize("kernel", KERNELS)
def test_p_step_in_float32(kernel):
    """float32 (as the pipeline runs it): the labels agree with the float64 ones up to near-ties."""
    W, H, F, labels, C = _problem(d_out=32, d_in=200, G=2, K=8, tokens=1000)
    C = q.c_step(W, H, labels, 8)
    ref = q.p_step(W, H, labels, C, cd_cycles=4, kernel="numpy")
    lab = q.p_step(W.float(), H.float(), labels, C.float(), cd_cycles=4, kernel=kernel)
    assert (lab != labels).float().mean() > 0.05 and (lab == ref).float().mean() > 0.999


@pytest.mark.slow
@pytest.mark.skipif(not q.numba_available(), reason="numba missing")
def test_numba_kernel_writes_nothing_in_cwd(tmp_path):
    """Compiling or loading the cached kernel in a fresh process writes nothing to the working directory."""
    code = ("import torch; from icmltools.guidedquant import quant as q; "
            "q.p_step(torch.randn(4, 6), torch.eye(6).expand(2, 6, 6), torch.zeros(4, 6, dtype=torch.long), "
            "torch.randn(4, 4), 2, kernel='numba')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_c_step_equals_augmented_least_squares():
    W, H, F, labels, C = _problem(d_out=16, d_in=64, G=2, K=8)
    reg = 1e-7
    ours = q.c_step(W, H, labels, 8, reg)
    L = torch.linalg.cholesky(H)
    gs = 8
    for i in range(16):
        g = i // gs
        P = torch.nn.functional.one_hot(labels[i], 8).double()
        A = torch.cat([L[g].T @ P, reg ** 0.5 * torch.eye(8, dtype=torch.float64)])
        b = torch.cat([L[g].T @ W[i], torch.zeros(8, dtype=torch.float64)])
        ref = torch.linalg.lstsq(A, b[:, None]).solution[:, 0]
        assert torch.allclose(ours[i], ref, rtol=0, atol=1e-10 * max(1.0, float(ref.abs().max())))


def test_c_step_unused_codeword_is_zero():
    W, H, F, labels, C = _problem(d_out=4, d_in=40, G=1, K=4)
    labels = labels.clamp_max(2)                            # codeword 3 used by no entry
    assert float(q.c_step(W, H, labels, 4)[:, 3].abs().max()) < 1e-12


def test_lnq_trace_monotone_and_below_init():
    W, H, F, labels, C = _problem(d_out=32, d_in=96, G=4, K=4)
    res = q.lnq(W, H, labels, C, QuantConfig(iters=4))
    tr = res["objective_trace"]
    assert all(b <= a for a, b in zip(tr, tr[1:])) and tr[-1] < 0.85 * tr[0]  # measured 0.80
    assert q.is_monotone(res["raw_trace"])
    assert res["codebook"].shape == (32, 4) and int(res["labels"].max()) < 4
    assert q.objective(W, q.dequant(res["codebook"], res["labels"]), H) == pytest.approx(tr[-1], rel=1e-12)


def test_guided_hessian_with_equal_saliencies_is_xtx():
    from icmltools.guidedquant.stats import guided_hessian

    g = torch.Generator().manual_seed(1)
    X = torch.randn(500, 40, generator=g)
    Hg = guided_hessian(X, torch.ones(500, 3))
    ref = X.double().T @ X.double()
    for k in range(3):
        assert torch.allclose(Hg[k].double(), ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))
    S = torch.rand(500, 2, generator=g)
    manual = sum(S[t, 1] * torch.outer(X[t], X[t]) for t in range(500))
    assert torch.allclose(guided_hessian(X, S)[1], manual, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_uniform_outputs_lie_on_the_grid(bits):
    from icmltools.guidedquant import methods
    from icmltools.guidedquant.stats import LayerStats

    W, H, F, labels, C = _problem(d_out=16, d_in=64, G=2, K=4)
    ls = LayerStats("x", W.float(), F.float(), H.sum(0, keepdim=True), H, 2)
    for name in ("rtn", "gptq", "gptq_guided"):
        out = methods.REGISTRY[name](ls, bits, QuantConfig(), {})
        t = out["tensors"]
        qi = t["indices"].long()
        assert t["scale"].dtype == torch.float16 and t["indices"].dtype == torch.uint8
        assert int(qi.min()) >= 0 and int(qi.max()) <= 2 ** bits - 1
        assert torch.equal(out["W_hat"], t["scale"].float()[:, None] * (qi.float() - t["zero"].float()[:, None]))
        assert torch.equal(t["zero"].float(), t["zero"].float().round())


@pytest.mark.parametrize("name", ["lnq_guided", "lnq", "sqllm"])
def test_codebook_shapes_and_exact_dequantization(name):
    from icmltools.guidedquant import methods
    from icmltools.guidedquant.stats import LayerStats

    W, H, F, labels, C = _problem(d_out=16, d_in=64, G=2, K=8)
    ls = LayerStats("x", W.float(), F.float(), H.sum(0, keepdim=True), H, 2)
    out = methods.REGISTRY[name](ls, 3, QuantConfig(), {})
    cb, idx = out["tensors"]["codebook"], out["tensors"]["indices"]
    assert cb.shape == (16, 8) and cb.dtype == torch.float16 and idx.dtype == torch.uint8
    assert int(idx.max()) < 8
    assert torch.equal(out["W_hat"], torch.gather(cb.float(), 1, idx.long()))


def test_gptq_with_identity_hessian_is_rtn():
    """H = I: no error to propagate, so GPTQ rounds like RTN on the same grid."""
    W = torch.randn(8, 200, generator=torch.Generator().manual_seed(2))
    H = torch.eye(200, dtype=torch.float64)[None]
    assert torch.equal(q.gptq(W, H, 3, QuantConfig(), "x")["q"], q.rtn(W, 3)["q"])


def test_gptq_beats_rtn_on_correlated_inputs():
    """Correlated inputs (rank-8 signal plus noise): GPTQ's error feedback pays off against RTN on f."""
    g = torch.Generator().manual_seed(4)
    X = torch.randn(2, 400, 8, generator=g, dtype=torch.float64) @ torch.randn(8, 64, generator=g, dtype=torch.float64)
    X = X + 0.1 * torch.randn(2, 400, 64, generator=g, dtype=torch.float64)
    H = X.transpose(1, 2) @ X
    W = torch.randn(16, 64, generator=g)
    deq = (lambda o: o["scale"][:, None] * (o["q"] - o["zero"][:, None]))
    f_gptq = q.objective(W, deq(q.gptq(W, H, 3, QuantConfig(), "x")), H)
    f_rtn = q.objective(W, deq(q.rtn(W, 3)), H)
    assert f_gptq < 0.5 * f_rtn, (f_gptq, f_rtn)  # measured 0.13


def test_kmeans_weighted_and_zero_weights():
    W = torch.tensor([[0.0, 1.0, 1.2, 5.0, 5.4, 9.0]])
    F = torch.tensor([[5.0, 1.0, 1.0, 1.0, 3.0, 0.0]])       # w = 0 and F = 0 entries do not pull centres
    lab, C = q.kmeans_init(W, F, 2)
    assert C[0, 0].item() == pytest.approx(1.1)
    assert C[0, 1].item() == pytest.approx((5.0 + 3 * 5.4) / 4)
    assert torch.equal(lab, torch.tensor([[0, 0, 0, 1, 1, 1]]))
    lab2, C2 = q.kmeans_init(W, torch.zeros_like(W), 2)      # all-zero weights: uniform
    assert torch.equal(C2, C2.sort(dim=1).values) and lab2.shape == W.shape


def test_damping_and_not_pd_names_the_layer():
    from icmltools.core.errors import BadInputError

    X = torch.randn(5, 20, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    H, damp = q.damp_hessians((X.T @ X)[None], "blocks.0.attn.qkv")   # rank 5 < 20: needs damping
    assert damp[0] > 0 and int(torch.linalg.cholesky_ex(H[0])[1]) == 0
    with pytest.raises(BadInputError, match="blocks.1.mlp.down"):
        q.damp_hessians(torch.zeros(1, 4, 4, dtype=torch.float64), "blocks.1.mlp.down")


def test_groups_and_bits_per_weight():
    from icmltools.guidedquant.stats import layer_groups

    assert q.effective_groups(384, 4) == 4 and q.effective_groups(6, 4) == 3 and q.effective_groups(7, 4) == 1
    # fused projections (q, k, v in one Linear): G groups per projection, so none straddles two of them
    assert layer_groups(384, 4, 3) == 12 and layer_groups(1024, 4, 2) == 8 and layer_groups(30, 4, 3) == 6
    assert q.bits_per_weight(2, 4096, uniform=False) == pytest.approx(2 + 64 / 4096)
    assert q.bits_per_weight(3, 128, uniform=True) == 3.25


def test_options_import_no_heavy_module():
    code = ("import sys, icmltools.guidedquant.options, icmltools.guidedquant; "
            "print(','.join(m for m in ('torch', 'numpy', 'safetensors', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


# --------------------------------------------------------------------------------------------- pipeline


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny fope-train checkpoint made by the public command (d 16, 1 block, 4 steps)."""
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    d = tmp_path_factory.mktemp("fope")
    res = CliRunner().invoke(cli, ["fope-train", "-q", "--threads", "1", "--pe", "rope", "--steps", "4", "--d-model",
                                   "16", "--n-heads", "2", "--n-layers", "1", "--batch-size", "2", "--train-length",
                                   "16", "--eval-factors", "1", "--eval-samples", "2", "--out", str(d / "run")])
    assert res.exit_code == 0, res.stderr
    return d / "run" / "rope"


@pytest.fixture(scope="module")
def calib_text(tmp_path_factory):
    p = tmp_path_factory.mktemp("calib") / "calib.txt"
    p.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)))
    return p


SMALL = CalibConfig(calib_seqs=8, eval_seqs=8, seq_len=16, chunk=4)


def test_method_results_do_not_depend_on_which_others_run(ckpt, calib_text):
    """A method run alone gives the numbers it gives beside the others (same windows, same statistics)."""
    from icmltools.guidedquant import api, models

    model, _ = models.load_model(ckpt, "cpu")
    data = models.load_calib(calib_text)
    both, _ = api.quantize(model, data, QuantConfig(methods=("lnq_guided", "rtn"), bits=(2,)), SMALL, "cpu", seed=0)
    alone, _ = api.quantize(model, data, QuantConfig(methods=("lnq_guided",), bits=(2,)), SMALL, "cpu", seed=0)
    assert both["runs"][0]["end_loss"] == alone["runs"][0]["end_loss"]
    strip = (lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs])
    assert strip(both["runs"][0]["layers"]) == strip(alone["runs"][0]["layers"])
    c1, e1 = models.windows(data, SMALL, 0)
    c2, _ = models.windows(data, SMALL, 1)
    assert not torch.equal(c1, c2) and e1.shape == (8, 17)


def test_pipeline_all_methods_on_checkpoint(ckpt, calib_text):
    from icmltools.guidedquant import api, models

    model, _ = models.load_model(ckpt, "cpu")
    res, runs = api.quantize(model, models.load_calib(calib_text), QuantConfig(bits=(2, 4)), SMALL, "cpu", seed=0)
    assert res["pstep_kernel"] == ("numba" if q.numba_available() else "numpy")
    assert [(r["method"], r["bits"]) for r in res["runs"]] == [(m, b) for m in METHODS for b in (2, 4)]
    for r in res["runs"]:
        assert r["monotone"] and len(r["layers"]) == 4
        for lay in r["layers"]:
            tr = lay.get("objective_trace")
            if tr:
                assert all(b <= a for a, b in zip(tr, tr[1:]))
    by = {(r["method"], r["bits"]): r for r in res["runs"]}
    # qkv (48 rows = q, k, v) and gate_up (128 rows = gate, up): 4 saliency groups per projection
    assert [lay["groups"] for lay in by["lnq_guided", 2]["layers"]] == [12, 4, 8, 4]
    assert [lay["groups"] for lay in by["lnq", 2]["layers"]] == [1, 1, 1, 1]
    for m in METHODS:                                       # 4 bits: a smaller layer objective than 2 bits
        for l2, l4 in zip(by[m, 2]["layers"], by[m, 4]["layers"]):
            assert l4["objective"] < l2["objective"], (m, l2["name"])
    # d 16, SwiGLU 64: d_in 16 for qkv/out/gate_up (768 + 256 + 2048 weights), 64 for down (1024 weights)
    assert by["lnq", 2]["bits_per_weight"] == pytest.approx((3072 * (2 + 64 / 16) + 1024 * (2 + 64 / 64)) / 4096,
                                                            abs=1e-4)
    assert by["rtn", 2]["bits_per_weight"] == pytest.approx((3072 * (2 + 2) + 1024 * (2 + 0.5)) / 4096, abs=1e-4)


# --------------------------------------------------------------------------------------------- CLI


def test_cli_writes_quantized_and_dequantized(run_cli, ckpt, calib_text, tmp_path):
    from safetensors import safe_open

    from icmltools.fope.ckpt import load_checkpoint

    out, deq = tmp_path / "gq", tmp_path / "deq"
    res, doc = run_cli(["guidedquant", "-q", "--threads", "1", "--model", str(ckpt), "--calib", str(calib_text),
                        "--methods", "lnq_guided", "--bits", "2", "--calib-seqs", "8", "--eval-seqs", "8",
                        "--seq-len", "16", "--out", str(out), "--dequant-out", str(deq)])
    r = doc["result"]["runs"][0]
    assert r["method"] == "lnq_guided" and r["bits"] == 2 and doc["result"]["model"]["format"] == "icml-fope-train"
    f = out / "quantized_lnq_guided_2bit.safetensors"
    assert doc["artifacts"]["lnq_guided_2bit"] == str(f) and (out / "result.json").is_file()
    with safe_open(str(f), "pt") as fh:
        meta = fh.metadata()
        cb, idx = fh.get_tensor("blocks.0.attn.qkv.codebook"), fh.get_tensor("blocks.0.attn.qkv.indices")
        keys = set(fh.keys())
    assert meta["method"] == "lnq_guided" and meta["bits"] == "2" and meta["groups"] == "4"
    assert meta["calib_sha256"] == doc["result"]["calib"]["sha256"]
    assert cb.shape == (48, 4) and cb.dtype == torch.float16 and idx.shape == (48, 16) and idx.dtype == torch.uint8
    assert "embed.weight" in keys and "blocks.0.attn.qkv.weight" not in keys
    model, _ = load_checkpoint(deq)                         # loads through fope-train's own loader
    assert torch.equal(model.blocks[0].attn.qkv.weight, torch.gather(cb.float(), 1, idx.long()))


HF_CONFIG = '{"model_type": "bert", "architectures": ["BertForMaskedLM"]}'
HF_LLAMA = '{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}'


def _make_inputs(tmp: Path, ckpt: Path):
    import shutil

    from safetensors.torch import load_file, save_file

    (tmp / "hf").mkdir()
    (tmp / "hf" / "config.json").write_text(HF_CONFIG)
    (tmp / "hf_notok").mkdir()
    (tmp / "hf_notok" / "config.json").write_text(HF_LLAMA)
    (tmp / "short.txt").write_text("x = 1\n" * 3)
    for name, edit in (("dead", lambda s: s["blocks.0.attn_norm.weight"].zero_()),
                       ("huge", lambda s: s["head.weight"].fill_(3e38))):
        shutil.copytree(ckpt, tmp / name)
        state = load_file(str(tmp / name / "model.safetensors"))
        edit(state)
        save_file(state, str(tmp / name / "model.safetensors"), metadata={"format": "icml-fope-train"})


SMALL_ARGS = ["--calib-seqs", "4", "--eval-seqs", "4", "--seq-len", "16"]
BAD_INPUTS = [
    (["--bits", "9"], 2, "--bits: bit widths must be integers in 1..8"),
    (["--bits", "2.5"], 2, "--bits"),
    (["--bits", "0"], 2, "--bits"),
    (["--model", "{tmp}/nope"], 2, "no such folder"),
    (["--model", "{tmp}/hf"], 2, "--model: {tmp}/hf: unsupported architecture BertForMaskedLM (supported: Hugging Face "
     "causal LMs of type llama, mistral, qwen2, gpt2)"),
    (["--model", "{tmp}/hf_notok"], 2, "no tokenizer in the folder"),
    (["--model", "{ckpt}", "--calib", "{tmp}/short.txt", *SMALL_ARGS], 2, "shorter than one window"),
    (["--model", "{tmp}/dead", "--methods", "lnq", "--calib", "{calib}", *SMALL_ARGS], 2,
     "layer blocks.0.attn.qkv: Hessian of group 0 is not positive definite"),
    (["--model", "{tmp}/huge", "--calib", "{calib}", *SMALL_ARGS], 2, "NaN or inf output gradients"),
    (["--model", "{ckpt}", "--steps", "5"], 2, "--steps"),
    (["--dequant-out", "{tmp}/d", "--methods", "lnq,rtn"], 2, "--dequant-out"),
    (["--methods", "awq"], 2, "--methods"),
    (["--calib", "{tmp}/missing.txt"], 2, "no such file"),
    (["--device", "cuda:7"], 2, "cuda"),
]


@pytest.mark.parametrize("argv,code,needle", BAD_INPUTS)
def test_bad_inputs(argv, code, needle, ckpt, calib_text, tmp_path, monkeypatch, check_bad_input):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    _make_inputs(tmp_path, ckpt)
    monkeypatch.chdir(tmp_path)
    before = check_bad_input.snapshot(tmp_path)
    args = [a.format(tmp=tmp_path, ckpt=ckpt, calib=calib_text) for a in argv]
    res = CliRunner().invoke(cli, ["guidedquant", "--threads", "1", *args, "--out", str(tmp_path / "o")])
    check_bad_input(res, code, needle.format(tmp=tmp_path), root=tmp_path, before=before)


# --------------------------------------------------------------------------------------------- Hugging Face


def _hf_folder(root: Path, kind: str, text: str) -> Path:
    """A tiny causal LM of `kind` (llama or gpt2) with a byte-level BPE tokenizer trained on `text`, trained for
    150 steps so that quantization shows in the loss, saved with save_pretrained (nothing is downloaded)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=200,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    V = len(fast)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if kind == "llama":
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
                vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False))
        else:
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4,
                                                                         n_positions=64, bos_token_id=0,
                                                                         eos_token_id=0))
        ids = torch.tensor(fast(text)["input_ids"])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(150):
            w = torch.stack([ids[s:s + 33] for s in torch.randint(0, ids.numel() - 33, (8,)).tolist()])
            loss = torch.nn.functional.cross_entropy(model(input_ids=w[:, :-1]).logits.reshape(-1, V),
                                                     w[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    out = root / kind
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


HF_ARGS = ["--bits", "2", "--calib-seqs", "16", "--eval-seqs", "16", "--seq-len", "32"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_hf_causal_lm(kind, run_cli, calib_text, tmp_path):
    """A Hugging Face folder: quantized through transformers (local files), rtn worst at 2 bits, the
    dequantized folder loads with from_pretrained and gives the reported loss; GPT-2's Conv1D weights are
    quantized as W = weight^T and written back transposed."""
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    from icmltools.guidedquant import hf, models, stats

    src = _hf_folder(tmp_path, kind, calib_text.read_text())
    _, doc = run_cli(["guidedquant", "-q", "--threads", "1", "--model", str(src), "--calib", str(calib_text),
                      "--methods", "lnq_guided,gptq,rtn", *HF_ARGS])
    res = doc["result"]
    d = {r["method"]: r["delta_loss"] for r in res["runs"]}
    assert res["model"]["format"] == "hf" and res["model"]["model_type"] == kind
    assert all(r["monotone"] and r["end_loss"] == r["end_loss"] for r in res["runs"])
    assert d["rtn"] > max(d["lnq_guided"], d["gptq"]) > 0, d  # measured: llama .027 > .010, gpt2 .041 > .003
    layers = res["runs"][0]["layers"]
    assert len(layers) == (14 if kind == "llama" else 8)
    assert layers[0]["groups"] == (4 if kind == "llama" else 12)          # c_attn fuses q, k, v: 4 groups each

    out, deq = tmp_path / "gq", tmp_path / "deq"
    _, doc = run_cli(["guidedquant", "-q", "--threads", "1", "--model", str(src), "--calib", str(calib_text),
                      "--methods", "lnq_guided", *HF_ARGS, "--out", str(out), "--dequant-out", str(deq)])
    model = transformers.AutoModelForCausalLM.from_pretrained(str(deq), local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(deq), local_files_only=True)
    adapter = hf.HFAdapter(model.float().eval(), tok, deq, kind)
    data = adapter.prepare_data(models.load_calib(calib_text))
    _, eval_w = models.windows(data, CalibConfig(calib_seqs=16, eval_seqs=16, seq_len=32), 0)
    loss = stats.eval_loss(adapter, eval_w, "cpu")
    assert loss == pytest.approx(doc["result"]["runs"][0]["end_loss"], rel=1e-5)
    q = adapter.layers()[0]
    with safe_open(str(out / "quantized_lnq_guided_2bit.safetensors"), "pt") as fh:
        cb, idx = fh.get_tensor(f"{q.name}.codebook"), fh.get_tensor(f"{q.name}.indices")
        assert (fh.metadata().get("transposed_in_model") is not None) == (kind == "gpt2")
    assert torch.equal(q.W, torch.gather(cb.float(), 1, idx.long()))
    assert torch.equal(q.module.weight, q.W.T if kind == "gpt2" else q.W)


def test_hf_without_transformers_is_one_line(tmp_path, monkeypatch, check_bad_input):
    """transformers missing (an optional extra): the folder is refused saying how to install it."""
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(HF_LLAMA)
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)             # import transformers -> ImportError
    before = check_bad_input.snapshot(tmp_path)
    res = CliRunner().invoke(cli, ["guidedquant", "--threads", "1", "--model", str(tmp_path / "m")])
    check_bad_input(res, 2, "needs the optional transformers package (pip install 'icml-tools[hf]')", root=tmp_path,
                    before=before)


def test_help_has_examples_and_lists_methods(run_cli):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    res = CliRunner().invoke(cli, ["guidedquant", "--help"])
    assert res.exit_code == 0 and "Examples" in res.output and "lnq_guided" in res.output


# --------------------------------------------------------------------------------------------- the demo (slow)


@pytest.mark.slow
def test_demo_orderings_seeds_0_to_2(icml_json_once):
    """The issue's orderings at 2 bits on seeds 0-2: lnq_guided <= lnq on the mean over the seeds; lnq,
    lnq_guided, gptq and gptq_guided each below sqllm below rtn on every seed. Per seed, lnq_guided <= lnq does
    not hold on every CPU path: with the suite's pinned paths (conftest) lnq_guided .0125/.0146/.0107 vs lnq
    .0158/.0142/.0096 (mean .0126 vs .0132); on the docs' first CPU .0107/.0143/.0101 vs .0134/.0148/.0122
    (docs/guidedquant.md). gptq_guided < gptq is not checked: it held on every seed on those two CPUs but not on
    an Intel Xeon with AVX-512 under the same pins (2026-12-02: .0235/.0225/.0159 vs .0222/.0209/.0184, mean
    .0206 vs .0205; lnq_guided .0126/.0164/.0069 vs lnq .0159/.0143/.0080, mean .0120 vs .0127).

    The command of the docs' per-seed table (one thread, as the docs' figures), through `icml_json_once`: seed 0 is
    the docs' example (tests/test_readme.py), run once for both tests (last here: by then the other worker has
    likely run it, instead of one worker waiting for the other)."""
    guided, plain = [], []
    for seed in (1, 2, 0):
        res = icml_json_once(["guidedquant", "-q", "--threads", "1", "--seed", seed])["result"]
        d = {r["method"]: r["delta_loss"] for r in res["runs"]}
        assert res["runs"][0]["bits"] == 2
        guided.append(d["lnq_guided"])
        plain.append(d["lnq"])
        for m in ("lnq", "lnq_guided", "gptq", "gptq_guided"):
            assert d[m] < d["sqllm"] < d["rtn"], (seed, d)
        assert all(r["monotone"] for r in res["runs"])
    assert sum(guided) <= sum(plain), (guided, plain)
