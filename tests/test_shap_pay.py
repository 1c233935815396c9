"""icml shap-pay: M^Shap payments (Murhekar et al., ICML 2025). Exact checks of the Shapley machinery, the
mechanisms' equilibria on the embedded default, Monte Carlo error, value sources, the CLI and bad inputs."""
from __future__ import annotations

import itertools
import json
import math
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from icmltools.core.errors import BadInputError
from icmltools.shappay import api, dynamics, options, values
from icmltools.shappay import game as gm
from icmltools.shappay import shapley as sh
from icmltools.shappay.mechanisms import MECHANISM_CLASSES, Context, best_response


def random_game(n, seed=0, coalition_value="all"):
    rng = np.random.default_rng([seed, 7])  # test fixture data, not library code
    return gm.CurveGame(alpha=rng.uniform(0.5, 0.95, n), beta=rng.uniform(0.3, 1.0, n), W=rng.uniform(0, 1, (n, n)),
                        gamma=rng.uniform(0.002, 0.02, n), s_max=np.full(n, 100.0), coalition_value=coalition_value)


def brute_force(value, n):
    """phi by enumerating all n! orders (the definition)."""
    phi = np.zeros(n)
    for order in itertools.permutations(range(n)):
        mask = np.zeros(n)
        for i in order:
            before = value(mask[None])[0]
            mask[i] = 1
            phi[i] += value(mask[None])[0] - before
    return phi / math.factorial(n)


@pytest.mark.parametrize("cv", options.COALITION_VALUES)
def test_exact_shapley_equals_enumeration_and_is_efficient(cv):
    g = random_game(5, coalition_value=cv)
    s = np.array([3.0, 0.0, 10.0, 7.5, 1.0])
    v = lambda M: g.value(M, s)  # noqa: E731
    phi, se = sh.shapley(v, sh.exact_coalitions(5))
    assert np.allclose(phi, brute_force(v, 5), atol=1e-13)
    assert abs(phi.sum() - v(np.ones((1, 5)))[0]) < 1e-13 and not se.any()
    if cv == "all":  # s_1 = 0 is a null player under 'all'; under 'members' its own gain counts when it joins
        assert phi[1] == 0.0
    else:
        assert phi[1] > 0


def test_symmetry_null_player_and_two_agent_formula():
    g = gm.CurveGame(alpha=np.full(4, 0.9), beta=np.full(4, 0.6), W=np.ones((4, 4)), gamma=np.full(4, 0.01),
                     s_max=np.full(4, 50.0))
    s = np.array([5.0, 5.0, 0.0, 9.0])
    phi, _ = sh.shapley(lambda M: g.value(M, s), sh.exact_coalitions(4))
    assert phi[0] == pytest.approx(phi[1], abs=1e-15) and phi[2] == 0.0 and phi[3] > phi[0]
    g2 = random_game(2)
    s2 = np.array([4.0, 11.0])
    v = lambda m: g2.value(np.array([m], dtype=float), s2)[0]  # noqa: E731
    phi2, _ = sh.shapley(lambda M: g2.value(M, s2), sh.exact_coalitions(2))
    assert phi2[0] == pytest.approx((v([1, 0]) + v([1, 1]) - v([0, 1])) / 2, abs=1e-15)


@pytest.mark.parametrize("mode", ["exact", "mc"])
@pytest.mark.parametrize("cv", options.COALITION_VALUES)
def test_payments_balance_and_reciprocity_is_one(tmp_path, mode, cv):
    g = random_game(7, seed=3, coalition_value=cv)
    (tmp_path / "a.json").write_text(json.dumps({"alpha": g.alpha.tolist(), "beta": g.beta.tolist(),
                                                 "W": g.W.tolist(), "gamma": g.gamma.tolist()}))
    s = [5.0, 0.0, 20.0, 1.0, 3.0, 40.0, 8.0]
    r = api.payments("agents", tmp_path / "a.json", s, options.ShapleyConfig(shapley=mode, perms=50,
                                                                           coalition_value=cv), seed=1)
    assert r["shapley"] == mode
    assert r["budget_residual"] < 1e-12
    assert r["reciprocity"] == pytest.approx(1.0, abs=1e-12)
    if cv == "all":  # s_1 = 0: null player, pays for all it gets
        assert r["phi"][1] == pytest.approx(0.0, abs=1e-15)
        assert r["payments"][1] == pytest.approx(-r["gains"][1], abs=1e-15)


