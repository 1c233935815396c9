"""onemax-sim: exact checks from the spec (closed forms vs brute force), invariants, CLI, bad input."""
import itertools
import json

import numpy as np
import pytest

from icmltools.onemax import api, data, rules, simulate, worstcase
from icmltools.onemax.rules import RuleParams

ALL = rules.ALGORITHMS + rules.EXTRA_ALGORITHMS
P = RuleParams(lam=0.5)


@pytest.mark.parametrize("theta", [4.0, 16.0])
@pytest.mark.parametrize("name", ALL)
def test_instance_worst_case_equals_brute_force_over_sequences(name, theta):
    """W(p*, y) from the closed form equals the worst ALG/OPT over every sequence of length <= 3 with max p*."""
    grid = np.unique(np.concatenate([np.exp(np.linspace(0, np.log(theta), 9)), rules.breakpoints(name, theta, P)]))
    for y in grid:
        phi = float(rules.threshold(name, y, theta, P))
        prices = np.unique(np.concatenate([grid, [phi, 1.0]]))
        for p in grid:
            cands = prices[prices <= p + 1e-12]
            worst = min(worstcase.sequence_ratio(seq, phi)
                        for k in (1, 2, 3) for seq in itertools.product(cands, repeat=k) if max(seq) == p)
            closed = float(worstcase.instance_ratio(name, p, y, theta, P))
            assert worst == pytest.approx(closed, abs=1e-12), (name, y, p)


@pytest.mark.parametrize("name", ALL)
def test_profile_matches_brute_force_grid(name):
    """g(e) exact <= every instance on a fine grid with E >= e, and the grid's minimum is close to it."""
    theta = 16.0
    ys = np.exp(np.linspace(0, np.log(theta), 1201))
    ys = np.unique(np.concatenate([ys, rules.breakpoints(name, theta, P)]))
    Y, Pm = np.meshgrid(ys, ys, indexing="ij")
    W = worstcase.instance_ratio(name, Pm, Y, theta, P)
    E = rules.prediction_error(Y, Pm)
    errors = np.array([0.0, 0.3, 0.5, 0.7, 0.9, 0.95, 1.0])
    g = worstcase.profile(name, theta, P, errors)
    for e, ge in zip(errors, g):
        brute = W[E >= e].min()
        assert brute >= ge - 1e-9, (name, e)
        assert brute - ge < 0.01, (name, e, brute, ge)  # grid resolution (the infimum may be a limit)


def test_reference_figures_theta16_lam05():
    rep = worstcase.worst_case_report(16.0, P, errors=[0.9])
    by = {a["name"]: a for a in rep["algorithms"]}
    for name in ("smooth", "sun"):
        assert round(by[name]["robustness"], 4) == 0.1931
        assert round(by[name]["consistency"], 4) == 0.3237
    assert round(by["sun"]["profile"][0]["ratio"], 4) == 0.1931
    # exact value 0.30843; the spec's 0.3085 comes from rounded r, c, s*
    assert by["smooth"]["profile"][0]["ratio"] == pytest.approx(0.3085, abs=2e-4)
    assert round(rep["s_star"], 3) == 0.458


