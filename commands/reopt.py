"""`icml reopt`: VP-OR-style reoptimization of modified MILPs on SCIP, with baselines, generators and a bench."""
from __future__ import annotations

import contextlib

import click

from icmltools.reopt import options
from icmltools.reopt.options import BenchConfig, SeriesSpec, SolveConfig

from . import common

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

SECONDS = click.FloatRange(min=0, min_open=True)
# library parameter -> flag where the names differ
PARAM_FLAGS = {"methods": "--method", "n_instances": "--instances", "history_limit": "--history-time-limit",
               "limit_kind": "--limit-kind", "history_kind": "--history-limit-kind"}


def solver_options(f):
    """Options shared by solve, series and bench (SolveConfig's fields, plus the history solves), then
    -q/-v, --seed, --device, --threads; passes the context."""
    opts = [
        click.option("--fix-ratio", type=click.FloatRange(0, 1), default=SolveConfig.fix_ratio,
                     help="Fraction P of eligible variables fixed per VP-OR iteration (paper: 0.7)."),
        click.option("--submip-limit", type=SECONDS, default=SolveConfig.submip_limit,
                     help="Seconds per VP-OR sub-MIP [default: time limit / 5, at least 0.5]."),
        click.option("--groups", type=click.IntRange(min=1), default=SolveConfig.groups, help="Relaxation groups: "
                     "on an infeasible sub-MIP the fixings are released one group at a time (paper: 10)."),
        click.option("--prior-strength", type=click.FloatRange(min=0), default=SolveConfig.prior_strength,
                     help="K in the Beta prior alpha = 1 + K p, beta = 1 + K (1 - p)."),
        click.option("--decay", type=click.FloatRange(0, 1, min_open=True), default=SolveConfig.decay,
                     help="Recency weight of history solutions (weight decay^age)."),
        click.option("--predictor", type=click.Choice(options.PREDICTORS), default=SolveConfig.predictor,
                     help="Stage-1 predictor: history marginals, or a small bipartite GNN trained on the series."),
        click.option("--limit-kind", type=click.Choice(options.LIMIT_KINDS), default=SolveConfig.limit_kind,
                     help="What a method's limit counts: wall seconds (--time-limit), or reproducible bit for bit: "
                          "SCIP's deterministic time, B&B nodes or LP iterations (--budget; --time-limit is then "
                          "a wall-clock cap)."),
        click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Each method's budget in --limit-kind's unit (VP-OR: summed over its sub-MIPs)."),
        click.option("--history-time-limit", "--history-limit", "history_limit", type=SECONDS, default=None,
                     help="Seconds for each plain-SCIP solve of a history instance [default: the time limit]. "
                          "Every outcome is cached by file hash and limit when the command ends (not on Ctrl-C)."),
        click.option("--history-limit-kind", "history_kind", type=click.Choice(options.LIMIT_KINDS), default=None,
                     help="What each history solve's limit counts [default: --limit-kind]."),
        click.option("--history-budget", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Budget of each history solve with a deterministic kind [default: --budget when the kinds "
                          "agree]."),
        click.option("--full-share", type=click.FloatRange(0, 1), default=SolveConfig.full_share,
                     help="VP-OR: share of the limit kept for the full model, started from the incumbent (ours)."),
        click.option("--widen/--no-widen", default=SolveConfig.widen,
                     help="VP-OR: a sub-MIP that ends early or stalls halves the fix ratio, down to the full "
                          "model started from the incumbent (ours; --no-widen: keep the ratio)."),
        click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                     help="History cache [default: $ICML_REOPT_CACHE or $ICML_RUNS_DIR/_cache/reopt; bench and "
                          "demo: the run folder]."),
        click.option("--jobs", type=click.IntRange(min=1), default=1,
                     help="Parallel processes for independent solves (history, methods)."),
    ]
    f = click.pass_context(f)
    f = common.standard_options(seed=True, device=True, threads=True)(f)
    for o in reversed(opts):
        f = o(f)
    return f


def method_option(default: tuple, help_text: str):
    return click.option("--method", "method", multiple=True, type=click.Choice(options.METHODS + ("all",)),
                        default=default, help=help_text)


@contextlib.contextmanager
def _running(ctx, phase: str, seed, device=None, threads=None, packages=None, **kw):
    """The command's run (`CommandRun`) inside its timed phase: yields (run, progress callback). History
    solves are cached when the command ends, not on Ctrl-C (`history.cache_held`)."""
    from icmltools.reopt.history import cache_held

    packages = packages or _packages(ctx)
    kw.setdefault("seed_torch", "torch" in packages)
    with common.CommandRun(ctx, "reopt", seed=seed, device=device, threads=threads, packages=packages,
                           reference=options.REFERENCE, param_flags=PARAM_FLAGS, **kw) as run:
        with run.timer.phase(phase), run.progress() as cb, cache_held(common.ctrl_c_seen):
            yield run, cb