def test_mc_within_four_standard_errors_of_exact():
    g = random_game(10, seed=5)
    s = np.linspace(0, 30, 10)
    v = lambda M: g.value(M, s)  # noqa: E731
    exact, _ = sh.shapley(v, sh.exact_coalitions(10))
    from icmltools.core.seed import derive

    mc, se = sh.shapley(v, sh.mc_coalitions(10, 1000, derive(0, "test", "perms").numpy()))
    assert np.all(se[1:] > 0) and se[0] == 0  # agent 0 has s = 0: every marginal is 0
    assert np.all(np.abs(mc - exact) <= 4 * se + 1e-15)
    assert abs(mc.sum() - exact.sum()) < 1e-12  # permutation MC keeps efficiency exactly


def test_dphi_matches_finite_difference_and_phi_of_view():
    g = random_game(6, seed=2)
    s = np.array([2.0, 7.0, 0.0, 4.0, 9.0, 1.0])
    coal = sh.exact_coalitions(6)
    view = sh.AgentView(g, coal, 3, s)
    phi, _ = sh.shapley(lambda M: g.value(M, s), coal)
    assert view.phi(np.array([4.0]))[0] == pytest.approx(phi[3], abs=1e-14)
    h = 1e-5
    fd = (view.phi(np.array([4.0 + h]))[0] - view.phi(np.array([4.0 - h]))[0]) / (2 * h)
    assert view.dphi(4.0) == pytest.approx(fd, rel=1e-6)


@pytest.fixture(scope="module")
def demo():
    return api.demo(0)


def test_default_demo_effect_and_prototype_figures(demo):
    """Spec acceptance: M^Shap collects more data than M0 and has no free riders. The figures are the spec's
    prototype table (same gamma stream): M0 37.0 / M^Shap 223.4 / planner 120.1, welfare 6.947 / 6.230 / 7.224."""
    m = demo["mechanisms"]
    assert m["shap"]["total_data"] > 5 * m["none"]["total_data"]
    assert m["shap"]["free_riders"] == 0 and m["none"]["free_riders"] > 0
    assert m["shap"]["reciprocity"] == pytest.approx(1.0, abs=1e-12) and m["none"]["reciprocity"] < 0.5
    for name, total, welfare in (("none", 37.0, 6.947), ("shap", 223.4, 6.230), ("planner", 120.1, 7.224)):
        assert m[name]["total_data"] == pytest.approx(total, abs=0.05)
        assert m[name]["welfare"] == pytest.approx(welfare, abs=5e-4)
    assert m["shap"]["welfare"] < m["none"]["welfare"] < m["planner"]["welfare"]  # reported, not hidden
    assert all(m[k]["converged"] and m[k]["gap"] < 1e-6 for k in m)


@pytest.mark.parametrize("name", ["shap", "none", "proportional"])
def test_no_profitable_unilateral_deviation(demo, name):
    g = gm.default_game(options.GameConfig(), 0)
    s = np.array(demo["mechanisms"][name]["s"])
    gain = dynamics.deviation_gain(MECHANISM_CLASSES[name](), g, sh.exact_coalitions(8), s, 1001)
    assert gain <= 1e-6
    assert demo["mechanisms"][name]["deviation_gain"] == pytest.approx(gain, abs=1e-12)


def test_planner_maximises_welfare_and_stage_alone_equals_pipeline(demo):
    g = gm.default_game(options.GameConfig(), 0)
    alone = api.solve_mechanism("shap", g, sh.exact_coalitions(8), options.EquilibriumConfig(), 0)
    assert alone["s"] == demo["mechanisms"]["shap"]["s"]
    w = demo["mechanisms"]["planner"]["welfare"]
    assert all(m["welfare"] <= w + 1e-9 for m in demo["mechanisms"].values())


