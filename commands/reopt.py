"""`icml reopt`: VP-OR-style reoptimization of modified MILPs on SCIP, with baselines, generators and a bench."""
from __future__ import annotations

import click

from . import common

METHODS = ("vpor", "scip", "warm", "reopt")
PROBLEMS = ("setcover", "cauction", "facility", "indset")
MODES = ("obj", "rhs", "bnd", "mat", "mixed")
SIZES = ("tiny", "small", "medium")

GROUP_EPILOG = """Examples:

\b
  icml reopt | jq '.result.overall.methods'
  icml reopt generate --problem setcover --mode rhs --size small --instances 8 --out series/
  icml reopt solve series/setcover_rhs_small_s0_007.mps.gz \\
      --history series/setcover_rhs_small_s0_005.mps.gz --history series/setcover_rhs_small_s0_006.mps.gz \\
      --method vpor --method scip --time-limit 10 | jq '.result.results[] | {method, objective, feasible}'
  icml reopt series series/setcover_rhs_small_s0.test --jsonl --first 4
  icml reopt bench --modes rhs,bnd,obj --seeds 3 --time-limit 5 | jq .result.overall.ratios
"""


def _csv(choices):
    def cb(ctx, param, value):
        if value is None:
            return None
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        bad = [v for v in items if v not in choices]
        if bad or not items:
            raise click.BadParameter(f"{','.join(bad) or value!r}: choose from {', '.join(choices)} (comma-separated)")
        return items
    return cb


def _positive(ctx, param, value):
    if value is not None and not value > 0:
        raise click.BadParameter(f"must be > 0 seconds, got {value}")
    return value


def solver_options(f):
    """Options shared by solve, series, bench and demo."""
    opts = [
        click.option("--fix-ratio", type=click.FloatRange(0, 1), default=0.7, help="Fraction P of eligible variables "
                     "fixed per VP-OR iteration (paper: 0.7)."),
        click.option("--submip-limit", type=float, default=None, callback=_positive,
                     help="Seconds per VP-OR sub-MIP [default: time limit / 5, at least 0.5]."),
        click.option("--groups", type=click.IntRange(min=1), default=10, help="Relaxation groups: on an infeasible "
                     "sub-MIP the fixings are released one group at a time (paper: 10)."),
        click.option("--prior-strength", type=click.FloatRange(min=0), default=10.0,
                     help="K in the Beta prior alpha = 1 + K p, beta = 1 + K (1 - p)."),
        click.option("--decay", type=click.FloatRange(0, 1, min_open=True), default=0.8,
                     help="Recency weight of history solutions (weight decay^age)."),
        click.option("--predictor", type=click.Choice(["marginal", "gnn"]), default="marginal",
                     help="Stage-1 predictor: history marginals, or a small bipartite GNN trained on the series."),
        click.option("--history-limit", type=float, default=None, callback=_positive,
                     help="Seconds for each plain-SCIP solve of a history instance [default: the time limit]. "
                          "Results are cached by file hash."),
        click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                     help="History cache [default: $ICML_REOPT_CACHE or $ICML_RUNS_DIR/_cache/reopt]."),
        click.option("--jobs", type=click.IntRange(min=1), default=1,
                     help="Parallel processes for independent solves (history, methods)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _cfg(time_limit, fix_ratio, submip_limit, groups, prior_strength, decay, predictor, seed, device, verbose,
         threads=1):
    from icmltools.reopt.solve import SolveConfig

    return SolveConfig(time_limit=time_limit, fix_ratio=fix_ratio, submip_limit=submip_limit, groups=groups,
                       prior_strength=prior_strength, decay=decay, predictor=predictor, seed=seed,
                       device=device, verbose=bool(verbose), threads=threads)


def _device(run, predictor):
    """The torch device matters only for the GNN predictor; SCIP runs on the CPU."""
    return run.device if predictor == "gnn" else "cpu"


