"""icml dsgda: exact checks of the round maps, the regime split, noise robustness, bad inputs, the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest

from icmltools.dsgda import api, games, maps, oracle, search
from icmltools.dsgda.options import GAME_DEFAULTS, LR_GRID, METHODS, RunConfig
from icmltools.dsgda.sim import Noise, simulate


@pytest.fixture(scope="module")
def quad():
    return games.quadratic(dim=4, kappa=20, mu=1.0, coupling=1.0, seed=0)


def _affine_traj(game, method, K, lr, iters):
    m = maps.METHODS[method]
    M = m.matrices(game, [lr], K)
    errs, _ = search.affine_errors(M, m.lift(game.x0 - game.xstar), game.n, iters)
    return errs[:, 0]


# ------------------------------------------------------------------ games


def test_quadratic_construction(quad):
    d = 4
    A, C, B = quad.J[:d, :d], quad.J[:d, d:], quad.J[d:, d:]
    assert np.allclose(np.linalg.eigvalsh(A), np.geomspace(1, 20, d))
    assert np.allclose(np.linalg.eigvalsh(B), np.geomspace(1, 20, d))
    assert np.isclose(np.linalg.norm(C, 2), 1.0)
    assert np.allclose(quad.J[d:, :d], -C.T)
    assert np.allclose(quad.J @ quad.xstar + quad.h, 0)
    # rho_BR = sqrt(rho(A^-1 C B^-1 C')) for two players (spec)
    two = np.sqrt(np.max(np.abs(np.linalg.eigvals(np.linalg.solve(A, C) @ np.linalg.solve(B, C.T)))))
    assert np.isclose(quad.rho_br(), two)


def test_coupling_only_scales_the_same_draws():
    g1 = games.quadratic(3, 10, 1.0, 1.0, seed=5)
    g3 = games.quadratic(3, 10, 1.0, 3.0, seed=5)
    assert np.allclose(g3.O, 3 * g1.O) and np.array_equal(g1.D, g3.D) and np.array_equal(g1.h, g3.h)
    # a stage alone (build_game inside the pipeline) == the game built directly
    g = api.build_game(api.resolve(RunConfig(dim=3, kappa=10)), 3.0, seed=5)
    assert np.array_equal(g.J, g3.J) and np.array_equal(g.h, g3.h)


def test_nplayer_symmetric_part_is_block_diagonal():
    g = games.nplayer(players=4, dim=3, kappa=10, mu=1.0, coupling=2.0, seed=1)
    sym = (g.J + g.J.T) / 2
    assert np.allclose(sym, (g.D + g.D.T) / 2)
    assert np.min(np.linalg.eigvalsh(sym)) > 0


def test_dirac_gan_operator_matches_its_jacobian():
    g = games.dirac_gan(dim=3, lam=0.8, seed=0)
    x = 1e-6 * np.arange(1, 7)
    assert np.allclose(g.F(x), g.J @ x, atol=1e-15)
    assert np.allclose(g.F(np.zeros(6)), 0)
    # own_grads at the communicated point equals F there
    X = np.random.default_rng(0).standard_normal((2, 6))
    assert np.allclose(g.own_grads(X, X), g.F(X))


# ------------------------------------------------------------------ the spec's exact checks


def test_decoupled_k1_equals_gda(quad):
    lrs = [0.01, 0.05]
    assert np.allclose(maps.METHODS["decoupled"].matrices(quad, lrs, 1), maps.METHODS["gda"].matrices(quad, lrs, 1))
    a, _ = simulate(quad, "decoupled", 1, lrs, 50)
    b, _ = simulate(quad, "gda", 1, lrs, 50)
    assert np.allclose(a, b, rtol=1e-12, atol=0)
    # the oracle loop: K = 1 is exactly GDA's round
    grads = [lambda y, xs, i=i: (quad.J[quad.slices[i]] @ np.concatenate([y if j == i else xs[j] for j in range(2)])
                                 + quad.h[quad.slices[i]]) for i in range(2)]
    x0 = [np.ones(4), -np.ones(4)]
    assert all(np.array_equal(p, q) for p, q in zip(oracle.decoupled_round(grads, x0, 0.05, 1),
                                                    oracle.gda_round(grads, x0, 0.05)))


@pytest.mark.parametrize("method", METHODS)
def test_affine_map_equals_direct_simulation(quad, method):
    K = 7
    lr = 0.03
    m = maps.METHODS[method]
    direct, _ = simulate(quad, method, K, [lr], 40)
    exact = _affine_traj(quad, method, K, lr, 40)
    assert np.allclose(direct[:, 0, 0], exact, rtol=1e-9, atol=1e-14), method
    assert exact[-1] < 0.9 or m.name in ("ogda", "eg")  # it moves


def test_affine_map_equals_direct_simulation_nplayer():
    g = games.nplayer(players=3, dim=2, kappa=10, mu=1.0, coupling=1.5, seed=2)
    for method in METHODS:
        direct, _ = simulate(g, method, 5, [0.04], 30)
        assert np.allclose(direct[:, 0, 0], _affine_traj(g, method, 5, 0.04, 30), rtol=1e-9, atol=1e-14), method


def test_oracle_loop_equals_the_exact_map(quad):
    grads = [lambda y, xs, i=i: (quad.J[quad.slices[i]] @ np.concatenate([y if j == i else xs[j] for j in range(2)])
                                 + quad.h[quad.slices[i]]) for i in range(2)]
    out = oracle.solve(grads, [np.zeros(4), np.zeros(4)], method="decoupled", lr=0.03, K=6, rounds=12)
    M = maps.METHODS["decoupled"].matrices(quad, [0.03], 6)[0]
    e = np.linalg.matrix_power(M, 12) @ (quad.x0 - quad.xstar)
    assert np.allclose(np.concatenate(out["x"]) - quad.xstar, e, atol=1e-12)
    loc = oracle.solve(grads, [np.zeros(4), np.zeros(4)], method="localsgda", lr=0.03, K=6, rounds=5)
    M = maps.METHODS["localsgda"].matrices(quad, [0.03], 6)[0]
    assert np.allclose(np.concatenate(loc["x"]) - quad.xstar,
                       np.linalg.matrix_power(M, 5) @ (quad.x0 - quad.xstar), atol=1e-12)


@pytest.mark.parametrize("method,K", [("decoupled", 10), ("decoupled", 50), ("gda", 1), ("eg", 1), ("ghost", 10)])
def test_measured_rate_matches_spectral_radius(quad, method, K):
    lr = 0.02
    m = maps.METHODS[method]
    rho = maps.spectral_radius(m.matrices(quad, [lr], K))[0] ** (1 / m.rounds_per_iter)
    iters = int(np.log(1e-120) / np.log(rho) / m.rounds_per_iter)  # far down, before norms underflow
    errs = _affine_traj(quad, method, K, lr, min(iters, 20000))
    assert abs(search.measured_rate(errs, m.rounds_per_iter) - rho) < 1e-3


def test_decoupled_map_is_the_closed_form(quad):
    lr, K = 0.02, 13
    P = np.zeros_like(quad.J)
    for s in quad.slices:
        P[s, s] = np.linalg.matrix_power(np.eye(s.stop - s.start) - lr * quad.J[s, s], K)
    closed = P - (np.eye(quad.n) - P) @ np.linalg.solve(quad.D, quad.O)
    assert np.allclose(maps.METHODS["decoupled"].matrices(quad, [lr], K)[0], closed, atol=1e-12)


@pytest.mark.parametrize("factor,diverges", [(0.2, False), (0.95, False), (1.05, True), (3.0, True)])
def test_divergence_exactly_when_best_response_radius_exceeds_one(factor, diverges):
    """K = 1e4, lr = 1/L: M_K -> -D^-1 O (block Jacobi); rho_BR is linear in the coupling, so the game at
    coupling factor / rho_BR(1) sits at rho_BR = factor."""
    c = factor / games.quadratic(dim=4, kappa=10, mu=1.0, coupling=1.0, seed=3).rho_br()
    g = games.quadratic(dim=4, kappa=10, mu=1.0, coupling=c, seed=3)
    assert np.isclose(g.rho_br(), factor)
    L = 10.0
    row = search.affine_search(g, "decoupled", 10_000, np.array([1 / L]), 1e-6, 5000)
    M = maps.METHODS["decoupled"].matrices(g, [1 / L], 10_000)
    assert np.isclose(maps.spectral_radius(M)[0], factor, rtol=1e-6)
    assert (row["rounds_to_eps"] is None) == diverges
    assert row["status"] == ("diverged" if diverges else "converged")


def test_eg_counts_two_rounds_per_iteration(quad):
    row = search.affine_search(quad, "eg", 1, np.array(LR_GRID), 1e-6, 20000)
    assert row["rounds_to_eps"] == 2 * row["iterations"] and row["grad_evals"] == 2 * row["iterations"]
    it = _affine_traj(quad, "eg", 1, row["lr"], row["iterations"])
    assert it[-1] <= 1e-6 < it[-2]


# ------------------------------------------------------------------ the paper's effects


def test_weak_coupling_decoupled_uses_a_twentieth_of_gda_rounds():
    res, _ = api.run(RunConfig(coupling=(0.1, 0.3, 1.0), local_steps=(100,), methods=("decoupled", "gda")), seed=0)
    for c in (0.1, 0.3, 1.0):
        dec = next(r for r in res["results"] if r["coupling"] == c and r["method"] == "decoupled")
        gda = next(r for r in res["results"] if r["coupling"] == c and r["method"] == "gda")
        assert dec["rho_br"] < 1
        assert dec["rounds_to_eps"] * 20 <= gda["rounds_to_eps"], (c, dec["rounds_to_eps"], gda["rounds_to_eps"])


def test_strong_coupling_is_where_it_stops_paying_off():
    res, _ = api.run(RunConfig(coupling=(1.0, 30.0), local_steps=(100,),
                               methods=("decoupled", "gda", "altgda", "ogda", "eg")), seed=0)
    reg = res["regime"][0]
    assert (reg["method"], reg["K"]) == ("decoupled", 100)
    assert reg["stops_paying_off_at"] == 30.0
    assert reg["per_coupling"][0]["speedup"] > 20 and reg["per_coupling"][1]["speedup"] < 1


def test_decoupled_rounds_barely_depend_on_kappa_in_weak_regime():
    cfg = dict(coupling=(0.1,), local_steps=(100,), methods=("decoupled", "gda"))
    hi, _ = api.run(RunConfig(kappa=100.0, **cfg), seed=0)
    lo, _ = api.run(RunConfig(kappa=10.0, **cfg), seed=0)
    r = {(k, x["method"]): x["rounds_to_eps"] for k, d in (("hi", hi), ("lo", lo)) for x in d["results"]}
    assert r["hi", "gda"] >= 5 * r["lo", "gda"]           # GDA scales with kappa
    assert r["hi", "decoupled"] <= 2 * r["lo", "decoupled"]  # Decoupled barely does


def test_off_diagonal_noise_leaves_decoupled_bitwise_unchanged():
    g = games.quadratic(dim=5, kappa=10, mu=1.0, coupling=0.3, seed=0)
    sig = np.ones(g.n)
    lrs = np.array([0.02, 0.01])
    runs = {lvl: simulate(g, "decoupled", 10, lrs, 60, seeds=2, noise=Noise(0, 2, g.n, sig, lvl))[0]
            for lvl in (0.0, 10.0)}
    assert np.array_equal(runs[0.0], runs[10.0])
    loc = [search.stochastic_search(g, "localsgda", 10, np.array([0.02]), 1e-6, 200, 3,
                                    lambda lvl=lvl: Noise(0, 3, g.n, sig, lvl))["final_rel_err"]
           for lvl in (0.0, 3.0, 10.0)]
    assert loc[0] < loc[1] < loc[2] and loc[2] > 3 * loc[0], loc


def test_noise_seed_streams_are_per_seed():
    g = games.quadratic(dim=3, kappa=10, mu=1.0, coupling=0.3, seed=0)
    one, _ = simulate(g, "decoupled", 5, [0.02], 20, seeds=1, noise=Noise(7, 1, g.n, np.ones(g.n), 0.0))
    three, _ = simulate(g, "decoupled", 5, [0.02], 20, seeds=3, noise=Noise(7, 3, g.n, np.ones(g.n), 0.0))
    # seed 0 of a 3-seed run is seed 0 alone (equal up to BLAS rounding of the batch shape)
    assert np.allclose(one[..., 0], three[..., 0], rtol=1e-12) and not np.allclose(three[..., 0], three[..., 1])


@pytest.mark.slow
def test_default_table():
    res, _ = api.run(RunConfig(), seed=0)
    assert len(res["results"]) == len(GAME_DEFAULTS["quadratic"]["coupling"]) * 10
    for r in res["ratio_vs_gda"]:
        if r["method"] == "decoupled" and r["K"] == 100 and r["coupling"] <= 1:
            assert r["ratio"] <= 1 / 20
    assert {g["stops_paying_off_at"] for g in res["regime"] if g["method"] == "decoupled"} == {30.0}


# ------------------------------------------------------------------ files


def _write(tmp_path, doc, name="g.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def test_file_game_matches_builtin(tmp_path):
    g = games.quadratic(3, 10, 1.0, 1.0, seed=0)
    path = _write(tmp_path, {"blocks": [3, 3], "J": g.J.tolist(), "h": g.h.tolist(), "names": ["u", "v"]})
    f = games.from_json(path)
    assert np.array_equal(f.J, g.J) and f.names == ("u", "v") and f.sym_pd
    res, _ = api.run(RunConfig(game=path, methods=("decoupled", "gda"), local_steps=(10,)), seed=0)
    ref, _ = api.run(RunConfig(coupling=(1.0,), dim=3, kappa=10.0, methods=("decoupled", "gda"),
                               local_steps=(10,)), seed=0)
    assert [r["rounds_to_eps"] for r in res["results"]] == [r["rounds_to_eps"] for r in ref["results"]]


def test_file_game_warns_when_not_monotone(tmp_path):
    path = _write(tmp_path, {"blocks": [1, 1], "J": [[-0.5, 1], [-1, 1]], "h": [1, 1]})
    res, _ = api.run(RunConfig(game=path, methods=("gda",), max_rounds=50), seed=0)
    assert res["warnings"] and "positive definite" in res["warnings"][0]


# ------------------------------------------------------------------ CLI


def test_cli_run(run_cli):
    _, doc = run_cli(["dsgda", "-q", "run", "--coupling", "0.1,1", "-K", "10", "--methods", "decoupled,gda,eg", "--kappa", "10",
                      "--threads", "1"])
    res = doc["result"]
    assert doc["command"] == "dsgda" and doc["reference"]["arxiv"] == "2501.14652"
    assert {r["method"] for r in res["results"]} == {"decoupled", "gda", "eg"}
    assert all(r["rounds_to_eps"] for r in res["results"])
    assert res["regime"][0]["method"] == "decoupled"


def test_cli_plot(run_cli, tmp_path):
    png = tmp_path / "r.png"
    _, doc = run_cli(["dsgda", "run", "-q", "--coupling", "0.1,1", "-K", "10", "--methods", "decoupled,gda",
                      "--plot", str(png)])
    assert png.read_bytes()[:4] == b"\x89PNG" and doc["artifacts"]["plot"] == str(png)
    noisy = tmp_path / "n.png"
    run_cli(["dsgda", "run", "-q", "--game", "noisy", "--sigma-off", "0,3", "--lr", "0.02", "--max-rounds", "60",
             "--seeds", "1", "--plot", str(noisy)])
    assert noisy.read_bytes()[:4] == b"\x89PNG"


def test_cli_solve_torch(run_cli, tmp_path):
    g = games.quadratic(3, 10, 1.0, 0.3, seed=0)
    path = _write(tmp_path, {"blocks": [3, 3], "J": g.J.tolist(), "h": g.h.tolist()})
    _, doc = run_cli(["dsgda", "solve", path, "-q", "--device", "cpu", "-K", "50", "--lr", "0.1"])
    res = doc["result"]
    assert res["rounds_to_eps"] and res["final_rel_residual"] <= 1e-6 and res["final_rel_err"] < 1e-5
    _, gda = run_cli(["dsgda", "solve", path, "-q", "--device", "cpu", "--method", "gda", "--lr", "0.1",
                      "--rounds", "5000"])
    assert gda["result"]["rounds_to_eps"] >= 10 * res["rounds_to_eps"]


def _bad_files(tmp_path):
    ok_J = [[2, 0.1], [-0.1, 2]]
    return {
        "notsquare.json": {"blocks": [1, 1], "J": [[1, 0, 0], [0, 1, 0]], "h": [0, 0]},
        "blocks.json": {"blocks": [1, 2], "J": ok_J, "h": [1, 1]},
        "singular.json": {"blocks": [1, 1], "J": [[1, 1], [1, 1]], "h": [1, 1]},
        "hlen.json": {"blocks": [1, 1], "J": ok_J, "h": [1, 1, 1]},
        "nan.json": '{"blocks": [1, 1], "J": [[NaN, 0], [0, 1]], "h": [1, 1]}',
        "inf.json": '{"blocks": [1, 1], "J": [[1, 0], [0, 1]], "h": [Infinity, 1]}',
        "broken.json": '{"blocks": [1, 1], "J": ',
        "oneplayer.json": {"blocks": [2], "J": ok_J, "h": [1, 1]},
    }


BAD_INPUTS = [
    (["run", "--game", "notsquare.json"], 2, "J must be square"),
    (["run", "--game", "blocks.json"], 2, "blocks sum to 3"),
    (["run", "--game", "singular.json"], 2, "singular"),
    (["run", "--game", "hlen.json"], 2, "h has length 3"),
    (["run", "--game", "nan.json"], 2, "non-finite"),
    (["run", "--game", "inf.json"], 2, "non-finite"),
    (["run", "--game", "broken.json"], 2, "not valid JSON"),
    (["run", "--game", "oneplayer.json"], 2, "at least 2 players"),
    (["run", "--game", "missing.json"], 2, "no such file"),
    (["run", "-K", "0"], 2, "--local-steps"),
    (["run", "-K", "2.5"], 2, "whole numbers"),
    (["run", "--eps", "1.5"], 2, "--eps"),
    (["run", "--eps", "0"], 2, "--eps"),
    (["run", "--coupling", "nan"], 2, "--coupling"),
    (["run", "--coupling", "-1"], 2, "--coupling: couplings must be >= 0"),
    (["run", "--kappa", "inf"], 2, "--kappa"),
    (["run", "--game", "blocks.json", "--coupling", "1"], 2, "--coupling: a FILE.json game"),
    (["run", "--game", "noisy", "--sigma-self", "1,2,3"], 2, "--sigma-self"),
    (["solve", "singular.json"], 2, "singular"),
    (["solve", "blocks.json", "-K", "0"], 2, "--local-steps"),
    (["solve", "notsquare.json"], 2, "J must be square"),
]


@pytest.mark.parametrize("argv,code,needle", BAD_INPUTS, ids=[" ".join(a) for a, _, _ in BAD_INPUTS])
def test_bad_inputs(argv, code, needle, tmp_path, monkeypatch, check_bad_input):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    for name, doc in _bad_files(tmp_path).items():
        _write(tmp_path, doc, name)
    monkeypatch.chdir(tmp_path)
    before = check_bad_input.snapshot(tmp_path)
    r = CliRunner().invoke(cli, ["dsgda", *argv])
    check_bad_input(r, code, needle, root=tmp_path, before=before)