def test_best_response_is_the_grid_argmax():
    g = random_game(4, seed=9)
    ctx = Context(g, sh.exact_coalitions(4), np.array([3.0, 5.0, 1.0, 8.0]))
    for name, mech in MECHANISM_CLASSES.items():
        x = best_response(mech(), ctx, 2)
        xs = np.linspace(0, 100, 20001)
        u = mech().payoff(ctx, 2, xs) - g.gamma[2] * xs
        assert mech().payoff(ctx, 2, [x])[0] - g.gamma[2] * x >= u.max() - 1e-9, name


def test_coalitions_csv_matches_model_and_checks(tmp_path):
    g = random_game(3, seed=4)
    s = np.array([2.0, 5.0, 1.0])
    rows = ["members,value", '"",0']
    for m in range(1, 8):
        mask = np.array([(m >> j) & 1 for j in range(3)], dtype=float)
        rows.append(f"{';'.join(str(j) for j in range(3) if m >> j & 1)},{float(g.value(mask[None], s)[0])!r}")
    (tmp_path / "c.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "s.json").write_text(json.dumps(s.tolist()))
    r = api.payments_from_files("values", tmp_path / "c.csv", tmp_path / "s.json", None, options.ShapleyConfig(), 0)
    phi, _ = sh.shapley(lambda M: g.value(M, s), sh.exact_coalitions(3))
    assert np.allclose(r["phi"], phi, atol=1e-14) and r["gains_source"] == "equal-split"
    assert r["budget_residual"] < 1e-12
    (tmp_path / "bad.csv").write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(BadInputError, match="missing"):
        api.payments_from_files("values", tmp_path / "bad.csv", None, None, options.ShapleyConfig(), 0)
    table = values.read_coalitions(tmp_path / "c.csv")
    table[()] = 0.5
    with pytest.raises(BadInputError, match="v\\(empty\\)"):
        values.table_value(table, 3, "c.csv", True).check_empty(False, "values")
    v = values.table_value(table, 3, "c.csv", True)
    assert v.check_empty(True, "values") == 0.5 and v(np.zeros((1, 3)))[0] == 0.0


def test_value_cmd_is_cached_and_matches(tmp_path):
    script = tmp_path / "score.py"
    script.write_text("import json,sys\nd=json.load(sys.stdin)\nprint(sum(x ** 0.5 for x in d['contrib']))\n")
    r = api.payments("value_cmd", f"{sys.executable} {script}", [1.0, 4.0, 9.0, 16.0], options.ShapleyConfig(), 0)
    assert r["value_calls"] == 16  # each coalition scored once
    assert np.allclose(r["phi"], [1, 2, 3, 4])  # additive game: phi_i = v({i})
    assert r["budget_residual"] < 1e-12


@pytest.mark.slow
def test_digits_value_and_fit():
    cfg = options.DigitsConfig(n=3, pool=60, test=40, fit_sizes=(10, 40, 160), fit_repeats=1)
    r = api.payments("digits", cfg, [10.0, 30.0, 60.0], options.ShapleyConfig(), 0, fit=True)
    assert r["value_calls"] == 8 and r["budget_residual"] < 1e-12 and r["reciprocity"] == pytest.approx(1.0)
    assert r["phi"][2] > r["phi"][0]  # more data, larger share
    assert 0.1 < r["fit"]["accuracy"][0] < r["fit"]["accuracy"][-1] and r["fit"]["beta"] > 0


# ------------------------------------------------------------------------------------------------ CLI


def test_bare_command_envelope(run_cli):
    res, doc = run_cli(["shap-pay", "-q"])
    assert doc["command"] == "shap-pay" and "You Get What You Give" in doc["reference"]["title"]
    assert set(doc["result"]["mechanisms"]) == set(options.MECHANISMS)
    assert doc["result"]["data_gain"] > 1


def test_payments_cli(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"alpha": [0.9] * 3, "beta": [0.6] * 3}))
    (tmp_path / "s.json").write_text("[1, 2, 3]")
    _, doc = run_cli(["shap-pay", "payments", "-q", "--contrib", "s.json", "--agents", "a.json", "--out", "o"])
    r = doc["result"]
    assert r["n"] == 3 and r["budget_residual"] < 1e-12 and (tmp_path / "o" / "result.json").is_file()
    assert r["phi"][0] < r["phi"][1] < r["phi"][2]


