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


# --------------------------------------------------------------------------------------- bad inputs (issue 19)
# The command's rows of the project's bad-input catalogue (tests/test_bad_inputs.py holds the generic rows):
# argv after `onemax-sim`, the exit code, a substring of the one stderr line. Every row runs in an empty folder
# holding FILES (and ICML_RUNS_DIR under it), with empty stdin, and must leave no file behind.
FILES = {
    "prices.txt": "\n".join(f"{60 + (7 * k) % 700}" for k in range(300)) + "\n",
    "short.txt": "1\n2\n3\n",
    "flat.txt": "50\n50\n50\n",
    "empty.txt": "",
    "comments.txt": "# prices, none yet\n\n",
    "table.csv": "date,close\n2024-01-01,5\n2024-01-02,6\n2024-01-03,7\n",
    "nan.csv": "date,close\nd1,5\nd2,nan\nd3,6\n",
    "inf.txt": "5\ninf\n6\n",
    "negative.txt": "5\n-2\n6\n",
    "zero.txt": "5\n0\n6\n",
    "huge.txt": "5\n1e400\n6\n",
    "word.txt": "1\n2\nfoo\n",
    "ragged.csv": "a,b\n1,2\n3\n",
    "outside.txt": "60\n900\n70\n",
    "binary.dat": b"\x00\x01\x02\xff\xfe",
    "folder/keep.txt": "1\n",
}

BAD_INPUTS = [
    # the price file
    (["--prices", "empty.txt"], 2, "empty.txt: no values (empty input)"),
    (["--prices", "comments.txt"], 2, "comments.txt: no values"),
    (["--prices", "-"], 2, "<stdin>: no values (empty input)"),
    (["--prices", "missing.csv"], 2, "missing.csv: no such file"),
    (["--prices", "folder"], 2, "folder: is a directory"),
    (["--prices", "binary.dat"], 2, "binary.dat: not a UTF-8 text file"),
    (["--prices", "table.csv", "--column", "price"], 2, "no column named 'price' (columns: date, close)"),
    (["--prices", "table.csv", "--column", "5"], 2, "column 5 out of range"),
    (["--prices", "ragged.csv"], 2, "ragged.csv: line 3 has 1 column(s)"),
    (["--prices", "word.txt", "--window", "2"], 2, "word.txt: line 3: not a number: 'foo'"),
    (["--prices", "nan.csv", "--window", "2", "--plot", "never.png"], 2,
     "nan.csv: line 3, last column: price 'nan' is not finite"),
    (["--prices", "nan.csv", "--column", "close"], 2, "nan.csv: line 3, column 'close': price 'nan' is not finite"),
    (["--prices", "nan.csv", "--column", "1"], 2, "nan.csv: line 3, column 1: price 'nan' is not finite"),
    (["--prices", "inf.txt", "--window", "2"], 2, "inf.txt: line 2: price 'inf' is not finite"),
    (["--prices", "huge.txt", "--window", "2"], 2, "huge.txt: line 2: price '1e400' is not finite"),
    (["--prices", "negative.txt", "--window", "2"], 2, "negative.txt: line 2: price '-2' is not positive"),
    (["--prices", "zero.txt", "--window", "2"], 2, "zero.txt: line 2: price '0' is not positive"),
    # windows and bounds
    (["--prices", "short.txt", "--window", "10", "--plot", "never.png"], 2,
     "--window: short.txt: 3 prices, fewer than the window length 10"),
    (["--market-length", "100"], 2, "100 prices, fewer than the window length 200"),
    (["--prices", "short.txt", "--window", "2", "--noise", "prev-max"], 2, "--window: short.txt: 3 prices; prev-max"),
    (["--prices", "prices.txt", "--m", "800", "--M", "50"], 2, "--m: need 0 < m < M, got m=800.0, M=50.0"),
    (["--prices", "prices.txt", "--m", "0", "--M", "800"], 2, "--m: need 0 < m < M"),
    (["--prices", "prices.txt", "--m", "-5", "--M", "800"], 2, "--m: need 0 < m < M"),
    (["--prices", "prices.txt", "--m", "50"], 2, "--M: give both m and M"),
    (["--prices", "prices.txt", "--M", "800"], 2, "--m: give both m and M"),
    (["--prices", "prices.txt", "--m", "1e-300", "--M", "1e300"], 2, "--M: M/m = inf must be <= 1e300"),
    (["--prices", "flat.txt", "--window", "2", "--m", "50", "--M", "50.00000000001"], 2, "--M: M/m = "),
    (["--prices", "outside.txt", "--window", "2", "--m", "50", "--M", "800", "--plot", "never.png"], 2,
     "lies outside the declared [m, M]"),
    (["--prices", "prices.txt", "--m", "50", "--M", "800", "--robustness", "0.01"], 2,
     "--robustness: must lie in [1/theta, theta^-1/2] = [0.0625, 0.25]"),
    (["--prices", "prices.txt", "--errors", "0"], 2, "--errors: values are E = min(y/p*, p*/y) and must lie in (0, 1]"),
    (["--window", "1"], 2, "--window"),
    (["--stride", "0"], 2, "--stride"),
    # modes and parameters
    (["--mode", "worst-case", "--prices", "prices.txt"], 2, "--prices is read only in --mode empirical"),
    (["--mode", "stochastic", "--noise", "prev-max"], 2, "--noise: prev-max is not available in stochastic mode"),
    (["--mode", "worst-case", "--theta", "1"], 2, "--theta"),
    (["--mode", "worst-case", "--theta", "0.5"], 2, "--theta"),
    (["--mode", "worst-case", "--theta", "1.0000000000001"], 2, "--theta: must lie in [1 + 1e-9, 1e300]"),
    (["--mode", "worst-case", "--theta", "1e308"], 2, "--theta: must lie in [1 + 1e-9, 1e300]"),
    (["--mode", "worst-case", "--theta", "1e16", "--robustness", "1e-17"], 2, "--robustness: must lie in [1/theta"),
    (["--mode", "worst-case", "--robustness", "0.5"], 2, "--robustness"),
    (["--mode", "worst-case", "--lam", "1.5"], 2, "--lam"),
    (["--mode", "worst-case", "--lam", "-0.1"], 2, "--lam"),
    (["--mode", "worst-case", "--hn", "1"], 2, "--hn"),
    (["--mode", "worst-case", "--algorithms", "nope"], 2, "nope"),
    (["--mode", "worst-case", "--errors", "0,2"], 2, "--errors"),
    (["--mode", "worst-case", "--errors", "0.9,x"], 2, "--errors"),
    (["--mode", "stochastic", "--n-windows", "0"], 2, "--n-windows"),
    (["--mode", "worst-case", "--plot", "profiles.txt"], 2, "--plot: profiles.txt: cannot write format 'txt'"),
    (["--mode", "worst-case", "--bogus"], 2, "--bogus"),
]


