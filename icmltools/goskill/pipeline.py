"""The run folder and the stages: collect -> extract -> enhance -> policy -> baselines -> evaluate.

Layout of a run folder (the command writes config.json and result.json; everything else is written here):
    pipeline.json               resume state: configuration (preset + overrides), seed, where the data lives
    data/<task>/<i>.npz         collected episodes (absent when the run reads a user dataset)
    dataset.json                collection summary
    checkpoints/*.safetensors   skill.safetensors (phase 1), skill_enhanced, high_level, mtbc, mtbc_rtg
    stages.json                 per-stage statistics (losses, code usage, times)
    evaluation.json             per-method evaluation, per task
Each stage reads what it needs from the folder, so stages can run one by one or chained. Every stage draws
its randomness from `derive(seed, "<stage>", ...)` (module weights included), so a stage run alone gives
the numbers it gives inside the chain.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from icmltools.core.checkpoint import load_safetensors, save_safetensors
from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import atomic_write_json
from icmltools.core.seed import derive

from . import data as D
from . import train as TR
from .collect import collect
from .config import GoSkillConfig, config_from_dict, with_overrides
from .evaluate import BCAgent, GoSkillAgent, build_envs, evaluate
from .models import BCPolicy, HighLevelPolicy, SkillModel
from .options import BASELINES, DEFAULT_METHODS, METHODS, STAGES
from .tasks import backend_for, resolve_tasks

log = logging.getLogger(__name__)

STATE = "pipeline.json"
LEGACY_STATE = "config.json"   # run folders written before pipeline.json kept their state here
PARTIAL_DATA = ".data.partial"   # collection in progress; renamed to data/ when complete
CKPT = {"skill": "skill.safetensors", "skill_enhanced": "skill_enhanced.safetensors",
        "high_level": "high_level.safetensors", "mtbc": "mtbc.safetensors", "mtbc_rtg": "mtbc_rtg.safetensors"}


def read_state(root: Path) -> dict:
    """The resume state of a run folder: pipeline.json, or config.json in folders from before pipeline.json."""
    root = Path(root)
    if not root.is_dir():
        raise BadInputError(f"{root}: not a directory", param="run_dir")
    p = root / STATE
    if p.exists():
        return _parse_state(_read_json(p, "goskill state"), p)
    legacy = root / LEGACY_STATE
    if legacy.exists():
        doc = _read_json(legacy, "goskill state")
        if isinstance(doc, dict) and "command" in doc:   # the command's own config.json, not a resume state
            if doc["command"] != "goskill":
                raise BadInputError(f"{root}: a run folder of `{doc['command']}`, not of goskill", param="run_dir")
            raise BadInputError(f"{root}: {STATE} (the resume state) is missing; this folder cannot be resumed",
                                param="run_dir", hint="start a new run")
        return _parse_state(doc, legacy)
    what = "empty" if not any(root.iterdir()) else "not a goskill run folder"
    raise BadInputError(f"{root}: no {STATE} ({what})", param="run_dir",
                        hint="start a new run first (it makes the folder), then resume it")


def _read_json(p: Path, what: str):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise BadInputError(f"{p}: unreadable {what} ({str(e).splitlines()[0][:200]})", param="run_dir") from None


def _parse_state(doc, p: Path) -> dict:
    """Check the fields of a resume state (types only; the configuration is checked by config_from_dict)."""
    def bad(what):
        return BadInputError(f"{p}: unreadable goskill state ({what})", param="run_dir")

    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise bad("no 'config' object")
    seed = doc.get("seed") or 0
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise bad(f"seed {seed!r} is not an integer >= 0")
    data_dir, tasks = doc.get("data_dir"), doc.get("tasks")
    if data_dir is not None and not isinstance(data_dir, str):
        raise bad(f"data_dir {data_dir!r} is not a path")
    if tasks is not None and (not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks)):
        raise bad(f"tasks {tasks!r} is not a list of task names")
    return {"config": dict(doc["config"]), "seed": seed, "data_dir": data_dir, "tasks": tasks, "path": str(p)}


class Run:
    """A run folder plus its configuration, lazily loaded data and checkpoints."""

    def __init__(self, root: Path, cfg: GoSkillConfig, seed: int, data_dir: str | None, tasks: list[str] | None):
        self.root, self.cfg, self.seed = Path(root), cfg, int(seed)
        self.data_dir = data_dir      # None: <root>/data (collected)
        self.tasks = tasks
        self._fd = None

    # ---- state
    @classmethod
    def create(cls, root, cfg, seed, data_dir=None, tasks=None) -> "Run":
        run = cls(root, cfg, seed, str(Path(data_dir).resolve()) if data_dir else None, tasks)
        run.save_state()
        return run

    @classmethod
    def open(cls, root, overrides: dict | None = None) -> "Run":
        st = read_state(root)
        run = cls(root, with_overrides(config_from_dict(st["config"], st["path"]), overrides or {}), st["seed"],
                  st["data_dir"], st["tasks"])
        if overrides or st["path"].endswith(LEGACY_STATE):
            run.save_state()
        return run

    def save_state(self):
        atomic_write_json(self.root / STATE, {"config": self.cfg.to_dict(), "seed": self.seed,
                                              "data_dir": self.data_dir, "tasks": self.tasks})

    def discard_if_nothing_done(self) -> None:
        """Remove what this run wrote in its folder when no stage finished (a new run that failed or was
        interrupted in its first stage): the folder holds nothing to resume from."""
        with contextlib.suppress(BadInputError):
            if self.stage_stats():
                return
        for name in (STATE, "stages.json", "dataset.json", "evaluation.json"):
            (self.root / name).unlink(missing_ok=True)
        for name in ("data", PARTIAL_DATA, "checkpoints"):
            shutil.rmtree(self.root / name, ignore_errors=True)

    def path(self, key: str) -> Path:
        return self.root / "checkpoints" / CKPT[key]

    def stage_stats(self) -> dict:
        """The finished stages and their statistics (stages.json)."""
        p = self.root / "stages.json"
        if not p.exists():
            return {}
        d = _read_json(p, "stage record")
        if not isinstance(d, dict) or not set(d) <= set(STAGES):
            raise BadInputError(f"{p}: unreadable stage record (expected an object keyed by stage name)",
                                param="run_dir")
        return d

    def record(self, stage: str, stats: dict):
        d = self.stage_stats()
        d[stage] = stats
        atomic_write_json(self.root / "stages.json", d)

    # ---- data
    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir else self.root / "data"

    def flat(self) -> D.FlatData:
        if self._fd is None:
            if not self.data_path.is_dir() and self.data_dir:
                raise BadInputError(f"{self.data_path}: the dataset this run was started on is gone",
                                    hint="the run reads it in place: put it back there")
            if not self.data_path.is_dir():
                raise BadInputError(f"{self.data_path}: no dataset in this run folder",
                                    hint="run the collect stage first (or give a dataset)")
            try:
                tasks, eps = D.load_dataset_dir(self.data_path, self.tasks)
            except BadInputError as e:   # the folder's dataset: no option to name
                raise BadInputError(e.message, hint=e.hint) from None
            self.tasks = tasks
            eps = D.split_episodes(eps, self.cfg.split)
            if self.cfg.H > min(len(e["rewards"]) for es in eps for e in es):
                log.warning("some episodes are shorter than H=%d; their goals are clipped at the end", self.cfg.H)
            self._fd = D.flatten(tasks, eps)
        return self._fd

    def backend(self):
        fd = self.flat()
        return backend_for(fd.tasks, obs_dim=fd.obs.shape[1], act_dim=fd.actions.shape[1])

    # ---- models: weights drawn from derive(seed, stage, ..., "init"), the caller's torch state untouched
    def _build(self, factory, *keys):
        with derive(self.seed, *keys, "init").torch_init():
            return factory()

    def dims(self):
        fd = self.flat()
        return fd.obs.shape[1], fd.actions.shape[1], len(fd.tasks)

    def new_skill(self, stage: str = "extract") -> SkillModel:
        ds, da, _ = self.dims()
        return self._build(lambda: SkillModel(ds, da, self.cfg), stage)

    def new_high_level(self, stage: str = "policy") -> HighLevelPolicy:
        ds, _, nt = self.dims()
        cfg = self.cfg
        return self._build(lambda: HighLevelPolicy(ds, cfg.vq_dim, cfg.n_codes, cfg, nt, cfg.max_ep_len), stage)

    def new_bc(self, rtg: bool, stage: str = "baselines") -> BCPolicy:
        ds, da, nt = self.dims()
        return self._build(lambda: BCPolicy(ds, da, nt, self.cfg.bc_hidden, rtg=rtg), stage,
                           "mtbc_rtg" if rtg else "mtbc")

    def load(self, key: str, model: torch.nn.Module, device, stage_hint: str) -> torch.nn.Module:
        p = self.path(key)
        if not p.exists():
            raise BadInputError(f"{p}: missing checkpoint", hint=f"run the {stage_hint} stage first")
        sd = _checked_tensors(p)
        try:
            model.load_state_dict(sd)
        except RuntimeError as e:
            raise BadInputError(f"{p}: does not match the configuration ({str(e).splitlines()[0]})") from None
        return model.to(device)

    def save(self, key: str, model: torch.nn.Module):
        self.path(key).parent.mkdir(parents=True, exist_ok=True)
        save_safetensors({k: v.detach().cpu() for k, v in model.state_dict().items()}, self.path(key))


def _checked_tensors(p: Path) -> dict:
    """The tensors of checkpoint `p`; a corrupt file or a non-finite weight is one error naming the file."""
    sd = load_safetensors(p)
    for k, v in sd.items():
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise BadInputError(f"{p}: tensor {k!r} has non-finite values")
    return sd


# --------------------------------------------------------------------------------------------- stages


def stage_collect(run: Run, progress=None) -> dict:
    """Scripted experts behind the quality ramp (collect.py), into <root>/data. Episodes go to a temporary
    folder first: <root>/data appears complete or not at all (Ctrl-C, a failure)."""
    if run.data_dir:
        raise BadInputError("this run reads a user dataset; nothing to collect", param="stages")
    cfg = run.cfg
    tasks = resolve_tasks(cfg.tasks)
    tmp, final = run.root / PARTIAL_DATA, run.root / "data"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        summary = collect(tasks, tmp, episodes=cfg.episodes, max_steps=cfg.max_steps, seed=run.seed,
                          workers=cfg.workers, progress=progress)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    run.tasks = tasks
    run.save_state()
    atomic_write_json(run.root / "dataset.json", summary)
    run._fd = None
    return summary


def _code_stats(codes: np.ndarray, n_codes: int) -> dict:
    counts = np.bincount(codes, minlength=n_codes)
    return {"code_usage": counts.tolist(), "codes_used": int((counts > 0).sum())}


def stage_extract(run: Run, device, progress=None) -> dict:
    """Phase 1: goal encoder + VQ codebook + skill decoder (Sec. 4.1) -> checkpoints/skill."""
    fd, cfg = run.flat(), run.cfg
    model = run.new_skill("extract")
    stats = TR.extract_skills(model, fd, cfg, run.seed, device, progress)
    codes = TR.relabel(model, fd, cfg.H, device)
    stats.update(_code_stats(codes, cfg.n_codes))
    stats["action_mse"] = TR.action_mse(model, fd, codes, cfg.H, device, seed=run.seed)["mse"]
    run.save("skill", model)
    return stats


def _phase1_skill(run: Run, device, stage: str):
    """The phase-1 skill model and every timestep's code (codes depend on the encoder and codebook only)."""
    model = run.load("skill", run.new_skill(stage), device, "extract")
    return model, TR.relabel(model, run.flat(), run.cfg.H, device)


