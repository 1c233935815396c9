"""Offline data without downloads: scripted experts behind a random-to-expert quality ramp.

Episode i of n for a task has quality q_i = i / (n - 1). Below expert quality the behaviour policy starts
held random actions (a uniform action kept for 5-15 steps) with probability 0.1 (1 - q)^2 per step and
otherwise adds Gaussian noise of std 0.02 + 0.4 (1 - q) to the expert action, so returns climb from
random to expert like a SAC replay buffer. Near-optimal = all episodes, sub-optimal = the first half
(the paper's split rule for replay buffers). Episodes are written in the official layout
`<dir>/<task>/<i>.npz` with `observations`, `next_observations`, `actions`, `rewards`, `terminals`,
`successes`.
"""
from __future__ import annotations

import logging
import signal
from pathlib import Path

import numpy as np

from icmltools.core.jsonio import atomic_path
from icmltools.core.seed import derive

from .tasks import backend_for

log = logging.getLogger(__name__)

HOLD = (5, 15)
P_RANDOM = 0.1
SIGMA = (0.02, 0.4)


def ramp_episode(backend, env, expert, quality: float, max_steps: int, rng: np.random.Generator) -> dict:
    """Roll one behaviour episode at `quality` in [0, 1] (1 = expert with small noise)."""
    obs = backend.reset(env)
    act_dim = backend.act_dim
    ep = {k: [] for k in ("observations", "next_observations", "actions", "rewards", "successes")}
    hold_left, held = 0, None
    sigma = SIGMA[0] + SIGMA[1] * (1.0 - quality)
    for _ in range(max_steps):
        if hold_left == 0 and rng.random() < P_RANDOM * (1.0 - quality) ** 2:
            hold_left = int(rng.integers(HOLD[0], HOLD[1] + 1))
            held = rng.uniform(-1.0, 1.0, size=act_dim)
        if hold_left > 0:
            a = held
            hold_left -= 1
        else:
            a = expert(obs) + rng.normal(0.0, sigma, size=act_dim)
        a = np.clip(a, -1.0, 1.0).astype(np.float32)
        nobs, r, succ = backend.step(env, a)
        for k, v in zip(ep, (obs, nobs, a, r, succ)):
            ep[k].append(v)
        obs = nobs
    out = {k: np.asarray(v, np.float32) for k, v in ep.items()}
    out["terminals"] = np.zeros(len(out["actions"]), np.float32)
    return out


def save_episode(path: Path, ep: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **ep)


def task_stream(seed: int, task: str):
    """The collection stream of one task (keyed by its name: a task's data does not depend on the task list)."""
    return derive(seed, "collect", task)


def env_seed(seed: int, task: str) -> int:
    """The seed of the environment a task's episodes are collected in (its i-th reset starts episode i)."""
    return task_stream(seed, task).child("env").int(31)


def _collect_task(args) -> dict:
    task, n_episodes, max_steps, seed, out_dir, backend_name = args
    from .tasks import MetaWorldBackend, ToyBackend

    backend = ToyBackend() if backend_name == "toy" else MetaWorldBackend()
    rng = task_stream(seed, task).child("behaviour").numpy()
    env = backend.make(task, seed=env_seed(seed, task))
    expert = backend.expert(task)
    returns, succ = [], []
    for i in range(n_episodes):
        q = i / max(n_episodes - 1, 1)
        ep = ramp_episode(backend, env, expert, q, max_steps, rng)
        save_episode(Path(out_dir) / task / f"{i}.npz", ep)
        returns.append(float(ep["rewards"].sum()))
        succ.append(float(ep["successes"].max()))
    return {"task": task, "returns": returns, "success": succ}


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def collect(tasks: list[str], out_dir: str | Path, *, episodes: int, max_steps: int, seed: int,
            workers: int = 1, progress=None) -> dict:
    """Collect `episodes` ramp episodes of `max_steps` for each task into `out_dir/<task>/<i>.npz`."""
    backend = backend_for(tasks)
    jobs = [(t, episodes, max_steps, seed, str(out_dir), backend.name) for t in tasks]
    results = []
    if workers <= 1:
        for k, job in enumerate(jobs):
            results.append(_collect_task(job))
            if progress:
                progress("collect", k + 1, len(jobs))
    else:
        import multiprocessing as mp

        # Workers ignore SIGINT (a terminal's Ctrl-C reaches the whole process group): the parent alone
        # stops, and leaving the pool terminates them at once, so none writes after the parent returns.
        with mp.get_context("fork").Pool(workers, initializer=_ignore_sigint) as pool:
            for k, r in enumerate(pool.imap(_collect_task, jobs)):
                results.append(r)
                if progress:
                    progress("collect", k + 1, len(jobs))
    per_task = {r["task"]: {"mean_return": float(np.mean(r["returns"])), "max_return": float(np.max(r["returns"])),
                            "success_rate": float(np.mean(r["success"])),
                            "expert_half_success": float(np.mean(r["success"][len(r["success"]) // 2:]))}
                for r in results}
    log.info("collected %d tasks x %d episodes", len(tasks), episodes)
    return {"episodes_per_task": episodes, "max_steps": max_steps, "per_task": per_task}