@pytest.mark.parametrize("theta", [2.0, 16.0, 100.0])
@pytest.mark.parametrize("lam", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_pareto_rules_lie_on_front(theta, lam):
    p = RuleParams(lam=lam)
    r_target = float(p.r(theta))
    for name in ("sun", "smooth", "smooth-rho"):
        r, c = worstcase.robustness_consistency(name, theta, p)
        assert r == pytest.approx(r_target, rel=1e-9)
        assert c * r == pytest.approx(1 / theta, rel=1e-9)
    r, c = worstcase.robustness_consistency("elyaniv", theta, p)
    assert r == pytest.approx(theta ** -0.5) and c == pytest.approx(theta ** -0.5)
    r, c = worstcase.robustness_consistency("trust", theta, p)
    assert r == pytest.approx(1 / theta) and c == pytest.approx(1.0)


def test_brute_force_pareto_front():
    """Per prediction y, the best consistency over a grid of thresholds subject to robustness >= r is 1/(r theta)."""
    theta = 9.0
    ps = np.exp(np.linspace(0, np.log(theta), 721))
    phis = ps.copy()
    for r in (1 / theta, 0.15, 0.25, theta ** -0.5):
        worst_c = np.inf
        for y in ps[::24]:
            # robustness of threshold phi for this y: inf over all p* of W
            rob = np.array([np.where(ps >= f, f / ps, 1 / ps).min() for f in phis])
            ok = rob >= r - 1e-9
            cons = np.where(y >= phis, phis / y, 1 / y)
            worst_c = min(worst_c, cons[ok].max())
        assert worst_c == pytest.approx(1 / (r * theta), abs=0.01)


@pytest.mark.parametrize("theta,lam", [(16.0, 0.5), (16.0, 0.1), (50.0, 0.7), (4.0, 0.3)])
def test_smooth_meets_smoothness_bound_exactly(theta, lam):
    p = RuleParams(lam=lam)
    errors = np.linspace(0, 1, 41)
    g = worstcase.profile("smooth", theta, p, errors)
    r = float(p.r(theta))
    bound = worstcase.smoothness_bound(r, 1 / (r * theta), theta, errors)
    assert np.all(g >= bound - 1e-9)              # never below max(r, c E^s*)
    np.testing.assert_allclose(g, bound, atol=1e-9)  # and tight
    # sun (same r, c) falls to r for every E < 1: strictly worse somewhere in (0, 1)
    gs = worstcase.profile("sun", theta, p, errors[1:-1])
    assert np.all(gs <= g[1:-1] + 1e-12) and np.any(gs < g[1:-1] - 1e-3)


def test_smooth_is_pareto_optimal_pointwise_and_special_cases():
    theta = 16.0
    for lam in (0.2, 0.5, 0.8):
        p = RuleParams(lam=lam)
        r = float(p.r(theta))
        y = np.exp(np.linspace(0, np.log(theta), 2001))
        for name in ("smooth", "smooth-rho"):
            phi = rules.threshold(name, y, theta, p)
            assert np.all(phi >= r * theta - 1e-9) and np.all(phi <= 1 / r + 1e-9)
            hi = y >= r * theta
            assert np.all(phi[hi] >= y[hi] / (r * theta) - 1e-9) and np.all(phi[hi] <= y[hi] + 1e-9)
            assert float(rules.threshold(name, theta, theta, p)) == pytest.approx(1 / r)
    y = np.linspace(1, theta, 50)
    np.testing.assert_allclose(rules.threshold("smooth", y, theta, RuleParams(robustness=theta ** -0.5)),
                               rules.threshold("elyaniv", y, theta, P))
    np.testing.assert_allclose(rules.threshold("smooth", y, theta, RuleParams(robustness=1 / theta)),
                               rules.threshold("trust", y, theta, P))


@pytest.mark.parametrize("name", ["elyaniv", "trust", "sun", "smooth", "smooth-rho"])
def test_pareto_rules_keep_robustness_for_predictions_outside_the_bounds(name):
    """Robustness holds for every prediction, including y above M or below m (noisy predictors produce them):
    W(p*, y) >= r for all p* in [1, theta]. Before the fix, smooth at y = 20.5 > theta = 16 set Phi = 5.60 > 1/r
    and sold at 1.04 after a maximum of 5.46 (ratio 0.191 < r = 0.193)."""
    theta = 16.0
    r, _ = worstcase.robustness_consistency(name, theta, P)
    ps = np.exp(np.linspace(0, np.log(theta), 2001))
    for y in (0.2, 0.9, 15.9, 16.0, 16.5, 20.5, 100.0, 1e6):
        w = worstcase.instance_ratio(name, ps, y, theta, P)
        assert w.min() >= r - 1e-12, (name, y, w.min(), r)


def test_lambda_robustness_mapping_roundtrip():
    theta = 16.0
    for lam in (0.05, 0.3, 0.5, 0.99):
        r = 1 / float(rules.sun_gamma(lam, theta))
        assert float(rules.lam_from_robustness(r, theta)) == pytest.approx(lam, rel=1e-9)


def test_brittleness_witnesses():
    theta = 16.0
    sun = worstcase.brittleness_witness("sun", theta, P, 1e-3)
    r, c = worstcase.robustness_consistency("sun", theta, P)
    assert sun["ratio_exact_prediction"] >= c - 1e-9
    assert sun["ratio_with_error"] == pytest.approx(r, rel=2e-3)   # a 0.1 % error drops c to r
    tr = worstcase.brittleness_witness("trust", theta, P, 1e-3)
    assert tr["ratio_exact_prediction"] == pytest.approx(1.0) and tr["ratio_with_error"] < 1.01 / theta
    sm = worstcase.brittleness_witness("smooth", theta, P, 1e-3)
    r_s, c_s = worstcase.robustness_consistency("smooth", theta, P)
    assert sm["ratio_with_error"] >= c_s * (1 / 1.001) ** 0.46 - 1e-9  # smooth degrades gracefully


def test_vectorised_simulation_equals_naive_loop():
    rng = np.random.default_rng(3)
    x = data.random_windows("walk", 300, 40, 9.0, rng)
    cm = np.maximum.accumulate(x, axis=1)
    y = cm[:, -1] * np.exp(0.3 * rng.standard_normal(300))
    for name in rules.ALGORITHMS:
        phi = rules.threshold(name, y, 9.0, P)
        ratio, _ = simulate.accept_ratio(x, cm, phi)
        naive = [worstcase.sequence_ratio(row, f) for row, f in zip(x, phi)]
        np.testing.assert_allclose(ratio, naive, rtol=0, atol=0)


def test_scale_invariance():
    series = data.synthetic_market(3000, seed=1)
    cfg = api.OneMaxConfig(m=50.0, M=800.0, window=100, stride=20, noise=("exact", "lognormal", "prev-max"))
    a = api.run_empirical(cfg, series, 0, "s")
    cfg2 = api.OneMaxConfig(m=50.0 * 7.3, M=800.0 * 7.3, window=100, stride=20, noise=("exact", "lognormal", "prev-max"))
    b = api.run_empirical(cfg2, series * 7.3, 0, "s")
    for aa, bb in zip(a["algorithms"], b["algorithms"]):
        for ra, rb in zip(aa["empirical"], bb["empirical"]):
            for k in ("mean_ratio", "ratio_of_means", "min_ratio", "median_ratio"):
                assert ra[k] == pytest.approx(rb[k], rel=1e-9)


def test_stochastic_ratios_respect_guarantees():
    """On random markets no rule ever falls below its robustness, and with exact predictions nothing falls below
    its consistency; blind trust with exact predictions always sells at the maximum."""
    for market in ("walk", "uniform", "spikes"):
        cfg = api.OneMaxConfig(mode="stochastic", market=market, n_windows=3000, window=40,
                               noise=("exact", "lognormal"), errors=(0.5,))
        res = api.run_stochastic(cfg, seed=1)
        for a in res["algorithms"]:
            for row in a["stochastic"]:
                assert row["min_ratio"] >= a["robustness"] - 1e-9, (market, a["name"])
                if row["noise"] == "exact":
                    assert row["min_ratio"] >= a["consistency"] - 1e-9, (market, a["name"])
            if a["name"] == "trust":
                assert a["stochastic"][0]["min_ratio"] == 1.0


def test_parse_prices_formats():
    assert list(data.parse_prices("1\n2\n3\n")) == [1, 2, 3]
    assert list(data.parse_prices("date,close\nd1,5\nd2,6\n", column="close")) == [5, 6]
    assert list(data.parse_prices("a\tb\n1\t7\n2\t8\n")) == [7, 8]
    assert list(data.parse_prices("x,y\n1,7\n2,8\n", column="0")) == [1, 2]
    # a headerless file with a text column keeps its first row; comments and `;` work
    assert list(data.parse_prices("2024-01-01,5\n2024-01-02,6\n")) == [5, 6]
    assert list(data.parse_prices("# prices\nd;4\nd;9\n")) == [4, 9]


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_worst_case_contract(run_cli):
    _, doc = run_cli(["onemax-sim", "-q", "--mode", "worst-case", "--theta", "16", "--lam", "0.5"])
    by = {a["name"]: a for a in doc["result"]["algorithms"]}
    assert set(by) == set(rules.ALGORITHMS)
    for name in ("smooth", "sun"):
        assert round(by[name]["robustness"], 3) == 0.193 and round(by[name]["consistency"], 3) == 0.324
        assert by[name]["robustness_opt_over_alg"] == pytest.approx(1 / by[name]["robustness"])
    at = lambda n, e: next(p["ratio"] for p in by[n]["profile"] if abs(p["error"] - e) < 1e-9)
    assert round(at("sun", 0.9), 4) == 0.1931 and round(at("smooth", 0.9), 3) == 0.308


def test_cli_default_runs_embedded_market_and_is_deterministic(run_cli):
    _, a = run_cli(["onemax-sim", "-q", "--market-length", "5000"])
    _, b = run_cli(["onemax-sim", "-q", "--market-length", "5000"])
    assert a["result"]["bounds"]["lookahead"] is False and a["result"]["theta"] == 16.0
    for d in (a, b):
        d.pop("timing")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    _, c = run_cli(["onemax-sim", "-q", "--market-length", "5000", "--seed", "1"])
    assert c["result"] != a["result"]


@pytest.mark.filterwarnings("error::DeprecationWarning")  # stdin is read without click's deprecated get_text_stream
def test_cli_stdin_and_lookahead_flag(run_cli):
    series = data.synthetic_market(1000, seed=2)
    _, doc = run_cli(["onemax-sim", "-q", "--prices", "-", "--window", "50", "--noise", "exact"],
                     input="\n".join(map(str, series)))
    assert doc["result"]["bounds"]["lookahead"] is True
    assert doc["result"]["n_windows"] == len(range(0, 1000 - 50 + 1, 10))


def test_cli_stochastic(run_cli):
    _, doc = run_cli(["onemax-sim", "-q", "--mode", "stochastic", "--n-windows", "500", "--window", "30"])
    assert all("stochastic" in a for a in doc["result"]["algorithms"])


def test_cli_plot(run_cli, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "g.png"
    _, doc = run_cli(["onemax-sim", "-q", "--mode", "worst-case", "--plot", str(png)])
    assert png.read_bytes()[:4] == b"\x89PNG" and doc["artifacts"]["plot"] == str(png)
    png2 = tmp_path / "s.png"  # other modes plot the worst-case profiles at the run's theta (api, not the command)
    _, doc = run_cli(["onemax-sim", "-q", "--mode", "stochastic", "--n-windows", "200", "--window", "20",
                      "--theta", "9", "--plot", str(png2)])
    assert png2.read_bytes()[:4] == b"\x89PNG" and doc["artifacts"]["plot"] == str(png2)


@pytest.mark.parametrize("content,extra,msg", [
    ("", [], "empty"),
    ("1\n2\nfoo\n", [], "row 3"),
    ("1\n-2\n3\n", [], "positive"),
    ("1\nnan\n3\n", [], "finite"),
    ("60\n900\n70\n", ["--m", "50", "--M", "800"], "outside"),
])
def test_cli_bad_price_files(run_cli, tmp_path, content, extra, msg):
    f = tmp_path / "p.csv"
    f.write_text(content)
    png = tmp_path / "never.png"
    res, _ = run_cli(["onemax-sim", "--prices", str(f), "--window", "2", "--plot", str(png), *extra], expect_code=2)
    assert msg in res.stderr and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0  # one line
    assert res.stdout == "" and not png.exists()


@pytest.mark.parametrize("args", [["--theta", "1"], ["--theta", "0.5"], ["--lam", "1.5"], ["--lam", "-0.1"],
                                  ["--robustness", "0.5"], ["--algorithms", "nope"], ["--errors", "0,2"],
                                  ["--prices", "x.csv"], ["--bogus"]])
def test_cli_bad_parameters_exit_2(run_cli, args):
    res, _ = run_cli(["onemax-sim", "--mode", "worst-case", *args], expect_code=2)
    assert "Traceback" not in res.stderr and "Error" in res.stderr


def test_cli_missing_price_file_exit_2(run_cli):
    res, _ = run_cli(["onemax-sim", "--prices", "/no/such/file"], expect_code=2)
    assert "no such file" in res.stderr


# ------------------------------------------------------------------------------------------ the house pattern


def test_lists_live_once_and_api_picks_error_levels():
    from icmltools.onemax import options

    assert rules.ALGORITHMS == options.ALGORITHMS and simulate.NOISE_MODELS == options.NOISE_MODELS
    assert tuple(rules.THRESHOLDS) == options.ALL_ALGORITHMS and api.MODES == options.MODES
    assert rules.RuleParams is options.RuleParams and api.OneMaxConfig is options.OneMaxConfig
    wc = api.resolve(api.OneMaxConfig(mode="worst-case"))
    assert len(wc.errors) == options.WORST_CASE_POINTS and wc.errors[0] == 0.0 and wc.errors[-1] == 1.0
    assert api.resolve(api.OneMaxConfig()).errors == options.SIMULATION_ERRORS
    assert api.resolve(api.OneMaxConfig(errors=(0.7,))).errors == (0.7,)


def test_embedded_market_alone_equals_inside_the_run():
    """The embedded market and the predictions come from derived streams: the market built alone and fed to
    run_empirical with the declared bounds gives the command's numbers."""
    from dataclasses import replace

    cfg = api.OneMaxConfig(market_length=3000, window=100, stride=20, noise=("exact", "lognormal", "prev-max"))
    res, art = api.run(cfg, seed=2)
    assert art == {} and res["bounds"]["m"] == data.MARKET_BOUNDS[0] and res["bounds"]["M"] == data.MARKET_BOUNDS[1]
    alone = api.run_empirical(replace(cfg, m=50.0, M=800.0), data.synthetic_market(3000, seed=2), 2, res["source"])
    assert alone == res
    other, _ = api.run(cfg, seed=3)
    assert other["algorithms"] != res["algorithms"]


def test_library_errors_name_parameters(run_cli):
    from icmltools.core.errors import BadInputError

    for call, param in ((lambda: rules.validate(1.0), "theta"),
                        (lambda: rules.validate(16.0, RuleParams(lam=2.0)), "lam"),
                        (lambda: data.check_bounds(np.ones(3), 1.0, None), "M"),
                        (lambda: api.run(api.OneMaxConfig(mode="stochastic", market="nope")), "market"),
                        (lambda: api.run(api.OneMaxConfig(mode="worst-case", errors=(1.5,))), "errors")):
        with pytest.raises(BadInputError) as ei:
            call()
        assert ei.value.param == param and "--" not in ei.value.message, (param, ei.value.message)
    res, _ = run_cli(["onemax-sim", "--market-length", "500", "--m", "50"], expect_code=2)
    assert res.stderr.startswith("Error: --M: give both m and M"), res.stderr
    res, _ = run_cli(["onemax-sim", "--mode", "worst-case", "--errors", "0.9,x"], expect_code=2)
    assert "--errors" in res.stderr and "not a number" in res.stderr
    _, doc = run_cli(["onemax-sim", "-q", "--mode", "worst-case", "--algorithms", "all", "--errors", "0.9"])
    assert [a["name"] for a in doc["result"]["algorithms"]] == list(rules.ALGORITHMS + rules.EXTRA_ALGORITHMS)