def stage_enhance(run: Run, device, progress=None) -> dict:
    """Skill enhancement: decoder-only, class-balanced (Sec. 4.2) -> checkpoints/skill_enhanced."""
    fd, cfg = run.flat(), run.cfg
    model, codes = _phase1_skill(run, device, "enhance")
    before = TR.action_mse(model, fd, codes, cfg.H, device, seed=run.seed)
    stats = TR.enhance(model, fd, codes, cfg, run.seed, device, progress)
    after = TR.action_mse(model, fd, codes, cfg.H, device, seed=run.seed)
    stats.update({"action_mse_before": before["mse"], "action_mse_after": after["mse"],
                  "per_code_mse_before": before["per_code"], "per_code_mse_after": after["per_code"]})
    run.save("skill_enhanced", model)
    return stats


def stage_policy(run: Run, device, progress=None) -> dict:
    """High-level Prompt-DT over skill steps (Sec. 4.3) -> checkpoints/high_level."""
    model, codes = _phase1_skill(run, device, "policy")
    hl = run.new_high_level("policy")
    stats = TR.train_high_level(hl, model, run.flat(), codes, run.cfg, run.seed, device, progress)
    run.save("high_level", hl)
    return stats


def stage_baselines(run: Run, device, progress=None, methods=BASELINES) -> dict:
    """MT-BC and MT-BC-RTG on the same data -> checkpoints/mtbc, mtbc_rtg."""
    out, trained = {}, {}
    for name in (m for m in methods if m in BASELINES):
        pol = run.new_bc(rtg=name == "mtbc_rtg")
        out[name] = TR.train_bc(pol, run.flat(), run.cfg, run.seed, device, progress, name=name)
        trained[name] = pol
    for name, pol in trained.items():   # saved once every baseline trained: the stage writes all or nothing
        run.save(name, pol)
    return out


