"""The run directory and the stages: collect -> extract -> enhance -> policy -> baselines -> evaluate.

Layout of a run directory:
    config.json                 configuration (preset + overrides), seed, where the data lives
    data/<task>/<i>.npz         collected episodes (absent when --data points at a user dataset)
    dataset.json                collection summary
    checkpoints/*.safetensors   skill.safetensors (phase 1), skill_enhanced, high_level, mtbc, mtbc_rtg
    stages.json                 per-stage statistics (losses, code usage, times)
    result.json                 the evaluation summary (also printed by the CLI)
Each stage reads what it needs from the folder, so stages can run one by one or chained.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from icmltools.core.checkpoint import load_safetensors, save_safetensors
from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import atomic_write_json

from . import data as D
from . import train as TR
from .collect import collect
from .config import GoSkillConfig, config_from_dict
from .evaluate import BCAgent, GoSkillAgent, build_envs, evaluate
from .models import BCPolicy, HighLevelPolicy, SkillModel
from .tasks import MetaWorldBackend, ToyBackend, ToyEnv, all_task_names, resolve_tasks

log = logging.getLogger(__name__)

STAGES = ("collect", "extract", "enhance", "policy", "baselines", "evaluate")
METHODS = ("goskill", "goskill_noenh", "mtbc", "mtbc_rtg")
CKPT = {"skill": "skill.safetensors", "skill_enhanced": "skill_enhanced.safetensors",
        "high_level": "high_level.safetensors", "mtbc": "mtbc.safetensors", "mtbc_rtg": "mtbc_rtg.safetensors"}


class Run:
    """A run directory plus its configuration, lazily loaded data and checkpoints."""

    def __init__(self, root: Path, cfg: GoSkillConfig, seed: int, data_dir: str | None, tasks: list[str] | None):
        self.root, self.cfg, self.seed = Path(root), cfg, int(seed)
        self.data_dir = data_dir      # None: <root>/data (collected)
        self.tasks = tasks
        self._fd = None

    # ---- configuration
    @classmethod
    def create(cls, root, cfg, seed, data_dir=None, tasks=None) -> "Run":
        run = cls(root, cfg, seed, str(Path(data_dir).resolve()) if data_dir else None, tasks)
        run.save_config()
        return run

    @classmethod
    def open(cls, root, overrides: dict | None = None) -> "Run":
        root = Path(root)
        p = root / "config.json"
        if not root.is_dir():
            raise BadInputError(f"--run-dir {root}: not a directory")
        if not p.exists():
            what = "empty" if not any(root.iterdir()) else "not a goskill run directory"
            raise BadInputError(f"--run-dir {root}: no config.json ({what})",
                                hint="start a run with `icml goskill --out DIR` first")
        try:
            doc = json.loads(p.read_text())
            cfg_d = dict(doc["config"])
        except (ValueError, KeyError, TypeError) as e:
            raise BadInputError(f"{p}: unreadable goskill config ({e})") from None
        cfg_d.update({k: v for k, v in (overrides or {}).items() if v is not None})
        run = cls(root, config_from_dict(cfg_d, str(p)), doc.get("seed", 0), doc.get("data_dir"), doc.get("tasks"))
        if overrides:
            run.save_config()
        return run

    def save_config(self):
        atomic_write_json(self.root / "config.json", {"config": self.cfg.to_dict(), "seed": self.seed,
                                                      "data_dir": self.data_dir, "tasks": self.tasks})

    def path(self, key: str) -> Path:
        return self.root / "checkpoints" / CKPT[key]

    def stage_stats(self) -> dict:
        p = self.root / "stages.json"
        return json.loads(p.read_text()) if p.exists() else {}

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
            if not self.data_path.is_dir():
                raise BadInputError(f"{self.data_path}: no dataset in this run directory",
                                    hint="run the collect stage first (or pass --data)")
            tasks, eps = D.load_dataset_dir(self.data_path, self.tasks)
            self.tasks = tasks
            eps = D.split_episodes(eps, self.cfg.split)
            if self.cfg.H > min(len(e["rewards"]) for es in eps for e in es):
                log.warning("some episodes are shorter than H=%d; their goals are clipped at the end", self.cfg.H)
            self._fd = D.flatten(tasks, eps)
        return self._fd

    def backend(self):
        tasks = self.flat().tasks
        if all(t in ToyEnv.GOALS for t in tasks):
            return ToyBackend()
        known = set(all_task_names())
        bad = [t for t in tasks if t not in known]
        if bad:
            raise BadInputError(f"task {bad[0]!r} of the dataset is not a MetaWorld v3 task; it cannot be evaluated",
                                hint="run the training stages only (--stages extract,enhance,policy,baselines)")
        b = MetaWorldBackend()
        if self.flat().obs.shape[1] != b.obs_dim:
            raise BadInputError(f"dataset observations have {self.flat().obs.shape[1]} dims; MetaWorld has {b.obs_dim}")
        return b

    # ---- models
    def dims(self):
        fd = self.flat()
        return fd.obs.shape[1], fd.actions.shape[1], len(fd.tasks)

    def new_skill(self) -> SkillModel:
        ds, da, _ = self.dims()
        return SkillModel(ds, da, self.cfg)

    def new_high_level(self) -> HighLevelPolicy:
        ds, _, nt = self.dims()
        return HighLevelPolicy(ds, self.cfg.vq_dim, self.cfg.n_codes, self.cfg, nt, self.cfg.max_ep_len)

    def new_bc(self, rtg: bool) -> BCPolicy:
        ds, da, nt = self.dims()
        return BCPolicy(ds, da, nt, self.cfg.bc_hidden, rtg=rtg)

    def load(self, key: str, model: torch.nn.Module, device, stage_hint: str) -> torch.nn.Module:
        p = self.path(key)
        if not p.exists():
            raise BadInputError(f"{p}: missing checkpoint", hint=f"run the {stage_hint} stage first")
        sd = load_safetensors(p)
        try:
            model.load_state_dict(sd)
        except RuntimeError as e:
            raise BadInputError(f"{p}: does not match the configuration ({str(e).splitlines()[0]})") from None
        return model.to(device)

    def save(self, key: str, model: torch.nn.Module):
        self.path(key).parent.mkdir(parents=True, exist_ok=True)
        save_safetensors({k: v.detach().cpu() for k, v in model.state_dict().items()}, self.path(key))


def task_names(spec: str) -> list[str]:
    """MetaWorld task names (validated), or the toy tasks toy-a..toy-d of the pure-numpy test env."""
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if names and all(t in ToyEnv.GOALS for t in names):
        return names
    return resolve_tasks(spec)


def _rng(seed: int, stage: str) -> np.random.Generator:
    return np.random.default_rng([seed, STAGES.index(stage) + 1])


def _torch_seed(seed: int, stage: str) -> torch.Generator:
    s = seed * 100 + STAGES.index(stage) + 1
    torch.manual_seed(s)
    return torch.Generator().manual_seed(s)


# --------------------------------------------------------------------------------------------- stages


def stage_collect(run: Run, progress=None) -> dict:
    if run.data_dir:
        raise BadInputError("this run reads a user dataset (--data); nothing to collect")
    cfg = run.cfg
    tasks = task_names(cfg.tasks)
    out = run.root / "data"
    summary = collect(tasks, out, episodes=cfg.episodes, max_steps=cfg.max_steps, seed=run.seed,
                      workers=cfg.workers, progress=progress)
    run.tasks = tasks
    run.save_config()
    atomic_write_json(run.root / "dataset.json", summary)
    run._fd = None
    return summary


def stage_extract(run: Run, device, progress=None) -> dict:
    fd, cfg = run.flat(), run.cfg
    gen = _torch_seed(run.seed, "extract")
    model = run.new_skill()
    stats = TR.extract_skills(model, fd, cfg, _rng(run.seed, "extract"), device, progress, generator=gen)
    codes = TR.relabel(model, fd, cfg.H, device)
    stats["code_usage"] = np.bincount(codes, minlength=cfg.n_codes).tolist()
    stats["codes_used"] = int((np.bincount(codes, minlength=cfg.n_codes) > 0).sum())
    stats["action_mse"] = TR.action_mse(model, fd, codes, cfg.H, device, seed=run.seed)["mse"]
    run.save("skill", model)
    return stats


def stage_enhance(run: Run, device, progress=None) -> dict:
    fd, cfg = run.flat(), run.cfg
    _torch_seed(run.seed, "enhance")
    model = run.load("skill", run.new_skill(), device, "extract")
    codes = TR.relabel(model, fd, cfg.H, device)
    before = TR.action_mse(model, fd, codes, cfg.H, device, seed=run.seed)
    stats = TR.enhance(model, fd, codes, cfg, _rng(run.seed, "enhance"), device, progress)
    after = TR.action_mse(model, fd, codes, cfg.H, device, seed=run.seed)
    stats.update({"action_mse_before": before["mse"], "action_mse_after": after["mse"],
                  "per_code_mse_before": before["per_code"], "per_code_mse_after": after["per_code"]})
    run.save("skill_enhanced", model)
    return stats


def stage_policy(run: Run, device, progress=None) -> dict:
    fd, cfg = run.flat(), run.cfg
    _torch_seed(run.seed, "policy")
    model = run.load("skill", run.new_skill(), device, "extract")  # codes depend on encoder + codebook only
    codes = TR.relabel(model, fd, cfg.H, device)
    hl = run.new_high_level()
    stats = TR.train_high_level(hl, model, fd, codes, cfg, _rng(run.seed, "policy"), device, progress)
    run.save("high_level", hl)
    return stats


def stage_baselines(run: Run, device, progress=None, methods=("mtbc", "mtbc_rtg")) -> dict:
    fd, cfg = run.flat(), run.cfg
    out = {}
    for name in methods:
        if name not in ("mtbc", "mtbc_rtg"):
            continue
        _torch_seed(run.seed, "baselines")
        pol = run.new_bc(rtg=name == "mtbc_rtg")
        rng = np.random.default_rng([run.seed, 50 + (name == "mtbc_rtg")])
        out[name] = TR.train_bc(pol, fd, cfg, rng, device, progress, name=name)
        run.save(name, pol)
    return out


def _prompts(run: Run, skill: SkillModel, codes: np.ndarray, rng=None) -> dict:
    """One trajectory prompt per task: the last `prompt_len` skill steps of the task's highest-return episode
    (official evaluation: `get_all_prompt`, one prompt episode)."""
    fd, cfg = run.flat(), run.cfg
    pool = TR.PromptPool(fd, 1)
    return {tid: D.prompt_sequence(fd, codes, pool.by_task[tid][0], cfg.prompt_len, cfg.H, cfg.scale)
            for tid in range(len(fd.tasks))}


def stage_evaluate(run: Run, device, methods, progress=None, eval_episodes: int | None = None) -> dict:
    fd, cfg = run.flat(), run.cfg
    backend = run.backend()
    episodes = int(eval_episodes or cfg.eval_episodes)
    targets = fd.task_max_return()
    envs_per_task = max(1, min(cfg.envs_per_task, episodes))
    envs = build_envs(backend, fd.tasks, envs_per_task, run.seed + 1000)
    da = fd.actions.shape[1]
    out = {}
    for m in methods:
        t0 = time.perf_counter()
        if m in ("goskill", "goskill_noenh"):
            key = "skill_enhanced" if m == "goskill" else "skill"
            skill = run.load(key, run.new_skill(), device, "enhance" if m == "goskill" else "extract").eval()
            hl = run.load("high_level", run.new_high_level(), device, "policy").eval()
            codes = TR.relabel(skill, fd, cfg.H, device)
            prompts = _prompts(run, skill, codes, np.random.default_rng([run.seed, 77]))
            agent = GoSkillAgent(hl, skill, cfg, fd.mean, fd.std, targets, prompts, device, da)
        else:
            pol = run.load(m, run.new_bc(rtg=m == "mtbc_rtg"), device, "baselines").eval()
            agent = BCAgent(pol, fd.mean, fd.std, targets, cfg.scale, device)
        torch.manual_seed(run.seed)
        res = evaluate(agent, backend, fd.tasks, episodes, cfg.max_steps, run.seed, envs_per_task, envs=envs,
                       progress=progress, desc=f"eval {m}")
        res["method"] = m
        res["eval_s"] = time.perf_counter() - t0
        out[m] = res
    return out


# --------------------------------------------------------------------------------------------- chained


def run_pipeline(run: Run, stages, device, methods=("goskill", "mtbc", "mtbc_rtg"), progress=None, timer=None,
                 eval_episodes: int | None = None) -> dict:
    """Run the requested stages in order; returns the summary (also written to result.json)."""
    stages = [s for s in STAGES if s in set(stages)]
    for m in methods:
        if m not in METHODS:
            raise BadInputError(f"--methods: unknown method {m!r} (use {', '.join(METHODS)})")
    phase_s = {}
    for st in stages:
        t0 = time.perf_counter()
        ctx = timer.phase(st) if timer is not None else _Null()
        with ctx:
            if st == "collect":
                stats = stage_collect(run, progress)
            elif st == "extract":
                stats = stage_extract(run, device, progress)
            elif st == "enhance":
                stats = stage_enhance(run, device, progress)
            elif st == "policy":
                stats = stage_policy(run, device, progress)
            elif st == "baselines":
                stats = stage_baselines(run, device, progress, [m for m in methods if m.startswith("mtbc")])
            else:
                stats = stage_evaluate(run, device, methods, progress, eval_episodes)
        phase_s[st] = time.perf_counter() - t0
        if st == "evaluate":
            atomic_write_json(run.root / "evaluation.json", [stats[m] for m in methods])
            stats = {m: {k: v for k, v in r.items() if k != "per_task"} for m, r in stats.items()}
        run.record(st, {**stats, "time_s": phase_s[st]})
    summary = summarize(run, phase_s)
    if "evaluate" in stages:
        atomic_write_json(run.root / "result.json", summary)
    return summary


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
        res["methods"] = json.loads(ev.read_text())
    return res


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# --------------------------------------------------------------------------------------------- entry point


def parse_list(value: str | None, allowed, what: str) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if items == ["all"]:
        return list(allowed)
    for v in items:
        if v not in allowed:
            raise BadInputError(f"--{what}: unknown value {v!r} (use {', '.join(allowed)} or all)")
    if not items:
        raise BadInputError(f"--{what}: empty list")
    return items


def start(*, preset: str = "quick", out=None, run_dir=None, data=None, stages: str | None = None,
          methods: str | None = None, seed: int = 0, device: str = "cpu", overrides: dict | None = None,
          eval_episodes: int | None = None, progress=None, timer=None) -> dict:
    """Open (`run_dir`) or create (`out`, default runs/goskill/<stamp>) a run directory and run the stages.

    New runs do every stage by default (without collect when `data` is a user dataset); an existing run
    directory continues with the stages it has not done yet."""
    from icmltools.core.runs import make_run_dir

    from .config import make_config

    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    stage_list = parse_list(stages, STAGES, "stages")
    method_list = parse_list(methods, METHODS, "methods") or ["goskill", "mtbc", "mtbc_rtg"]
    if run_dir is not None:
        if out is not None or data is not None:
            raise BadInputError("--run-dir continues a run; do not combine it with --out or --data")
        run = Run.open(run_dir, overrides)
        if stage_list is None:
            done = run.stage_stats()
            stage_list = [s for s in STAGES if s not in done and not (s == "collect" and run.data_dir)] or ["evaluate"]
    else:
        cfg = make_config(preset, **overrides)
        tasks = None
        if data is not None:
            task_filter = None if "tasks" not in overrides else task_names(cfg.tasks)
            tasks, _ = D.load_dataset_dir(data, task_filter)   # validate before creating anything
        else:
            task_names(cfg.tasks)
        if stage_list is None:
            stage_list = [s for s in STAGES if not (s == "collect" and data is not None)]
        if data is not None and "collect" in stage_list:
            raise BadInputError("--stages collect cannot be combined with --data (the data is given)")
        if data is None and "collect" not in stage_list:
            raise BadInputError("a new run without --data must include the collect stage",
                                hint="or continue an existing run with --run-dir")
        root = make_run_dir("goskill", out)
        run = Run.create(root, cfg, seed, data_dir=data, tasks=tasks)
    summary = run_pipeline(run, stage_list, device, method_list, progress, timer, eval_episodes)
    summary["stages_run"] = [s for s in STAGES if s in stage_list]
    return summary