@pytest.fixture
def price_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, content in FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            (tmp_path / name).write_text(content, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("argv,code,msg", [pytest.param(*row, id=" ".join(row[0])) for row in BAD_INPUTS])
def test_bad_inputs(price_files, argv, code, msg, check_bad_input):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    before = check_bad_input.snapshot(price_files)
    res = CliRunner().invoke(cli, ["onemax-sim", *argv], input="")
    check_bad_input(res, code, msg, root=price_files, before=before)  # no plot, run folder or temp file left


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


# ------------------------------------------------------------------------------------------ issue 19 (reliability)


def test_ora_and_robust_mix_sell_at_the_max_when_the_threshold_equals_it():
    """(a) With y = p*/(1-H_n) ('over' at E = 1-H_n) the ORA threshold (1-H_n)*y is p* itself: every window
    sells at its maximum. Before the fix rounding put the threshold an ulp above p* in many windows (means
    0.889, minimum 0.108 on this market)."""
    series = data.synthetic_market(5000, seed=0)
    for hn in (0.1, 0.05, 0.3, 0.37):
        cfg = api.OneMaxConfig(m=50.0, M=800.0, window=200, stride=10, noise=("over",), errors=(1 - hn,),
                               algorithms=("ora", "robust-mix"), params=RuleParams(hn=hn, hp=0.1))
        res = api.run_empirical(cfg, series, 0, "s")
        for a in res["algorithms"]:
            row = a["empirical"][0]
            assert row["min_ratio"] == 1.0 and row["mean_ratio"] == 1.0, (hn, a["name"], row)


@pytest.mark.parametrize("name", ALL)
def test_a_price_equal_to_the_threshold_is_reached_by_every_rule(name):
    """(a) for every rule: in a window [m, p, m] whose maximum p is the rule's threshold written in real
    units (p = Phi * m, as a price file holds it), the rule sells at p. Comparing p/m with Phi exactly missed
    it whenever p/m rounded an ulp below Phi."""
    rng = np.random.default_rng(5)
    n = 4000
    m = rng.uniform(0.5, 100.0, n)
    theta = rng.uniform(1.5, 60.0, n)
    y = np.exp(rng.uniform(0.0, np.log(theta)))
    phi = rules.threshold(name, y, theta, P)
    x = np.stack([m, phi * m, m], axis=1)
    xn = x / m[:, None]
    ratio, _ = simulate.accept_ratio(xn, np.maximum.accumulate(xn, axis=1), phi)
    assert np.all(ratio == 1.0), (name, int(np.sum(ratio < 1.0)))


THETAS = [1.0 + 2e-9, 1.5, 16.0, 1e6, 1e12, 1e16, 1e100, 1e200, 1e300]


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("theta", THETAS)
def test_worst_case_is_exact_at_every_theta(theta):
    """(b) r and c of every rule, and smooth's profile, hold at every theta the command accepts: trust's
    consistency is 1 (it read 0.50 at 1e12 and 1e-4 at 1e16), the Pareto rules lie on c*r = 1/theta, ORA's
    consistency is 1 - H_n, and pareto_optimal is false for ORA (the absolute 1e-9 test said true at 1e12)."""
    p = RuleParams(lam=0.5)
    r, c = worstcase.robustness_consistency("trust", theta, p)
    assert c == pytest.approx(1.0, rel=1e-9) and r * theta == pytest.approx(1.0, rel=1e-9)
    r, c = worstcase.robustness_consistency("elyaniv", theta, p)
    assert r == pytest.approx(theta ** -0.5, rel=1e-9) and c == pytest.approx(theta ** -0.5, rel=1e-9)
    r_target = float(p.r(theta))
    for name in ("sun", "smooth", "smooth-rho"):
        r, c = worstcase.robustness_consistency(name, theta, p)
        assert r == pytest.approx(r_target, rel=1e-9) and c * r * theta == pytest.approx(1.0, rel=1e-9), name
        assert rules.is_pareto_optimal(r, c, theta)
    if theta >= 1 / 0.9:
        r, c = worstcase.robustness_consistency("ora", theta, p)
        assert c == pytest.approx(0.9, rel=1e-9) and not rules.is_pareto_optimal(r, c, theta)
    errors = [0.0, 0.3, 0.5, 0.9, 1.0]
    bound = worstcase.smoothness_bound(r_target, 1 / (r_target * theta), theta, errors)
    np.testing.assert_allclose(worstcase.profile("smooth", theta, p, errors), bound, rtol=1e-8)


def test_sun_gamma_is_accurate_for_small_lambda_and_large_theta():
    """(b) The rationalised root has no cancellation (the textbook form lost ~4 digits at lam = 1e-12) and no
    overflow (4*lam*theta overflowed near the largest float)."""
    for lam, theta in ((1e-12, 16.0), (1e-6, 1e6), (0.5, 1e300), (1.0, 1e300), (0.0, 7.0)):
        g = float(rules.sun_gamma(lam, theta))
        assert lam * g * g + (1 - lam) * g == pytest.approx(theta, rel=1e-12), (lam, theta)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_cli_large_theta_and_extreme_errors_leak_no_warning(run_cli):
    """(b) `--theta 1e300` runs with exact figures and nothing on stderr; `--theta 1e308` is refused (a row of
    BAD_INPUTS; it leaked a RuntimeWarning and died of ZeroDivisionError). r = 1/theta gives s* = inf, which
    the JSON shows as null (it leaked a RuntimeWarning); extreme error levels overflow no prediction."""
    res, doc = run_cli(["onemax-sim", "--mode", "worst-case", "--theta", "1e300", "--errors", "0.5,1"])
    assert res.stderr == ""
    by = {a["name"]: a for a in doc["result"]["algorithms"]}
    assert by["trust"]["consistency"] == pytest.approx(1.0) and by["trust"]["robustness"] == pytest.approx(1e-300)
    res, doc = run_cli(["onemax-sim", "--mode", "worst-case", "--theta", "16", "--robustness", "0.0625"])
    assert res.stderr == "" and doc["result"]["s_star"] is None
    res, doc = run_cli(["onemax-sim", "-q", "--market-length", "3000", "--errors", "1e-300"])
    assert res.stderr == ""
    row = next(r for r in doc["result"]["algorithms"][0]["empirical"] if r["noise"] == "over")
    assert row["mean_error_E"] == pytest.approx(1e-300, rel=1e-9)
    res, doc = run_cli(["onemax-sim", "-q", "--mode", "stochastic", "--theta", "1e300", "--n-windows", "300",
                        "--window", "20", "--noise", "exact"])
    assert res.stderr == ""
    for a in doc["result"]["algorithms"]:  # ratios near 1/theta are kept (float32 rounded them to 0)
        assert a["stochastic"][0]["min_ratio"] >= a["robustness"] * (1 - 1e-9), a["name"]


def test_flat_windows_score_one_without_warnings(run_cli, tmp_path):
    """A window whose prices are all equal (theta = 1 with look-ahead bounds) sells at the maximum whatever
    the rule; it produced NaN exponents and a RuntimeWarning."""
    f = tmp_path / "flat.txt"
    f.write_text("5\n5\n5\n5\n5\n5\n5\n")
    res, doc = run_cli(["onemax-sim", "-q", "--prices", str(f), "--window", "3", "--stride", "1",
                        "--noise", "exact,over,prev-max"])
    assert res.stderr == ""
    for a in doc["result"]["algorithms"]:
        assert all(r["min_ratio"] == 1.0 for r in a["empirical"]), a["name"]


def test_prev_max_keeps_every_other_models_windows():
    """(c) Adding prev-max changes no other model's rows: each keeps all windows (its own n); prev-max is
    scored on the windows that have a full previous window. Before the fix every model lost the first
    window's worth of windows."""
    series = data.synthetic_market(3000, seed=1)
    base = dict(m=50.0, M=800.0, window=100, stride=20, errors=(0.9, 0.5))
    without = api.run_empirical(api.OneMaxConfig(noise=("exact", "over", "lognormal"), **base), series, 4, "s")
    with_pm = api.run_empirical(api.OneMaxConfig(noise=("exact", "over", "lognormal", "prev-max"), **base),
                                series, 4, "s")
    starts = np.arange(0, 3000 - 100 + 1, 20)
    assert with_pm["n_windows"] == without["n_windows"] == len(starts)
    for a, b in zip(without["algorithms"], with_pm["algorithms"]):
        assert b["empirical"][:-1] == a["empirical"]
        assert all(r["n"] == len(starts) for r in a["empirical"])
        assert b["empirical"][-1]["noise"] == "prev-max" and b["empirical"][-1]["n"] == int(np.sum(starts >= 100))
    assert with_pm["noise_not_available"] == {} and with_pm["warnings"] == []


def test_a_series_too_short_for_prev_max_keeps_the_other_models(run_cli, tmp_path):
    """(c) A series shorter than two windows cannot feed prev-max: the other models still run, and prev-max is
    reported as not available with the reason (JSON and stderr). Alone, it is an error (BAD_INPUTS)."""
    f = tmp_path / "p.txt"
    f.write_text("\n".join(map(str, data.synthetic_market(150, seed=3))))
    res, doc = run_cli(["onemax-sim", "--prices", str(f), "--window", "100", "--m", "50", "--M", "800",
                        "--noise", "exact,prev-max"])
    r = doc["result"]
    assert [row["noise"] for row in r["algorithms"][0]["empirical"]] == ["exact"]
    assert "at least 2 x window = 200 prices" in r["noise_not_available"]["prev-max"]
    assert r["warnings"] == ["prev-max not available: " + r["noise_not_available"]["prev-max"]]
    assert "Warning: prev-max not available" in res.stderr


def test_a_utf8_bom_keeps_the_first_price(run_cli, tmp_path):
    """(d) A UTF-8 byte-order mark (Excel, Notepad) made the first price look like a header, which was
    dropped; in a CSV it renamed the first column. The one reader (core.table.read_column) drops it."""
    assert list(data.parse_prices("\ufeff5\n6\n7\n")) == [5, 6, 7]
    assert list(data.parse_prices("\ufeffclose,date\n5,d1\n6,d2\n", column="close")) == [5, 6]
    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbf100\n200\n300\n")
    _, doc = run_cli(["onemax-sim", "-q", "--prices", str(f), "--window", "2", "--stride", "1", "--noise", "exact"])
    assert doc["result"]["n_prices"] == 3 and doc["result"]["n_windows"] == 2
    _, doc = run_cli(["onemax-sim", "-q", "--prices", "-", "--window", "2", "--noise", "exact"],
                     input="\ufeff100\n200\n300\n")
    assert doc["result"]["n_prices"] == 3


def test_plot_draws_the_exact_profiles():
    """(e) The plot is exact: straight segments between exact vertices (no steps: on a 21-point step grid
    smooth appeared below its own bound), smooth equal to the bound at every vertex, sun's jump at E = 1
    drawn there, axes labelled with the prediction quality, and coincident curves told apart."""
    pytest.importorskip("matplotlib")
    from icmltools.onemax import plot

    curves = worstcase.plot_curves(16.0, P, rules.ALGORITHMS)
    e = curves["error"]
    np.testing.assert_allclose(curves["curves"]["smooth"], curves["bound"], rtol=1e-8)
    sun = curves["curves"]["sun"]
    r, c = worstcase.robustness_consistency("sun", 16.0, P)
    assert sun[-1] == pytest.approx(c) and e[-1] == 1.0
    assert sun[-2] == pytest.approx(r) and 1.0 - e[-2] <= 1e-6  # the jump located to 1e-6 in E
    ora = curves["curves"]["ora"]  # ORA's jump at E = 1 - H_n = 0.9: from about 1/(theta E) up to 0.81
    k = int(np.argmax(np.diff(ora)))
    assert e[k + 1] - e[k] <= 1e-6 and e[k + 1] == pytest.approx(0.9, abs=1e-6) and ora[k + 1] == pytest.approx(0.81)
    fig = plot.figure(curves, theta_note="the median of the windows' max/min")
    ax = fig.axes[0]
    assert "quality E" in ax.get_xlabel() and "quality >= E" in ax.get_ylabel()
    assert "median" in ax.get_title()
    lines = {ln.get_label().split("  (")[0]: ln for ln in ax.get_lines()}
    assert all(ln.get_drawstyle() == "default" for ln in lines.values())
    np.testing.assert_array_equal(lines["smooth"].get_xdata(), e)
    for a, b in (("ora", "robust-mix"), ("smooth", "bound max(r, c E^s*)"), ("sun", "smooth")):
        sa, sb = lines[a], lines[b]
        assert (sa.get_linestyle(), sa.get_linewidth()) != (sb.get_linestyle(), sb.get_linewidth()), (a, b)
    assert "same curve as ora" in lines["robust-mix"].get_label()
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_plot_says_when_it_uses_the_median_theta(tmp_path, monkeypatch):
    """(e) An empirical run without bounds plots at the median theta of its windows and says so; with
    declared bounds it says M/m."""
    pytest.importorskip("matplotlib")
    from icmltools.onemax import plot

    seen = []
    monkeypatch.setattr(plot, "plot_profiles", lambda curves, path, theta_note="": seen.append(theta_note) or path)
    series = data.synthetic_market(1000, seed=2)
    f = tmp_path / "p.txt"
    f.write_text("\n".join(map(str, series)))
    cfg = api.OneMaxConfig(prices=str(f), window=100, noise=("exact",), plot=str(tmp_path / "g.png"))
    res, _ = api.run(cfg)
    assert res["theta_is_median_of_windows"] and "median of the windows" in seen[-1]
    from dataclasses import replace

    api.run(replace(cfg, m=50.0, M=800.0))
    assert "M/m of the declared bounds [50, 800]" in seen[-1]


def test_lookahead_is_a_warning_in_the_json_and_on_stderr(run_cli, tmp_path):
    """(f) Without bounds each window's own max caps over-predictions, so trust scores 1.000 on 'over': the
    result says so in `warnings` (not only a flag) and stderr says it unless -q; declared bounds: no warning."""
    f = tmp_path / "p.txt"
    f.write_text("\n".join(map(str, data.synthetic_market(1000, seed=2))))
    res, doc = run_cli(["onemax-sim", "--prices", str(f), "--window", "100", "--noise", "over", "--errors", "0.5",
                        "--algorithms", "trust"])
    assert doc["result"]["warnings"][0].startswith("look-ahead: no bounds declared")
    assert doc["result"]["algorithms"][0]["empirical"][0]["min_ratio"] == 1.0  # the look-ahead, visible
    assert "LOOK-AHEAD" in res.stderr and "Warning: look-ahead" in res.stderr
    res, doc = run_cli(["onemax-sim", "--prices", str(f), "--window", "100", "--noise", "over", "--errors", "0.5",
                        "--algorithms", "trust", "--m", "50", "--M", "800"])
    assert doc["result"]["warnings"] == [] and "Warning" not in res.stderr
    assert doc["result"]["algorithms"][0]["empirical"][0]["min_ratio"] < 1.0
