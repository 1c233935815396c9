"""fope-train: exact FoPE construction, RoPE equivalence, frozen per-head/per-layer coefficients,
save/load, data splits, seed streams, and the CLI (tiny models only)."""
import json
import math
import subprocess
import sys

import pytest
import torch

from icmltools.fope import FourierEmbedding, kept_count_formula, kept_frequencies, options, step_eye
from icmltools.fope.data import PasskeyTask, default_corpus, load_text
from icmltools.fope.model import _FACTORIES, build_model, parse_pes
from icmltools.fope.train import Batches, RunConfig, load_checkpoint, run_compare, train_one
from icmltools.nn import ROPE_SCALINGS, RotaryEmbedding, TransformerConfig
from icmltools.nn.position import apply_rotary

torch.set_num_threads(1)

TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--steps", "3", "--batch-size", "2",
        "--eval-samples", "2", "--train-length", "16", "--eval-factors", "1,2"]


# ------------------------------------------------------------------------------------------ construction


@pytest.mark.parametrize("hd,N,expected", [(32, 64, 5), (32, 128, 6), (64, 512, 16), (64, 1024, 18),
                                           (128, 512, 31), (16, 64, 3), (32, 4, 0)])
def test_kept_frequency_count(hd, N, expected):
    """D = #{i : theta^(-2i/hd) >= 2 pi / N}; hand values and the closed form agree."""
    assert len(kept_frequencies(hd, N)) == expected
    assert kept_count_formula(hd, N) == expected
    if expected:
        f = FourierEmbedding(hd, 2, N)
        assert (f.d_in, f.d_out) == (expected, min(expected, hd // 4))
        assert f.sin_coef.shape == (2, expected, min(expected, hd // 4))


def test_kept_frequencies_are_those_with_period_within_N():
    hd, N = 64, 200
    keep = kept_frequencies(hd, N)
    allf = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    assert torch.all(2 * math.pi / keep <= N)
    dropped = allf[len(keep):]
    assert torch.all(2 * math.pi / dropped > N)


def test_step_eye():
    e = step_eye(1, 5, 2)[0]
    assert e.tolist() == [[1, 0], [0, 0], [0, 0], [0, 1], [0, 0]]
    assert torch.equal(step_eye(3, 4, 4)[2], torch.eye(4))


def test_sigma0_no_clip_equals_rope_exactly():
    """FoPE with sigma = 0 and no clipping is RoPE: same rotated q, k and the same attention logits."""
    torch.manual_seed(0)
    hd, H = 16, 4
    rope = RotaryEmbedding(hd)
    fope = FourierEmbedding(hd, H, train_length=64, sigma=0.0, clip_floor=False)
    q, k = torch.randn(2, H, 40, hd), torch.randn(2, H, 40, hd)
    qr, kr = rope(q, k)
    qf, kf = fope(q, k)
    assert torch.equal(qr, qf) and torch.equal(kr, kf)
    assert torch.equal(qr @ kr.transpose(-1, -2), qf @ kf.transpose(-1, -2))


def test_sigma0_no_clip_model_logits_equal_rope():
    cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=40)
    m_rope = build_model("rope", cfg, 32, seed=3).eval()
    from icmltools.nn import DecoderStack

    torch.manual_seed(3)
    m_f = DecoderStack(cfg, lambda i: FourierEmbedding(16, 2, 32, sigma=0.0, clip_floor=False)).eval()
    m_f.load_state_dict(m_rope.state_dict(), strict=False)
    x = torch.randint(0, 40, (2, 50))
    with torch.no_grad():
        assert torch.allclose(m_rope(x), m_f(x), atol=1e-6, rtol=0)


def test_fope_cf_is_clip_floor_with_step_eye_and_pads():
    f = FourierEmbedding(32, 2, train_length=64, sigma=0.0, clip_floor=True)   # D = 5, d = 5
    assert torch.equal(f.sin_coef, step_eye(2, 5, 5)) and torch.equal(f.cos_coef, step_eye(2, 5, 5))
    cos, sin = f.cos_sin(10)
    assert cos.shape == (1, 2, 10, 32)
    # the kept frequencies rotate exactly as RoPE's first 5; the 11 dropped ones are padded with 1.0
    r_cos, r_sin = RotaryEmbedding(32).cos_sin(10)
    assert torch.allclose(cos[0, 0, :, :5], r_cos[0, 0, :, :5]) and torch.allclose(sin[0, 0, :, :5], r_sin[0, 0, :, :5])
    assert torch.all(cos[..., 5:16] == 1.0) and torch.all(sin[..., 5:16] == 1.0)
    v = FourierEmbedding(32, 2, train_length=64, sigma=0.0, pad="vllm")
    c2, s2 = v.cos_sin(10)
    assert torch.all(c2[..., 5:16] == 1.0) and torch.all(s2[..., 5:16] == 0.0)


def test_xavier_gain_sigma():
    g = torch.Generator().manual_seed(0)
    f = FourierEmbedding(128, 64, train_length=512, sigma=0.3, clip_floor=False, generator=g)  # (64, 64, 64)
    noise = f.sin_coef - step_eye(64, 64, 64)
    expected = 0.3 * math.sqrt(2.0 / (64 * 64 + 64 * 64))   # torch xavier fans of an (H, D, d) tensor
    assert noise.std().item() == pytest.approx(expected, rel=0.02)


def test_q_and_k_share_coefficients():
    torch.manual_seed(0)
    f = FourierEmbedding(16, 2, 64, sigma=0.5)
    assert sorted(n for n, _ in f.named_buffers() if n.endswith("coef")) == ["cos_coef", "sin_coef"]
    q, k = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    cos, sin = f.cos_sin(20)
    qf, kf = f(q, k)
    assert torch.allclose(qf, apply_rotary(q, cos, sin)) and torch.allclose(kf, apply_rotary(k, cos, sin))
    assert not torch.allclose(cos[0, 0], cos[0, 1])   # per head


def test_coefficients_frozen_distinct_and_survive_save_load(tmp_path):
    cfg = RunConfig(train_length=16, d_model=16, n_heads=2, n_layers=2, steps=3, batch_size=2, eval_samples=2)
    task = PasskeyTask(2)
    cfg = RunConfig(**{**cfg.to_dict(), "task": "passkey", "train_length": 32, "passkey_digits": 2})
    model0 = build_model("fope", cfg.model_config(task.vocab_size), cfg.train_length, seed=0)
    before = {n: b.clone() for n, b in model0.named_buffers() if n.endswith("_coef")}
    assert len(before) == 4                                        # sin + cos per layer
    assert not any(n.endswith("_coef") for n, _ in model0.named_parameters())
    model, rec = train_one("fope", cfg, task, "cpu", seed=0, ckpt_dir=tmp_path / "fope")
    after = {n: b for n, b in model.named_buffers() if n.endswith("_coef")}
    for n in before:
        assert torch.equal(before[n], after[n]), n                 # frozen through training
        assert not after[n].requires_grad
    l0, l1 = after["blocks.0.attn.pos_emb.sin_coef"], after["blocks.1.attn.pos_emb.sin_coef"]
    assert not torch.equal(l0, l1)                                  # per layer
    assert not torch.equal(l0[0], l0[1])                            # per head
    loaded, meta = load_checkpoint(tmp_path / "fope")
    for n, b in loaded.named_buffers():
        if n.endswith("_coef"):
            assert torch.equal(b, after[n])
    assert meta["pe"] == "fope" and meta["step"] == 3
    x = torch.randint(0, task.vocab_size, (1, 30))
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))


def test_shared_weights_identical_across_pes():
    cfg = TransformerConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=10)
    a = build_model("rope", cfg, 16, seed=5).state_dict()
    b = build_model("fope", cfg, 16, seed=5).state_dict()
    for k, v in a.items():
        assert torch.equal(v, b[k]), k