AGENTS = {"alpha": [0.9] * 4, "beta": [0.6] * 4, "gamma": [0.01] * 4, "s_max": [50] * 4}
FILES = {
    "agents.json": json.dumps(AGENTS),
    "s.json": "[1, 2, 3, 4]",
    "neg.json": "[1, -2, 3, 4]",
    "nan.json": "[1, NaN, 3, 4]",
    "three.json": "[1, 2, 3]",
    "beta.json": json.dumps({**AGENTS, "beta": [0.6] * 3}),
    "w.json": json.dumps({**AGENTS, "W": [[1, 1], [1, 1]]}),
    "wneg.json": json.dumps({**AGENTS, "W": [[1, -1, 0, 0]] * 4}),
    "missing.csv": "members,value\n0,1\n1,1\n",
    "empty.csv": "members,value\n,0.3\n0,1\n1,1\n0;1,2\n",
    "nogamma.json": json.dumps({"alpha": [0.9] * 2, "beta": [0.6] * 2}),
}
PAY = ["shap-pay", "payments"]
BAD_INPUTS = [
    (PAY + ["--contrib", "neg.json", "--agents", "agents.json", "--out", "o"], 2, "non-negative"),
    (PAY + ["--contrib", "nan.json", "--agents", "agents.json"], 2, "non-finite"),
    (PAY + ["--contrib", "three.json", "--agents", "agents.json"], 2, "3 contributions for 4 agents"),
    (PAY + ["--contrib", "s.json", "--agents", "beta.json"], 2, "'beta' has shape"),
    (PAY + ["--contrib", "s.json", "--agents", "w.json"], 2, "'W' has shape"),
    (PAY + ["--contrib", "s.json", "--agents", "wneg.json"], 2, "non-negative"),
    (PAY + ["--values", "missing.csv", "--out", "o"], 2, "missing"),
    (PAY + ["--values", "empty.csv"], 2, "v(empty) = 0.3"),
    (PAY + ["--contrib", "s.json"], 2, "exactly one value model"),
    (PAY + ["--contrib", "s.json", "--agents", "agents.json", "--value-cmd", "true"], 2, "exactly one value model"),
    (PAY + ["--contrib", "s.json", "--value-cmd", "echo nope"], 2, "expected one number"),
    (PAY + ["--contrib", "missing-file.json", "--agents", "agents.json"], 2, "no such file"),
    (["shap-pay", "equilibrium", "--n", "16", "--shapley", "exact", "--out", "o"], 2, "too many for exact"),
    (["shap-pay", "equilibrium", "--agents", "agents.json", "--n", "5"], 2, "not with --agents"),
    (["shap-pay", "equilibrium", "--agents", "nogamma.json"], 2, "'gamma'"),
    (["shap-pay", "equilibrium", "--tol", "nan"], 2, "--tol"),
    (["shap-pay", "equilibrium", "--value", "digits"], 2, "--fit"),
]


@pytest.mark.parametrize("argv,code,needle", BAD_INPUTS, ids=[" ".join(r[0][1:4]) + f" {i}" for i, r in enumerate(BAD_INPUTS)])
def test_bad_inputs(argv, code, needle, tmp_path, monkeypatch, check_bad_input):
    from icmltools.commands.cli import cli

    monkeypatch.chdir(tmp_path)
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    before = check_bad_input.snapshot(tmp_path)
    res = CliRunner().invoke(cli, argv)
    check_bad_input(res, code, needle, root=tmp_path, before=before)  # nothing written (no run folder left)


def test_gradient_play_reaches_the_best_response_equilibrium(demo):
    g = gm.default_game(options.GameConfig(), 0)
    eq = options.EquilibriumConfig(mechanisms=("shap", "none"), dynamics="grad", deviation_grid=0)
    r = api.equilibrium(g, options.ShapleyConfig(), eq, 0)
    for name in ("shap", "none"):
        m = r["mechanisms"][name]
        assert m["converged"] and m["gap"] < 1e-6
        assert np.allclose(m["s"], demo["mechanisms"][name]["s"], atol=1e-4)