def eval_prompts(run: Run, codes: np.ndarray) -> dict:
    """One trajectory prompt per task: the last `prompt_len` skill steps of the task's highest-return episode
    (official evaluation: `get_all_prompt`, one prompt episode)."""
    fd, cfg = run.flat(), run.cfg
    pool = TR.PromptPool(fd, 1)
    return {tid: D.prompt_sequence(fd, codes, pool.by_task[tid][0], cfg.prompt_len, cfg.H, cfg.scale)
            for tid in range(len(fd.tasks))}


def make_agent(run: Run, method: str, device):
    """The evaluated agent of `method` from the run's checkpoints (models built under the "evaluate" key)."""
    fd, cfg = run.flat(), run.cfg
    targets = fd.task_max_return()
    if method in BASELINES:
        pol = run.load(method, run.new_bc(rtg=method == "mtbc_rtg", stage="evaluate"), device, "baselines")
        return BCAgent(pol.eval(), fd.mean, fd.std, targets, cfg.scale, device)
    enhanced = method == "goskill"
    skill = run.load("skill_enhanced" if enhanced else "skill", run.new_skill("evaluate"), device,
                     "enhance" if enhanced else "extract").eval()
    hl = run.load("high_level", run.new_high_level("evaluate"), device, "policy").eval()
    prompts = eval_prompts(run, TR.relabel(skill, fd, cfg.H, device))
    return GoSkillAgent(hl, skill, cfg, fd.mean, fd.std, targets, prompts, device, fd.actions.shape[1])