def test_parse_pes():
    assert parse_pes("rope, FoPE,rope") == ["rope", "fope"]
    assert parse_pes(("alibi", "all")) == ["alibi", *[p for p in options.PES if p != "alibi"]]
    assert len(parse_pes("all")) == 6
    from icmltools.core.errors import BadInputError

    with pytest.raises(BadInputError) as e:
        parse_pes("rope,xpos")
    assert e.value.param == "pes" and "--" not in e.value.message


def test_one_list_each():
    """The library's registries are exactly the options' lists (the command's choices)."""
    assert tuple(_FACTORIES) == options.PES
    assert set(ROPE_SCALINGS) == set(options.EXTENSIONS)
    from icmltools.fope.embedding import PADS

    assert PADS is options.PADS


def test_library_errors_name_parameters_not_flags():
    from icmltools.core.errors import BadInputError
    from icmltools.fope import api

    for call, param in [(lambda: api.make_config(steps=0), "steps"), (lambda: api.make_config(lr=-1.0), "lr"),
                        (lambda: api.make_config(preset="nope"), "preset"),
                        (lambda: api.make_config(d_model=30, n_heads=4), "d_model"),
                        (lambda: api.load_data(api.make_config("passkey"), "x.txt"), "text_file")]:
        with pytest.raises(BadInputError) as e:
            call()
        assert e.value.param == param and "--" not in e.value.message, (param, e.value.message)