def _solver(ctx, run) -> SolveConfig:
    """SolveConfig from this command's options (same names), the run's seed, device and verbosity."""
    return SolveConfig.from_params(ctx.params, seed=run.seed, device=run.device, verbose=bool(run.verbose))


NOTICE_S = 60  # history solves that may take this long in all are announced on stderr


def _history_kwargs(ctx, run, progress) -> dict:
    """How history instances are solved (limit, cache, processes), from `solver_options`; the run says on
    stderr how many history solves will run and how long they may take."""
    def notice(n: int, limit, seconds: float) -> None:
        if seconds < NOTICE_S:
            return
        run.log(f"solving {n} history instance(s) with plain SCIP, {limit.describe()} each: up to "
                f"{_duration(seconds)} in all (cached when the command ends; --history-time-limit shortens it)")

    return {"history_limit": ctx.params["history_limit"], "history_budget": ctx.params["history_budget"],
            "history_kind": ctx.params["history_kind"],
            "cache_dir": ctx.params["cache_dir"], "jobs": ctx.params["jobs"], "progress": progress,
            "notice": notice}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def _packages(ctx) -> tuple:
    """torch is imported (and its version recorded) only for the GNN predictor."""
    gnn = ctx.params.get("predictor") == "gnn"
    return ("numpy", "scipy", "pyscipopt") + (("torch",) if gnn else ())


def demo_options(f):
    """The demo's options: on `demo` and on the bare group (`icml reopt --seed 3 --budget 1000`)."""
    f = click.option("--limit-kind", type=click.Choice(options.LIMIT_KINDS), default=options.DEMO_LIMIT_KIND,
                     help="What each method's limit counts (the demo's default is reproducible bit for bit).")(f)
    f = click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=options.DEMO_BUDGET,
                     help="Each method's budget in --limit-kind's unit (ignored with --limit-kind wall).")(f)
    f = click.option("--time-limit", type=SECONDS, default=options.DEMO.time_limit,
                     help="Seconds per method and instance: the limit with --limit-kind wall, else a wall-clock "
                          "cap.")(f)
    f = click.option("--jsonl", is_flag=True, help="Stream one JSON line per instance, then the envelope.")(f)
    f = common.out_option()(f)
    return common.standard_options(seed=True, device=True, threads=True)(f)


def _summary_table(run, title: str, summary: dict) -> None:
    """The summary a person reads at a terminal (stderr; the JSON on stdout is unchanged)."""
    rows = []
    for m, d in summary["methods"].items():
        if not d.get("n"):
            continue
        gap = d.get("median_gap")
        rows.append([options.METHOD_LABELS.get(m, m), d["n"], d["wins"],
                     None if gap is None else f"{100 * gap:.2f} %",
                     None if d.get("geomean_gap") is None else f"{100 * d['geomean_gap']:.3f} %",
                     d.get("mean_primal_integral"), d["no_solution"], d["fallback"]])
    run.table(title + (f"; no method found a solution on {summary['no_solution_instances']}"
                       if summary.get("no_solution_instances") else ""),
              ["method", "instances", "wins", "median gap", "geo-mean gap", "primal integral", "no solution",
               "fallback"], rows)


DEMO_PARAMS = ("limit_kind", "budget", "time_limit", "jsonl", "out", "seed", "device", "threads")