def stage_evaluate(run: Run, device, methods, progress=None, eval_episodes: int | None = None) -> dict:
    """Every method on the same seeded envs (rewound per method): success at any time and return, per task."""
    fd, cfg = run.flat(), run.cfg
    backend = run.backend()
    episodes = int(eval_episodes or cfg.eval_episodes)
    envs_per_task = max(1, min(cfg.envs_per_task, episodes))
    envs = build_envs(backend, fd.tasks, envs_per_task, run.seed)
    out = {}
    for m in methods:
        t0 = time.perf_counter()
        agent = make_agent(run, m, device)
        res = evaluate(agent, backend, fd.tasks, episodes, cfg.max_steps, run.seed, envs_per_task, envs=envs,
                       progress=progress, desc=f"eval {m}")
        out[m] = {**res, "method": m, "eval_s": time.perf_counter() - t0}
    return out


# --------------------------------------------------------------------------------------------- chained


def _stage_table(device, methods, progress, eval_episodes) -> dict:
    return {"collect": lambda run: stage_collect(run, progress),
            "extract": lambda run: stage_extract(run, device, progress),
            "enhance": lambda run: stage_enhance(run, device, progress),
            "policy": lambda run: stage_policy(run, device, progress),
            "baselines": lambda run: stage_baselines(run, device, progress, methods),
            "evaluate": lambda run: stage_evaluate(run, device, methods, progress, eval_episodes)}