# ------------------------------------------------------------------------------------------ seed streams


def test_batches_come_from_derived_stream():
    from icmltools.core.seed import derive
    from icmltools.fope.data import sample_windows

    cfg = RunConfig(train_length=16, batch_size=3)
    corpus = default_corpus()
    ref = sample_windows(corpus.train, 3, 16, derive(4, "batches", 0).torch())
    assert torch.equal(Batches(cfg, corpus, 4).next(), ref)
    assert not torch.equal(Batches(cfg, corpus, 4, rank=1).next(), ref)      # each rank its own stream


def test_build_model_leaves_global_rng_alone():
    cfg = TransformerConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=10)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = build_model("fope", cfg, 16, seed=1).state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(999)                                                   # global state does not matter
    b = build_model("fope", cfg, 16, seed=1).state_dict()
    assert all(torch.equal(v, b[k]) for k, v in a.items())
    c = build_model("fope", cfg, 16, seed=2).state_dict()
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_one_model_alone_equals_the_same_model_inside_a_comparison():
    """The stage keys depend on the seed only: fope trained alone gives the numbers it gives after rope."""
    cfg = RunConfig(train_length=16, d_model=16, n_heads=2, n_layers=1, steps=4, batch_size=2, eval_samples=2,
                    eval_factors=(1, 2))
    corpus = default_corpus()
    both = run_compare("rope,fope", cfg, corpus, "cpu", seed=3)
    alone = run_compare("fope", cfg, corpus, "cpu", seed=3)
    f_both = next(m for m in both["methods"] if m["pe"] == "fope")
    assert [e["loss"] for e in alone["methods"][0]["eval"]] == [e["loss"] for e in f_both["eval"]]
    assert alone["methods"][0]["train"]["final_train_loss"] == f_both["train"]["final_train_loss"]
    task = PasskeyTask(2)
    pcfg = RunConfig(**{**cfg.to_dict(), "task": "passkey", "train_length": 32, "passkey_digits": 2})
    p_both = run_compare("nope,alibi", pcfg, task, "cpu", seed=1)
    p_alone = run_compare("alibi", pcfg, task, "cpu", seed=1)
    assert p_alone["methods"][0]["eval"] == p_both["methods"][1]["eval"]


# ------------------------------------------------------------------------------------------ data


def test_passkey_batch_structure():
    t = PasskeyTask(5)
    x, ans = t.batch(4, 60, torch.Generator().manual_seed(0))
    assert x.shape == (4, 61)
    for b in range(4):
        words = t.decode(x[b]).split()
        key = words[-5:]
        i = words.index("pass")
        assert words[i + 3:i + 8] == key                 # "The pass key is K ..."
        assert " ".join(words[-15:-5]) == "What is the pass key ? The pass key is"
        assert t.decode(x[b, 1:][ans[b]]).split() == key


def test_default_corpus_split_by_file_and_hash():
    d = default_corpus()
    assert d.info["train_files"] + d.info["val_files"] == d.info["files"]
    assert d.info["val_files"] > 0 and d.val.size > 10_000
    assert len(d.info["sha256"]) == 64
    assert default_corpus().info["sha256"] == d.info["sha256"]