@common.group("reopt", invoke_without_command=True, epilog=GROUP_EPILOG)
@demo_options
@click.pass_context
def cli(ctx, quiet, verbose, **demo_params):
    """VP-OR-style reoptimization of modified MILPs on SCIP (PySCIPOpt).

    Predicts a solution space for a new instance from solved history instances, fixes variables chosen by
    Thompson sampling, releases fixings group-wise when a sub-MIP is infeasible, and compares with plain
    SCIP, SCIP warm-started with the previous solution, and SCIP's own reoptimization under the same time
    limit. Without a subcommand it runs `demo` (its options work here too: `icml reopt --seed 3`).
    """
    flags = ctx.ensure_object(dict)  # shared with the root group: subcommands merge these with their own
    flags.update(quiet=bool(flags.get("quiet")) or quiet, verbose=(flags.get("verbose") or 0) + verbose)
    if ctx.invoked_subcommand is None:
        ctx.invoke(demo, **demo_params)
        return
    given = [p.opts[0] for p in ctx.command.params if p.name in DEMO_PARAMS
             and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        sub, one = ctx.invoked_subcommand, len(given) == 1
        raise click.UsageError(f"{', '.join(given)} before '{sub}' {'is a demo option' if one else 'are demo options'}"
                               f"; put {'it' if one else 'them'} after '{sub}'")


@common.command("demo", param_flags=PARAM_FLAGS,
                epilog="Examples:\n\n\b\n  icml reopt demo | jq '.result.overall.methods'\n"
                       "  icml reopt demo --limit-kind wall --time-limit 3")
@demo_options
@click.pass_context
def demo(ctx, limit_kind, budget, time_limit, jsonl, out, seed, device, threads, quiet=False, verbose=0):
    """A small facility-location series whose demands change: plain SCIP does not finish within the budget,
    VP-OR-style reoptimization does better (every method, a table at a terminal; about 30 s)."""
    from icmltools.reopt import api

    with _running(ctx, "bench", seed, device, threads) as (run, cb):
        cfg = api.demo_solver(SolveConfig(seed=run.seed, verbose=bool(run.verbose), time_limit=time_limit),
                              limit_kind, budget)
        d = run.make_dir(out, config=api.resolved(cfg, api.demo_config(time_limit)))
        run.result = api.demo(time_limit, cfg, d, on_record=run.stream if jsonl else None, progress=cb)
        run.artifacts["series_dir"] = str(d)
        _summary_table(run, _bench_title("demo", run.result), run.result["overall"])


def _bench_title(what: str, res: dict) -> str:
    limit = f"{res['budget']:g} {res['limit_kind']}" if res["limit_kind"] != "wall" else f"{res['time_limit']:g} s"
    return f"{what}: {res['n_instances']} new instance(s), {limit} per method"


@common.command("solve", param_flags=PARAM_FLAGS, epilog="""Examples:

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
@method_option(options.DEFAULT_SOLVE_METHODS, "Method(s) to run; repeat or use 'all'.")
@click.option("--time-limit", type=SECONDS, default=SolveConfig.time_limit, help="Seconds per method.")
@click.option("--reference", type=float, default=None, help="Best known objective, for primal gap and integral.")
@click.option("--write-sol", type=click.Path(dir_okay=False), default=None,
              help="Write the best returned solution (SCIP .sol format).")
@solver_options
def solve(ctx, instance, history, history_sol, method, reference, write_sol, seed, device, threads, **_):
    """Solve one new INSTANCE (.mps, .mps.gz, .lp) using earlier instances of its series as history."""
    from icmltools.reopt import api

    with _running(ctx, "solve", seed, device, threads) as (run, cb):
        run.result = api.solve_instance(instance, history, history_sol, method, _solver(ctx, run),
                                        reference=reference, write_sol=write_sol, **_history_kwargs(ctx, run, cb))
        if run.result.get("solution_written"):
            run.artifacts["solution"] = run.result["solution_written"]


@common.command("series", param_flags=PARAM_FLAGS, epilog="""Examples:

\b
  icml reopt series rhs_series_1.test --time-limit 10 --first 10 --max-instances 20 --jsonl
  icml reopt series my.test --method vpor --method scip | jq .result.summary.ratios
""")
@click.argument("test_file", type=click.Path(dir_okay=False))
@method_option(("all",), "Method(s) to run; repeat or 'all' (reopt reports not_applicable unless only the "
               "objective changes).")
@click.option("--time-limit", type=SECONDS, default=None,
              help="Seconds per method and instance [default: [TIMEOUT] of the .test file, else 10].")
@click.option("--first", type=click.IntRange(min=1), default=options.FIRST, help="First instance solved "
              "(0-based); instance i uses instances 0..i-1 as history.")
@click.option("--max-instances", type=click.IntRange(min=2), default=None, help="Use only the first N instances.")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per instance, then the envelope with the summary.")
@click.option("--write-sol", type=click.Path(file_okay=False), default=None,
              help="Folder for every method's solution of every instance (<instance>.<method>.sol), written "
                   "together at the end (or none).")
@solver_options
def series(ctx, test_file, method, time_limit, first, max_instances, jsonl, write_sol, seed, device, threads, **_):
    """Run a MIPcc23-style series (`.test`: [TIMEOUT] t, then instance paths) with every method."""
    from icmltools.reopt import api

    with _running(ctx, "series", seed, device, threads) as (run, cb):
        run.result = api.series(test_file, method, _solver(ctx, run), time_limit=time_limit, first=first,
                                max_instances=max_instances, keep_records=not jsonl, write_sol=write_sol,
                                on_record=run.stream if jsonl else None, **_history_kwargs(ctx, run, cb))
        if write_sol is not None:
            run.artifacts["solution_dir"] = str(write_sol)
        _summary_table(run, f"{test_file}: {run.result['summary']['instances']} instance(s)", run.result["summary"])


@common.command("generate", param_flags=PARAM_FLAGS, epilog="""Examples:

\b
  icml reopt generate --problem setcover --mode rhs --size small --instances 10 --out sc_rhs/
  icml reopt generate --problem facility --mode mixed --seed 3 | jq -r .result.test_file
""")
@click.option("--problem", type=click.Choice(options.PROBLEMS), default=SeriesSpec.problem, help="Instance family.")
@click.option("--mode", type=click.Choice(options.MODES), default=SeriesSpec.mode,
              help="Which component varies between instances.")
@click.option("--size", type=click.Choice(options.SIZES), default=SeriesSpec.size,
              help="tiny (<< 1 s), small (bench), medium.")
@click.option("--instances", type=click.IntRange(min=2), default=SeriesSpec.n_instances, help="Instances in the series.")
@click.option("--strength", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=SeriesSpec.strength,
              help="Perturbation strength.")
@click.option("--timeout", type=SECONDS, default=SeriesSpec.timeout, help="[TIMEOUT] written to the .test file.")
@click.option("--gzip/--no-gzip", "gz", default=SeriesSpec.gzip, help="Write .mps.gz (gzip in Python) or plain .mps.")
@common.out_option()
@common.standard_options(seed=True)
@click.pass_context
def generate(ctx, problem, mode, size, instances, strength, timeout, gz, out, seed, quiet, verbose):
    """Write an instance series offline: .mps(.gz) files, a .test file and manifest.json (sha256)."""
    from icmltools.reopt import api

    spec = SeriesSpec(problem, mode, size, instances, seed, strength, timeout, gz)
    with _running(ctx, "generate", seed) as (run, _cb):
        d = run.make_dir(out, config=api.resolved(spec))
        run.result = api.generate(spec, d)
        run.artifacts.update(test_file=run.result["test_file"], manifest=run.result["manifest"], dir=str(d))


@common.command("bench", param_flags=PARAM_FLAGS, epilog="""Examples:

\b
  icml reopt bench --modes rhs,bnd,obj --seeds 3 --time-limit 5 | jq .result.overall.ratios
  icml reopt bench --problems facility,cauction --modes rhs --jsonl --jobs 2
""")
@click.option("--problems", type=common.CommaList(options.PROBLEMS, allow_all=True),
              default=",".join(BenchConfig.problems), help="Comma-separated families.")
@click.option("--modes", type=common.CommaList(options.MODES, allow_all=True), default=",".join(BenchConfig.modes),
              help="Comma-separated perturbation modes.")
@click.option("--size", type=click.Choice(options.SIZES), default=BenchConfig.size, help="Size preset.")
@click.option("--seeds", type=click.IntRange(min=1), default=BenchConfig.seeds, help="Series per (problem, mode).")
@click.option("--instances", type=click.IntRange(min=2), default=BenchConfig.instances, help="Instances per series.")
@click.option("--first", type=click.IntRange(min=1), default=BenchConfig.first,
              help="Instances before this one are history only.")
@click.option("--strength", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=BenchConfig.strength,
              help="Perturbation strength.")
@method_option(("all",), "Methods (reopt runs on obj series only).")
@click.option("--time-limit", type=SECONDS, default=BenchConfig.time_limit, help="Seconds per method and instance.")
@click.option("--jsonl", is_flag=True, help="Stream one JSON line per instance, then the envelope.")
@common.out_option()
@solver_options
def bench(ctx, problems, modes, size, seeds, instances, first, strength, method, time_limit, jsonl, out, seed,
          device, threads, **_):
    """Generate series and run all methods side by side: wins, median / geometric-mean primal gap,
    primal integral, time to first feasible, gap ratios against VP-OR."""
    from icmltools.reopt import api

    bench_cfg = BenchConfig(problems, modes, size, seeds, instances, first, strength, time_limit)
    with _running(ctx, "bench", seed, device, threads) as (run, cb):
        bench_cfg.validate()
        cfg = _solver(ctx, run)
        d = run.make_dir(out, config=api.resolved(cfg, bench_cfg))
        run.result = api.bench(bench_cfg, method, cfg, d, on_record=run.stream if jsonl else None,
                               **_history_kwargs(ctx, run, cb))
        run.artifacts["series_dir"] = str(d)
        for group, summary in run.result["by_series_group"].items():
            _summary_table(run, f"{group}: {summary['instances']} new instance(s)", summary)


for _sub in (demo, solve, series, generate, bench):
    cli.add_command(_sub)
