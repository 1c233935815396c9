"""icml kpass: exact cases, brute force, unbiasedness, the stream, the demo's trade-off, the CLI, bad inputs."""
import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from icmltools.kpass import advantages
from icmltools.kpass.estimators import brute_force, encode_answers, evaluate


def test_spec_exact_cases():
    from icmltools.kpass.checks import exact_cases

    rows = exact_cases()
    assert rows and all(r["passed"] for r in rows), rows
    np.testing.assert_allclose(advantages([0, 1, 0, 0], estimator="centered"), [-0.25, 0.75, -0.25, -0.25])
    np.testing.assert_allclose(advantages([1, 1, 0, 0, 0], objective="maj", answers=[3, 3, 5, 5, 2]),
                               [0.5, 0.5, -0.5, -0.5, 0])
    np.testing.assert_allclose(advantages([0, 1, 0, 1, 0, 0], k=3, estimator="pkpo-loo"),
                               [-.19, .14, -.19, .14, -.19, -.19], atol=1e-12)


def test_pass_loo_is_best_minus_second_best():
    r = np.array([[0.2, 0.9, 0.5, 0.1], [1.0, 1.0, 0.0, 0.0]])
    np.testing.assert_allclose(advantages(r), [[0, 0.4, 0, 0], [0, 0, 0, 0]], atol=1e-12)


def test_every_closed_form_equals_brute_force():
    from icmltools.kpass.checks import brute_force_checks

    rows = brute_force_checks(seed=3, trials=2)
    assert len(rows) > 50 and all(r["passed"] for r in rows), [r for r in rows if not r["passed"]]


def test_maj_enumeration_path_and_sampled_path():
    rng = np.random.default_rng(0)
    ans = rng.integers(0, 4, 9).tolist()
    r = np.array([float(a == 1) for a in ans])
    codes, rew = encode_answers([ans], r[None])
    A, f = evaluate(r[None], 4, "maj", "loo", codes, rew)
    np.testing.assert_allclose(A[0], brute_force("maj", "loo", r, 4, codes[0], rew[0]), atol=1e-12)
    # C(24, 12) > 1e5: sampled subsets, deterministic for a seed, close to nothing systematic (all zero here)
    r0 = np.zeros(24)
    A0, _ = evaluate(r0[None], 12, "maj", "loo", np.arange(24)[None], r0[None])
    assert np.all(A0 == 0)


def test_unbiasedness_fixed_seed():
    from icmltools.kpass.checks import unbiased_maj, unbiased_pass

    loo, centered = unbiased_pass(seed=0, groups=40_000)
    assert loo["passed"] and loo["max_z"] < 4
    assert centered["passed"] and centered["estimate_e_c"] < 0.9 * centered["analytic_e_c"]
    m_loo, m_cen = unbiased_maj()
    assert m_loo["max_abs_error"] < 1e-6 and m_cen["max_abs_error"] > 1e-3


def test_torch_and_numpy_inputs_agree():
    import torch

    r = np.array([[0, 1, 1, 0.5], [0.1, 0.2, 0.3, 0.4]])
    t = advantages(torch.tensor(r, dtype=torch.float32), estimator="centered")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    np.testing.assert_allclose(t.numpy(), advantages(r, estimator="centered"), atol=1e-6)
    assert advantages([0.0, 1.0], objective="mean").tolist() == [-1.0, 1.0]


def test_centered_sums_to_zero_and_std_scale():
    r = np.random.default_rng(1).normal(size=(5, 6))
    assert np.allclose(advantages(r, k=3, estimator="centered").sum(axis=1), 0)
    np.testing.assert_allclose(advantages(r, scale="std"), advantages(r) / (r.std(axis=1, ddof=1, keepdims=True) + 1e-6))


def test_inconsistent_answer_rewards():
    from icmltools.core.errors import BadInputError

    with pytest.raises(BadInputError, match="share its reward"):
        advantages([1, 0, 0], objective="maj", answers=["a", "a", "b"])
    np.testing.assert_allclose(advantages([1, 0, 0], objective="maj", answers=["a", "a", "b"], answer_reward="mean"),
                               [0.25, 0.25, 0.0])


# ------------------------------------------------------------------------------------------------ stream / CLI


def _run(args, input=None):
    from icmltools.commands.cli import cli

    return CliRunner().invoke(cli, ["kpass", *args], input=input)


def test_transform_stream_passthrough_and_library_equality():
    lines = [{"id": i, "rewards": list(map(float, np.random.default_rng(i).random(8) < 0.3)), "tag": [i]}
             for i in range(50)]
    lines.append({"id": "s", "samples": [{"reward": 1, "answer": "7"}, {"reward": 0, "answer": None}], "x": 1})
    res = _run(["transform", "-q"], "\n".join(json.dumps(x) for x in lines) + "\n")
    assert res.exit_code == 0, res.stderr
    out = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(out) == 51 and out[0]["tag"] == [0] and out[-1]["x"] == 1 and out[-1]["k"] == 2
    R = np.array([x["rewards"] for x in lines[:50]])
    np.testing.assert_allclose(np.array([x["advantages"] for x in out[:50]]), advantages(R), atol=0)
    assert res.stderr == ""