@pytest.mark.parametrize("content,msg", [(b"", "empty"), (b"ab\0cd" * 100, "binary"), (b"\xff\xfe\x00\x81" * 10, "binary"),
                                         (b"abc\xff\xfedef" * 50, "UTF-8")])
def test_load_text_rejects(tmp_path, content, msg):
    from icmltools.core.errors import BadInputError

    p = tmp_path / "t.txt"
    p.write_bytes(content)
    with pytest.raises(BadInputError, match=msg):
        load_text(p)


# ------------------------------------------------------------------------------------------ CLI


def test_cli_compare_contract_and_eval_roundtrip(run_cli, tmp_path):
    out = tmp_path / "run"
    res, doc = run_cli(["fope-train", "-q", "--pe", "rope,fope,alibi", "--extend", "pi,yarn", "--out", str(out), *TINY])
    r = doc["result"]
    assert [m["pe"] for m in r["methods"]] == ["rope", "rope+pi", "rope+yarn", "fope", "alibi"]
    for m in r["methods"]:
        assert [e["length"] for e in m["eval"]] == [16, 32]
        assert all(math.isfinite(e["loss"]) for e in m["eval"])
    assert len(r["data"]["sha256"]) == 64
    assert (out / "fope" / "model.safetensors").is_file() and (out / "result.json").is_file()
    assert json.loads((out / "result.json").read_text()) == r                  # written by CommandRun
    assert json.loads((out / "config.json").read_text())["config"]["train_length"] == 16
    assert doc["device"]["resolved"] == "cpu" and r["cpu_seconds"] > 0
    assert doc["reference"]["arxiv"] == "2412.17739" and r["preset"] == "quick"
    assert doc["artifacts"]["checkpoints"]["fope"] == str(out / "fope")
    # eval mode at new lengths, and RoPE + YaRN
    _, ev = run_cli(["fope-train", "-q", "--eval", str(out / "fope"), "--eval-factors", "1,3", "--eval-samples", "2"])
    m = ev["result"]["methods"][0]
    assert m["pe"] == "fope" and [e["length"] for e in m["eval"]] == [16, 48]
    assert m["eval"][0]["loss"] == pytest.approx(r["methods"][3]["eval"][0]["loss"], abs=1e-5)
    _, ey = run_cli(["fope-train", "-q", "--eval", str(out / "rope"), "--extend", "yarn", "--eval-factors", "2",
                     "--eval-samples", "2"])
    assert ey["result"]["methods"][0]["pe"] == "rope+yarn"
    assert ey["result"]["methods"][0]["eval"][0]["loss"] == pytest.approx(r["methods"][2]["eval"][1]["loss"], abs=1e-5)
    _, both = run_cli(["fope-train", "-q", "--eval", str(out / "rope"), "--extend", "pi,yarn", "--eval-factors", "2",
                       "--eval-samples", "2"])
    assert [m["pe"] for m in both["result"]["methods"]] == ["rope+pi", "rope+yarn"]
    res, _ = run_cli(["fope-train", "-q", "--eval", str(out)], expect_code=2)   # the run folder, not a checkpoint
    assert "--eval" in res.stderr and "alibi, fope, rope" in res.stderr


def test_cli_passkey_reports_accuracy(run_cli):
    _, doc = run_cli(["fope-train", "-q", "--task", "passkey", "--pe", "fope-cf,fope-fs,nope", "--no-save",
                      "--passkey-digits", "2", *TINY[:-4], "--train-length", "32", "--eval-factors", "1,2"])
    for m in doc["result"]["methods"]:
        assert all(0.0 <= e["passkey_acc"] <= 1.0 for e in m["eval"])


def test_cli_resume(run_cli, tmp_path):
    out = tmp_path / "r"
    run_cli(["fope-train", "-q", "--pe", "fope", "--out", str(out), *TINY])
    cfg = json.loads((out / "fope" / "config.json").read_text())
    assert cfg["step"] == 3
    _, doc = run_cli(["fope-train", "-q", "--pe", "fope", "--out", str(out), "--resume", *TINY])
    assert doc["result"]["methods"][0]["train"]["resumed_from"] == 3