@click.group("reopt", invoke_without_command=True, epilog=GROUP_EPILOG,
             context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or logs on stderr.")
@click.option("-v", "--verbose", count=True, help="More logs on stderr; -v also shows SCIP's own output.")
@click.pass_context
def cli(ctx, quiet, verbose):
    """VP-OR-style reoptimization of modified MILPs on SCIP (PySCIPOpt).

    Predicts a solution space for a new instance from solved history instances, fixes variables chosen by
    Thompson sampling, releases fixings group-wise when a sub-MIP is infeasible, and compares with plain
    SCIP, SCIP warm-started with the previous solution, and SCIP's own reoptimization under the same time
    limit. Without a subcommand it runs `demo`: a tiny generated series, every method, 20-60 s.
    """
    ctx.ensure_object(dict)
    if quiet:
        ctx.obj["quiet"] = True
    if verbose:
        ctx.obj["verbose"] = (ctx.obj.get("verbose") or 0) + verbose
    if ctx.invoked_subcommand is None:
        ctx.invoke(demo)


def _run(ctx, seed, device, threads):
    return common.CommandRun(ctx, "reopt", seed=seed, device=device, threads=threads,
                             packages=("numpy", "torch", "scipy", "pyscipopt"))


@cli.command("demo", epilog="Examples:\n\n\b\n  icml reopt demo | jq '.result.overall.methods'\n"
             "  icml reopt demo --time-limit 1")
@click.option("--time-limit", type=float, default=2.0, callback=_positive, help="Seconds per method and instance.")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per instance, then the envelope.")
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def demo(ctx, time_limit, jsonl, out, seed, device, threads, quiet, verbose):
    """Generate tiny set-cover series (rhs and obj changes) and run every method on them."""
    from icmltools.core.runs import make_run_dir
    from icmltools.reopt import api

    with _run(ctx, seed, device, threads) as run:
        d = make_run_dir("reopt", out)
        cfg = _cfg(time_limit, 0.7, None, 10, 10.0, 0.8, "marginal", seed, "cpu", run.verbose, threads)
        specs = api.bench_specs(["setcover"], ["rhs", "obj"], "tiny", 1, 5, 0.2, time_limit, seed0=seed)
        with run.timer.phase("bench"), run.progress() as cb:
            res = api.run_bench(specs, list(METHODS), cfg, d, first=2, cache_dir=d / "cache", jobs=1,
                                on_record=run.stream if jsonl else None, progress=cb)
        run.result = {"mode": "demo", "time_limit": time_limit, **res}
        run.artifacts["series_dir"] = str(d)


@cli.command("solve", epilog="""Examples:

\b
  icml reopt solve new.mps.gz --history day1.mps.gz --history day2.mps.gz --time-limit 10
  icml reopt solve new.mps --history h.mps --history-sol h.sol --method all --write-sol new.sol \\
      | jq '.result.results[] | {method, objective, primal_gap, feasible}'
""")
@click.argument("instance", type=click.Path(dir_okay=False))
@click.option("--history", "history", multiple=True, type=click.Path(dir_okay=False),
              help="A solved earlier instance of the series (repeat, oldest first); matched by variable name.")
@click.option("--history-sol", "history_sol", multiple=True, type=click.Path(dir_okay=False),
              help="Solution of the matching --history instance (SCIP .sol or JSON); without it the history is "
                   "solved with plain SCIP and cached.")
@click.option("--method", "method", multiple=True, type=click.Choice(METHODS + ("all",)), default=("vpor",),
              help="Method(s) to run; repeat or use 'all'.")
@click.option("--time-limit", type=float, default=10.0, callback=_positive, help="Seconds per method.")
@click.option("--reference", type=float, default=None, help="Best known objective, for primal gap and integral.")
@click.option("--write-sol", type=click.Path(dir_okay=False), default=None,
              help="Write the best returned solution (SCIP .sol format).")
@solver_options
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def solve(ctx, instance, history, history_sol, method, time_limit, reference, write_sol, fix_ratio, submip_limit,
          groups, prior_strength, decay, predictor, history_limit, cache_dir, jobs, seed, device, threads, quiet,
          verbose):
    """Solve one new INSTANCE (.mps, .mps.gz, .lp) using earlier instances of its series as history."""
    from icmltools.reopt import api
    from icmltools.reopt.history import default_cache_dir

    methods = list(METHODS) if "all" in method else list(dict.fromkeys(method))
    with _run(ctx, seed, device, threads) as run:
        cfg = _cfg(time_limit, fix_ratio, submip_limit, groups, prior_strength, decay, predictor, seed,
                   _device(run, predictor), run.verbose, threads)
        with run.timer.phase("solve"), run.progress() as cb:
            res = api.solve_instance(instance, history, history_sol, methods, cfg, history_limit=history_limit,
                                     cache_dir=cache_dir or default_cache_dir(), jobs=jobs, reference=reference,
                                     write_sol=write_sol, progress=cb)
        run.result = res
        if res.get("solution_written"):
            run.artifacts["solution"] = res["solution_written"]


@cli.command("series", epilog="""Examples:

\b
  icml reopt series rhs_series_1.test --time-limit 10 --first 10 --max-instances 20 --jsonl
  icml reopt series my.test --method vpor --method scip | jq .result.summary.ratios
""")
@click.argument("test_file", type=click.Path(dir_okay=False))
@click.option("--method", "method", multiple=True, type=click.Choice(METHODS + ("all",)), default=("all",),
              help="Method(s) to run; repeat or 'all' (reopt reports not_applicable unless only the objective changes).")
@click.option("--time-limit", type=float, default=None, callback=_positive,
              help="Seconds per method and instance [default: [TIMEOUT] of the .test file, else 10].")
@click.option("--first", type=click.IntRange(min=1), default=1, help="First instance solved (0-based); "
              "instance i uses instances 0..i-1 as history.")
@click.option("--max-instances", type=click.IntRange(min=2), default=None, help="Use only the first N instances.")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per instance, then the envelope with the summary.")
@solver_options
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def series(ctx, test_file, method, time_limit, first, max_instances, jsonl, fix_ratio, submip_limit, groups,
           prior_strength, decay, predictor, history_limit, cache_dir, jobs, seed, device, threads, quiet, verbose):
    """Run a MIPcc23-style series (`.test`: [TIMEOUT] t, then instance paths) with every method."""
    from icmltools.reopt import api
    from icmltools.reopt.history import default_cache_dir
    from icmltools.reopt.series import parse_test_file

    methods = list(METHODS) if "all" in method else list(dict.fromkeys(method))
    with _run(ctx, seed, device, threads) as run:
        spec = parse_test_file(test_file)
        tl = time_limit if time_limit is not None else (spec["timeout"] if spec["timeout"] is not None else 10.0)
        tl = api.check_time_limit(tl, "[TIMEOUT] / --time-limit")
        cfg = _cfg(tl, fix_ratio, submip_limit, groups, prior_strength, decay, predictor, seed,
                   _device(run, predictor), run.verbose, threads)
        with run.timer.phase("series"), run.progress() as cb:
            res = api.run_series(test_file, methods, cfg, first=first, max_instances=max_instances,
                                 history_limit=history_limit, cache_dir=cache_dir or default_cache_dir(), jobs=jobs,
                                 on_record=run.stream if jsonl else None, progress=cb)
        summary = api.summarize(res["records"], methods)
        if jsonl:
            res.pop("records")
        run.result = {"mode": "series", "time_limit": tl, **res, "summary": summary}


@cli.command("generate", epilog="""Examples:

\b
  icml reopt generate --problem setcover --mode rhs --size small --instances 10 --out sc_rhs/
  icml reopt generate --problem facility --mode mixed --seed 3 | jq -r .result.test_file
""")
@click.option("--problem", type=click.Choice(PROBLEMS), default="setcover", help="Instance family.")
@click.option("--mode", type=click.Choice(MODES), default="rhs", help="Which component varies between instances.")
@click.option("--size", type=click.Choice(SIZES), default="tiny", help="tiny (<< 1 s), small (bench), medium.")
@click.option("--instances", type=click.IntRange(min=2), default=10, help="Instances in the series.")
@click.option("--strength", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.2,
              help="Perturbation strength.")
@click.option("--timeout", type=float, default=10.0, callback=_positive, help="[TIMEOUT] written to the .test file.")
@click.option("--gzip/--no-gzip", "gz", default=True, help="Write .mps.gz (gzip in Python) or plain .mps.")
@common.out_option()
@common.standard_options(seed=True)
@click.pass_context
def generate(ctx, problem, mode, size, instances, strength, timeout, gz, out, seed, quiet, verbose):
    """Write an instance series offline: .mps(.gz) files, a .test file and manifest.json (sha256)."""
    from icmltools.core.runs import make_run_dir
    from icmltools.reopt import api

    with common.CommandRun(ctx, "reopt", seed=seed, seed_torch=False, packages=("numpy", "scipy", "pyscipopt")) as run:
        d = make_run_dir("reopt", out)
        with run.timer.phase("generate"):
            res = api.generate_series(api.SeriesSpec(problem, mode, size, instances, seed, strength, timeout, gz), d)
        run.result = {"mode": "generate", **res}
        run.artifacts.update(test_file=res["test_file"], manifest=res["manifest"], dir=str(d))


@cli.command("bench", epilog="""Examples:

\b
  icml reopt bench --modes rhs,bnd,obj --seeds 3 --time-limit 5 | jq .result.overall.ratios
  icml reopt bench --problems facility,cauction --modes rhs --jsonl --jobs 2
""")
@click.option("--problems", default="setcover", callback=_csv(PROBLEMS), help="Comma-separated families.")
@click.option("--modes", default="rhs,bnd,obj", callback=_csv(MODES), help="Comma-separated perturbation modes.")
@click.option("--size", type=click.Choice(SIZES), default="small", help="Size preset.")
@click.option("--seeds", type=click.IntRange(min=1), default=3, help="Series per (problem, mode).")
@click.option("--instances", type=click.IntRange(min=2), default=6, help="Instances per series.")
@click.option("--first", type=click.IntRange(min=1), default=3, help="Instances before this one are history only.")
@click.option("--strength", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.2,
              help="Perturbation strength.")
@click.option("--method", "method", multiple=True, type=click.Choice(METHODS + ("all",)), default=("all",),
              help="Methods (reopt runs on obj series only).")
@click.option("--time-limit", type=float, default=5.0, callback=_positive, help="Seconds per method and instance.")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per instance, then the envelope.")
@solver_options
@common.out_option()
@common.standard_options(seed=True, device=True, threads=True)
@click.pass_context
def bench(ctx, problems, modes, size, seeds, instances, first, strength, method, time_limit, jsonl, fix_ratio,
          submip_limit, groups, prior_strength, decay, predictor, history_limit, cache_dir, jobs, out, seed, device,
          threads, quiet, verbose):
    """Generate series and run all methods side by side: wins, median / geometric-mean primal gap,
    primal integral, time to first feasible, gap ratios against VP-OR."""
    from icmltools.core.errors import BadInputError
    from icmltools.core.runs import make_run_dir
    from icmltools.reopt import api

    if first >= instances:
        raise click.BadParameter(f"--first {first} must be smaller than --instances {instances}", param_hint="--first")
    methods = list(METHODS) if "all" in method else list(dict.fromkeys(method))
    with _run(ctx, seed, device, threads) as run:
        d = make_run_dir("reopt", out)
        cfg = _cfg(time_limit, fix_ratio, submip_limit, groups, prior_strength, decay, predictor, seed,
                   _device(run, predictor), run.verbose, threads)
        specs = api.bench_specs(problems, modes, size, seeds, instances, strength, time_limit, seed0=seed)
        if not specs:
            raise BadInputError("nothing to run")
        with run.timer.phase("bench"), run.progress() as cb:
            res = api.run_bench(specs, methods, cfg, d, first=first, history_limit=history_limit,
                                cache_dir=cache_dir or d / "cache", jobs=jobs,
                                on_record=run.stream if jsonl else None, progress=cb)
        run.result = {"mode": "bench", "time_limit": time_limit, **res}
        run.artifacts["series_dir"] = str(d)