def test_transform_gzip_file_roundtrip_envelope(tmp_path):
    src = tmp_path / "g.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write('{"samples":[{"reward":1,"answer":3},{"reward":1,"answer":3},{"reward":0,"answer":5},'
                '{"reward":0,"answer":5},{"reward":0,"answer":2}]}\n')
    dst = tmp_path / "a.jsonl.gz"
    res = _run(["transform", "-q", "--objective", "maj", "--in", str(src), "--out", str(dst)])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["result"]["groups"] == 1
    with gzip.open(dst, "rt") as f:
        assert json.loads(f.readline())["advantages"] == [0.5, 0.5, -0.5, -0.5, 0.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl.gz", "g.jsonl.gz"]


def test_stop_keeps_lines_already_written_and_skip_skips(tmp_path):
    text = '{"rewards":[0,1]}\n{"rewards":[0,1]}\nnot json\n{"rewards":[1,0]}\n'
    res = _run(["transform", "-q"], text)
    assert res.exit_code == 2 and "line 3: invalid JSON" in res.stderr
    assert len(res.stdout.splitlines()) == 2
    dst = tmp_path / "o.jsonl"
    res = _run(["transform", "-q", "--out", str(dst)], text)
    assert res.exit_code == 2 and not dst.exists()
    assert len((tmp_path / "o.jsonl.partial").read_text().splitlines()) == 2
    res = _run(["transform", "-q", "--on-error", "skip", "--out", str(dst)], text)
    assert res.exit_code == 0
    doc = json.loads(res.stdout)["result"]
    assert doc["skipped_lines"] == [3] and doc["groups"] == 3 and len(dst.read_text().splitlines()) == 3


def test_check_command():
    res = _run(["check", "--quick", "-q"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["result"]["passed"] and doc["result"]["n_checks"] > 50


def test_demo_small_cli(tmp_path):
    png = tmp_path / "c.png"
    res = _run(["demo", "-q", "--steps", "30", "--eval-every", "10", "--maj-votes", "20",
                "--runs", "mean:loo,pass:loo", "--plot", str(png)])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc["result"]["final_mean"]) == {"mean:loo", "pass:loo"} and png.stat().st_size > 1000
    curve = doc["result"]["reps"][0]["curves"]["pass:loo"]
    assert [p["step"] for p in curve] == [0, 10, 20, 30]


@pytest.mark.slow
def test_demo_tradeoff_three_seeds():
    """Issue acceptance: over 3 reps, pass@k training beats mean training on pass@8 by >= 0.05 and mean training
    beats pass@k training on pass@1 by >= 0.1 (maj@k ordering reported, not asserted)."""
    from icmltools.kpass.demo import run_demo
    from icmltools.kpass.options import DemoConfig

    out = run_demo(DemoConfig(reps=3, runs=("mean:loo", "pass:loo"), maj_votes=50), seed=0)
    for rep in out["reps"]:
        m, p = rep["final"]["mean:loo"], rep["final"]["pass:loo"]
        assert p["passk"] >= m["passk"] + 0.05, rep["final"]
        assert m["pass1"] >= p["pass1"] + 0.1, rep["final"]


def test_stage_alone_equals_pipeline():
    """The demo's advantage stage is the library function: same numbers alone and inside a step."""
    r = (np.random.default_rng(5).random((64, 8)) < 0.2).astype(float)
    A, _ = evaluate(r, 8, "pass", "loo")
    np.testing.assert_array_equal(A, advantages(r))


BAD_INPUTS = [
    (["transform"], "not json\n", 2, "line 1: invalid JSON"),
    (["transform"], '{"rewards":[1]}\n', 2, "line 1: a group needs at least 2 samples"),
    (["transform", "--k", "4"], '{"rewards":[1,0,0]}\n', 2, "smaller than k = 4"),
    (["transform"], '{"rewards":[1,NaN]}\n', 2, "line 1: sample 2: reward nan is not finite"),
    (["transform"], '{"rewards":[1,1e999]}\n', 2, "is not finite"),
    (["transform", "--objective", "maj"], '{"rewards":[1,0]}\n', 2, "needs answers"),
    (["transform", "--objective", "maj"], '{"rewards":[1,0],"answers":["a","a"]}\n', 2, "share its reward"),
    (["transform", "--estimator", "pkpo-loo"], '{"rewards":[1,0]}\n', 2, "pkpo-loo needs more samples"),
    (["transform", "--objective", "maj", "--estimator", "pkpo"], '{"rewards":[1,0]}\n', 2, "pass objective only"),
    (["transform"], '{"rewards":[1,"x"]}\n', 2, "is not a number"),
    (["transform"], '[1, 2]\n', 2, "expected a JSON object"),
    (["transform", "--in", "missing.jsonl"], "", 2, "no such file"),
    (["transform", "--k", "1"], "", 2, "--k"),
    (["demo", "--runs", "pass:bogus"], "", 2, "--runs"),
]


@pytest.mark.parametrize("argv,stdin,code,msg", BAD_INPUTS)
def test_bad_inputs(argv, stdin, code, msg, tmp_path, monkeypatch, check_bad_input):
    monkeypatch.chdir(tmp_path)
    res = _run(argv, stdin)
    check_bad_input(res, code, msg, root=tmp_path)
    assert list(tmp_path.iterdir()) == []