def _one_error_line(res):
    assert "Traceback" not in res.stderr
    assert sum(line.startswith("Error:") for line in res.stderr.splitlines()) == 1


@pytest.mark.parametrize("args,flag", [
    (["--pe", "rope,xpos"], "--pe"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--pe", "bogus"], "--"),
    (["--eval-factors", "1,-2"], "--eval-factors"),
    (["--train-length", "2000000"], "--eval-factors"),            # 8N is longer than the validation split
    (["--train-length", "60000", "--eval-factors", "1"], "--train-length"),   # would not fit in memory
    (["--d-model", "30"], "--d-model"),
    (["--task", "passkey", "--text", __file__], "--text"),
    (["--resume"], "--resume"),
    (["--extend-factor", "2"], "--extend-factor"),
])
def test_cli_bad_input(run_cli, args, flag):
    res, _ = run_cli(["fope-train", "-q", "--no-save", *TINY, *args], expect_code=2)
    _one_error_line(res)
    assert flag in res.stderr


@pytest.mark.parametrize("content", [b"", b"\x00\x01\x02garbage\xff" * 100, b"short text"])
def test_cli_bad_text(run_cli, tmp_path, content):
    p = tmp_path / "in.txt"
    p.write_bytes(content)
    out = tmp_path / "o"
    res, _ = run_cli(["fope-train", "-q", "--text", str(p), "--out", str(out), *TINY], expect_code=2)
    _one_error_line(res)
    assert not out.exists() or not any(out.iterdir())


def test_cli_corrupt_checkpoint(run_cli, tmp_path):
    out = tmp_path / "c"
    run_cli(["fope-train", "-q", "--pe", "rope", "--out", str(out), *TINY])
    st = out / "rope" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:100])
    res, _ = run_cli(["fope-train", "-q", "--eval", str(out / "rope")], expect_code=2)
    _one_error_line(res)
    assert "safetensors" in res.stderr
    (out / "rope" / "config.json").write_text("{not json")
    res, _ = run_cli(["fope-train", "-q", "--eval", str(out / "rope")], expect_code=2)
    _one_error_line(res)


@pytest.mark.slow
def test_effect_fope_extrapolates_better_than_rope_fixed_seed():
    """Effect size on a fixed seed (about 20 CPU-seconds): trained at N = 32 on the stdlib corpus, the loss
    growth from N to 4N is smaller for FoPE than for RoPE (measured: RoPE +0.146, FoPE +0.022 nats/byte;
    loss at N 2.49 vs 2.57)."""
    cfg = RunConfig(train_length=32, d_model=32, n_heads=2, n_layers=2, steps=400, batch_size=16, lr=3e-3,
                    warmup=20, eval_factors=(1, 4), eval_samples=16)
    r = run_compare("rope,fope", cfg, default_corpus(), "cpu", 0)
    g = {m["pe"]: m["summary"]["loss_growth_4x"] for m in r["methods"]}
    assert g["rope"] - g["fope"] > 0.05, g
    assert all(abs(m["summary"]["loss_at_N"] - r["methods"][0]["summary"]["loss_at_N"]) < 0.1 for m in r["methods"])


def test_process_info_roles():
    from icmltools.fope.dist import process_info

    assert process_info({}).writes and process_info({"WORLD_SIZE": "1", "RANK": "3"}).writes
    r = process_info({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "1"})
    assert (r.rank, r.world, r.local_rank, r.writes) == (2, 4, 1, False)


@pytest.mark.slow
def test_torchrun_two_ranks_one_writer(tmp_path):
    """Under torchrun (gloo, CPU) rank 0 alone makes the run folder, saves and prints one JSON document."""
    out = tmp_path / "ddp"
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "icmltools", "fope-train",
            "-q", "--device", "cpu", "--pe", "rope,fope", "--out", str(out), *TINY]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("\n") == 1
    doc = json.loads(res.stdout)
    assert doc["result"]["world_size"] == 2 and [m["pe"] for m in doc["result"]["methods"]] == ["rope", "fope"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "fope", "result.json", "rope"]