# What each stage reads and writes, for the checks before the first stage runs.
MAKES = {"extract": ("skill",), "enhance": ("skill_enhanced",), "policy": ("high_level",)}  # + baselines: methods
NEEDS = {"enhance": ("skill",), "policy": ("skill",)}
EVAL_NEEDS = {"goskill": ("skill_enhanced", "high_level"), "goskill_noenh": ("skill", "high_level"),
              "mtbc": ("mtbc",), "mtbc_rtg": ("mtbc_rtg",)}
MADE_BY = {"skill": "extract", "skill_enhanced": "enhance", "high_level": "policy", "mtbc": "baselines",
           "mtbc_rtg": "baselines"}
# a finished stage whose inputs a stage re-makes is stale unless it runs again too
DOWNSTREAM = {"collect": STAGES[1:], "extract": ("enhance", "policy", "evaluate"), "enhance": ("evaluate",),
              "policy": ("evaluate",), "baselines": ("evaluate",), "evaluate": ()}


# configuration fields each stage's output depends on: a resumed run keeps them for the finished stages it keeps
_SKILL = ("H", "n_codes", "vq_dim", "vq_decay", "commitment", "kmeans_init", "enc_hidden", "enc_layers", "decoder",
          "dec_hidden", "dec_layers", "dec_heads", "dropout")
_TRAIN = ("split", "lr", "weight_decay", "warmup", "grad_clip")
_SCALE = ("max_steps", "rtg_scale")   # the return-to-go scale, and the episode length of the evaluation
STAGE_FIELDS = {
    "collect": ("episodes", "max_steps"),
    "extract": _TRAIN + _SKILL + ("extract_iters", "extract_batch"),
    "enhance": _TRAIN + _SKILL + ("extract_batch", "enhance_iters", "enhance_per_code"),
    "policy": _TRAIN + _SKILL + _SCALE + ("hl_hidden", "hl_layers", "hl_heads", "context", "prompt_len",
                                          "prompt_pool", "conditioning", "policy_iters", "policy_batch", "max_ep_len"),
    "baselines": _TRAIN + _SCALE + ("bc_iters", "bc_batch", "bc_hidden"),
}


def check_kept_stages(old: GoSkillConfig, new: GoSkillConfig, done, stages) -> None:
    """A resumed run may change sizes for the stages it runs, not for the finished ones it keeps."""
    for st, fields in STAGE_FIELDS.items():
        if st not in done or st in stages:
            continue
        for k in fields:
            a, b = getattr(old, k), getattr(new, k)
            if a != b:
                raise BadInputError(f"cannot change {a!r} to {b!r}: the {st} stage of this run folder used {a!r}",
                                    param=k, hint=f"run {st} again (and the stages after it), or start a new run")


def checkpoints_read(stages, methods) -> list[tuple[str, str]]:
    """(stage, checkpoint) for every checkpoint a requested stage loads that no earlier requested stage makes:
    it must be in the folder already."""
    made, out = set(), []
    for st in stages:
        needs = [k for m in methods for k in EVAL_NEEDS[m]] if st == "evaluate" else NEEDS.get(st, ())
        out += [(st, k) for k in dict.fromkeys(needs) if k not in made and k not in {c for _, c in out}]
        made |= set(MAKES.get(st, ()))
        if st == "baselines":
            made |= {m for m in methods if m in BASELINES}
    return out


