"""The entry point the command calls: `plan` (resolve and check everything, create nothing), then `execute` in a
run folder the caller provides. `start` does both for library callers (benchmarks), making the folder itself."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from icmltools.core.errors import BadInputError

from . import data as D
from .config import GoSkillConfig, config_from_dict, make_config, with_overrides
from .options import DEFAULT_METHODS, DEFAULT_PRESET, METHODS, STAGES
from .pipeline import MADE_BY, Run, check_kept_stages, checkpoints_read, preflight, read_state, run_pipeline
from .tasks import backend_for, quiet, resolve_tasks


@dataclass(frozen=True)
class Plan:
    """What a call will do: the resolved configuration, seed, stages and methods, and where the data lives."""

    cfg: GoSkillConfig
    seed: int
    stages: tuple[str, ...]
    methods: tuple[str, ...]
    data_dir: str | None = None
    tasks: tuple[str, ...] | None = None
    resume: bool = False
    run: Run | None = field(default=None, compare=False, repr=False)   # a resumed folder, checked by `plan`

    def config_dict(self) -> dict:
        return self.cfg.to_dict()


def _names(value, allowed, param: str) -> tuple[str, ...] | None:
    """A list of names (a tuple, or a comma-separated string; `all` = every name), checked against `allowed`."""
    if value is None:
        return None
    items = [v.strip().lower() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    if items == ["all"]:
        return tuple(allowed)
    bad = [v for v in items if v not in allowed]
    if bad:
        raise BadInputError(f"unknown value {bad[0]!r} (use {', '.join(allowed)} or all)", param=param)
    if not items:
        raise BadInputError("empty list", param=param)
    return tuple(dict.fromkeys(items))


def _stage_list(value) -> tuple[str, ...] | None:
    """Stages, in pipeline order: a list out of order is refused (it would run in another order than written)."""
    stages = _names(value, STAGES, "stages")
    for a, b in zip(stages or (), (stages or ())[1:]):
        if STAGES.index(b) < STAGES.index(a):
            raise BadInputError(f"{b!r} comes before {a!r}: list the stages in pipeline order "
                                f"({', '.join(STAGES)})", param="stages")
    return stages


def _resume_plan(run_dir, overrides: dict, stages, methods) -> Plan:
    st = read_state(Path(run_dir))
    old = config_from_dict(st["config"], st["path"])
    if "tasks" in overrides:
        have = st["tasks"] or resolve_tasks(old.tasks)
        if resolve_tasks(overrides["tasks"]) != list(have):
            raise BadInputError(f"a resumed run keeps its tasks ({', '.join(have)})", param="tasks",
                                hint="start a new run for other tasks")
    cfg = with_overrides(old, overrides)
    done = Run(Path(run_dir), old, st["seed"], st["data_dir"], st["tasks"]).stage_stats()
    if stages is None:   # what is left, and the evaluation (whatever runs now makes an earlier one stale)
        stages = tuple(s for s in STAGES if (s not in done or s == "evaluate")
                       and not (s == "collect" and st["data_dir"]))
    check_kept_stages(old, cfg, done, stages)
    run = Run(Path(run_dir), cfg, st["seed"], st["data_dir"], st["tasks"])
    with quiet():
        preflight(run, stages, methods)   # data, environments, checkpoints: before the folder is touched
    tasks = tuple(st["tasks"]) if st["tasks"] else None
    return Plan(cfg, st["seed"], stages, methods, st["data_dir"], tasks, resume=True, run=run)


def _new_plan(preset, data, overrides: dict, stages, methods, seed: int) -> Plan:
    cfg = make_config(preset, **overrides)
    tasks = None
    if stages is None:
        stages = tuple(s for s in STAGES if not (s == "collect" and data is not None))
    if data is not None and "collect" in stages:
        raise BadInputError("collect cannot run on a given dataset", param="stages")
    if data is None and "collect" not in stages:
        raise BadInputError("a new run without a dataset must include the collect stage", param="stages",
                            hint="or resume an existing run folder")
    for st, k in checkpoints_read(stages, methods)[:1]:
        raise BadInputError(f"the {st} stage needs the {k} checkpoint, which a new run makes in the {MADE_BY[k]} "
                            "stage", param="stages", hint=f"add {MADE_BY[k]} to the stages")
    if data is not None:   # read and check everything before anything is created
        task_filter = resolve_tasks(cfg.tasks) if "tasks" in overrides else None
        tasks, eps = D.load_dataset_dir(data, task_filter)
        if "evaluate" in stages:
            backend_for(tasks, obs_dim=eps[0][0]["observations"].shape[1], act_dim=eps[0][0]["actions"].shape[1])
        data = str(Path(data).resolve())
    else:
        resolve_tasks(cfg.tasks)
    return Plan(cfg, int(seed), stages, methods, data, tuple(tasks) if tasks else None)


def plan(*, preset: str = DEFAULT_PRESET, run_dir=None, data=None, stages=None, methods=None, seed: int = 0,
         overrides: dict | None = None) -> Plan:
    """Resolve a call without creating anything. A new run does every stage by default (without collect when
    `data` is a user dataset); resuming `run_dir` continues with the stages it has not done yet, with the
    folder's configuration and seed (`overrides` change sizes, `preset` and `seed` are the folder's)."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    stage_list = _stage_list(stages)
    method_list = _names(methods, METHODS, "methods") or DEFAULT_METHODS
    if run_dir is not None:
        if data is not None:
            raise BadInputError("a resumed run keeps its own data; do not give a dataset", param="data")
        return _resume_plan(run_dir, overrides, stage_list, method_list)
    return _new_plan(preset, data, overrides, stage_list, method_list, seed)


def execute(p: Plan, root, *, device="cpu", progress=None, timer=None, eval_episodes: int | None = None) -> dict:
    """Run the plan's stages in the run folder `root` (made by the caller); returns the summary."""
    if p.resume:
        run = p.run if p.run is not None and p.run.root == Path(root) else \
            Run(Path(root), p.cfg, p.seed, p.data_dir, list(p.tasks) if p.tasks else None)
        run.save_state()
    else:
        run = Run.create(Path(root), p.cfg, p.seed, data_dir=p.data_dir, tasks=list(p.tasks) if p.tasks else None)
    try:
        with quiet():
            summary = run_pipeline(run, p.stages, device, p.methods, progress, timer, eval_episodes)
    except BaseException:   # a failure or Ctrl-C: a new folder is kept only if a stage finished in it
        if not p.resume:
            run.discard_if_nothing_done()
        raise
    summary["stages_run"] = [s for s in STAGES if s in p.stages]
    return summary


def start(*, out=None, run_dir=None, device="cpu", progress=None, timer=None, eval_episodes: int | None = None,
          **kw) -> dict:
    """`plan` + a run folder (`run_dir` to resume, else `out` or runs/goskill/<stamp>) + `execute`, for library
    callers. The command makes the folder through its CommandRun instead (it owns config.json/result.json)."""
    from icmltools.core.runs import make_run_dir

    if out is not None and run_dir is not None:
        raise BadInputError("a resumed run stays in its folder; do not give another one", param="out")
    p = plan(run_dir=run_dir, **kw)
    root = Path(run_dir) if run_dir is not None else make_run_dir("goskill", out)
    return execute(p, root, device=device, progress=progress, timer=timer, eval_episodes=eval_episodes)