def _check_checkpoints(run: Run, stages, methods) -> None:
    """Every checkpoint the stages load from the folder is there, readable and finite."""
    for st, k in checkpoints_read(stages, methods):
        if not run.path(k).exists():
            raise BadInputError(f"{run.path(k)}: missing; the {st} stage needs it",
                                hint=f"run the {MADE_BY[k]} stage first, or with it")
        _checked_tensors(run.path(k))


def preflight(run: Run, stages, methods) -> None:
    """Check, before the first requested stage runs, what the stages need: the dataset (read and checked now,
    not after training), environments for its tasks and widths when evaluating, every checkpoint a stage
    loads (present, or made by an earlier requested stage), and no finished stage left stale."""
    if "collect" in stages and run.data_dir:
        raise BadInputError("this run reads a user dataset; nothing to collect", param="stages")
    done = run.stage_stats()
    for st in stages:
        stale = [d for d in DOWNSTREAM[st] if d in done and d not in stages]
        if stale:
            raise BadInputError(f"running {st} again would leave {', '.join(stale)} (already run in this folder) "
                                f"on the old {'data' if st == 'collect' else st + ' output'}", param="stages",
                                hint=f"run {', '.join(stale)} again too, or start a new run folder")
    if "collect" not in stages:
        if not run.data_dir and "collect" not in done:
            raise BadInputError(f"{run.root}: the collect stage has not finished in this folder", param="stages",
                                hint="run it first, or with the other stages")
        fd = run.flat()
        if "evaluate" in stages:
            backend_for(fd.tasks, obs_dim=fd.obs.shape[1], act_dim=fd.actions.shape[1])
    _check_checkpoints(run, stages, methods)


def run_pipeline(run: Run, stages, device, methods=DEFAULT_METHODS, progress=None, timer=None,
                 eval_episodes: int | None = None) -> dict:
    """Run the requested stages in their canonical order; returns the summary of the run folder. A stage that
    fails or is interrupted leaves nothing of its own behind (its outputs are written once it is complete)."""
    stages = [s for s in STAGES if s in set(stages)]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise BadInputError(f"unknown method {unknown[0]!r} (use {', '.join(METHODS)})", param="methods")
    preflight(run, stages, methods)
    table = _stage_table(device, methods, progress, eval_episodes)
    phase_s = {}
    for st in stages:
        t0 = time.perf_counter()
        with (timer.phase(st) if timer is not None else _Null()):
            stats = table[st](run)
        phase_s[st] = time.perf_counter() - t0
        if st == "evaluate":
            atomic_write_json(run.root / "evaluation.json", [stats[m] for m in methods])
            stats = {m: {k: v for k, v in r.items() if k != "per_task"} for m, r in stats.items()}
        run.record(st, {**stats, "time_s": phase_s[st]})
    return summarize(run, phase_s)


def summarize(run: Run, phase_s: dict | None = None) -> dict:
    st = run.stage_stats()
    fd = run.flat() if (run.data_path.is_dir()) else None
    res = {"run_dir": str(run.root), "preset": run.cfg.preset, "seed": run.seed, "split": run.cfg.split,
           "tasks": fd.tasks if fd else run.tasks, "stages_done": [s for s in STAGES if s in st],
           "phase_s": phase_s or {}}
    if fd is not None:
        res["data"] = {"episodes": len(fd.episodes), "steps": int(fd.n),
                       "mean_return": float(fd.ep_return.mean()), "max_steps": run.cfg.max_steps}
    if "extract" in st:
        res["code_usage"] = st["extract"]["code_usage"]
        res["codes_used"] = st["extract"]["codes_used"]
    if "enhance" in st:
        res["enhance"] = {k: st["enhance"][k] for k in ("action_mse_before", "action_mse_after")}
    ev = run.root / "evaluation.json"
    if "evaluate" in st and ev.exists():
        res["methods"] = _read_json(ev, "evaluation record")
    return res


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
