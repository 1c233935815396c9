"""Task lists, environment back-ends (MetaWorld 3.x `-v3` and a pure-numpy toy) and warning hygiene."""
from __future__ import annotations

import contextlib
import difflib
import logging
import warnings
from typing import Callable

import numpy as np

from icmltools.core.errors import BadInputError, MissingDependencyError

MT10 = ["reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3"]


@contextlib.contextmanager
def quiet():
    """Silence the warnings MetaWorld, gymnasium and the scripted policies emit (they go nowhere)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lg = logging.getLogger("gymnasium")
        old = lg.level
        lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            lg.setLevel(old)


def _metaworld():
    try:
        with quiet():
            import metaworld  # noqa: F401
            from metaworld.env_dict import ALL_V3_ENVIRONMENTS, ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE, MT50_V3
            from metaworld.policies import ENV_POLICY_MAP
    except ImportError as e:  # pragma: no cover - metaworld is a declared dependency
        raise MissingDependencyError(f"metaworld is needed for MetaWorld tasks ({e})",
                                     hint="pip install 'metaworld>=3'") from None
    return ALL_V3_ENVIRONMENTS, ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE, MT50_V3, ENV_POLICY_MAP


def all_task_names() -> list[str]:
    return list(_metaworld()[0])


def resolve_tasks(spec: str | list[str] | tuple) -> list[str]:
    """`mt10`, `mt50` or a comma-separated list of MetaWorld `-v3` task names (validated)."""
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key == "mt10":
            return list(MT10)
        if key == "mt50":
            return list(_metaworld()[2])
        names = [s.strip() for s in spec.split(",") if s.strip()]
    else:
        names = [str(s).strip() for s in spec]
    if not names:
        raise BadInputError("--tasks: no task names given (use mt10, mt50 or a comma-separated list)")
    known = set(all_task_names())
    for n in names:
        if n not in known:
            close = difflib.get_close_matches(n, sorted(known), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "names look like reach-v3; or use mt10 / mt50"
            raise BadInputError(f"--tasks: unknown MetaWorld task {n!r}", hint=hint)
    if len(set(names)) != len(names):
        raise BadInputError("--tasks: a task is listed twice")
    return names


class MetaWorldBackend:
    """MetaWorld 3.x goal-observable `-v3` envs; a new random goal on every reset (MetaWorld's MT protocol)."""

    name = "metaworld"
    obs_dim = 39
    act_dim = 4

    def __init__(self, reward_function_version: str = "v2"):
        self.reward_function_version = reward_function_version

    def make(self, task: str, seed: int):
        _, go, _, _ = _metaworld()
        with quiet():
            env = go[task + "-goal-observable"](seed=int(seed))
            env._freeze_rand_vec = False  # sample a new goal position on every reset
            # ... from the env's own seeded generator: MetaWorld otherwise draws reset goals from the global
            # np.random, so collection and evaluation would not be reproducible under --seed
            env.seeded_rand_vec = True
        env._icml_seed = int(seed)
        return env

    @staticmethod
    def reseed(env):
        """Rewind the env's goal sequence to its seed (every evaluated method then sees the same goals)."""
        with quiet():
            env.seed(env._icml_seed)

    def expert(self, task: str) -> Callable[[np.ndarray], np.ndarray]:
        pol = _metaworld()[3][task]()

        def act(obs):
            with quiet():
                return np.asarray(pol.get_action(obs), dtype=np.float64)
        return act

    @staticmethod
    def reset(env):
        with quiet():
            obs, _ = env.reset()
        return np.asarray(obs, dtype=np.float32)

    @staticmethod
    def step(env, action):
        with quiet():
            obs, r, term, trunc, info = env.step(np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0))
        return np.asarray(obs, dtype=np.float32), float(r), bool(info.get("success", 0.0) > 0)


# --------------------------------------------------------------------------------------------- toy


class ToyEnv:
    """A point in the unit square must reach a task-specific corner region (pure numpy, for tests).

    obs = [x, y, goal_x, goal_y, 0, 0]; action in [-1, 1]^2 moves the point by 0.1 * action;
    reward = 1 - distance; success when the distance is below 0.1.
    """

    GOALS = {"toy-a": (0.85, 0.85), "toy-b": (0.15, 0.85), "toy-c": (0.85, 0.15), "toy-d": (0.15, 0.15)}

    def __init__(self, task: str, seed: int):
        if task not in self.GOALS:
            raise BadInputError(f"unknown toy task {task!r}")
        self.task = task
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.pos = np.zeros(2)
        self.goal = np.asarray(self.GOALS[task], dtype=np.float64)

    def obs(self):
        return np.concatenate([self.pos, self.goal, np.zeros(2)]).astype(np.float32)


class ToyBackend:
    name = "toy"
    obs_dim = 6
    act_dim = 2

    def make(self, task: str, seed: int):
        return ToyEnv(task, seed)

    def expert(self, task: str):
        def act(obs):
            return np.clip((obs[2:4] - obs[:2]) * 10.0, -1.0, 1.0)
        return act

    @staticmethod
    def reseed(env):
        env.rng = np.random.default_rng(env.seed)

    @staticmethod
    def reset(env):
        env.pos = env.rng.uniform(0.4, 0.6, size=2)
        return env.obs()

    @staticmethod
    def step(env, action):
        a = np.clip(np.asarray(action, dtype=np.float64)[:2], -1.0, 1.0)
        env.pos = np.clip(env.pos + 0.1 * a, 0.0, 1.0)
        d = float(np.linalg.norm(env.pos - env.goal))
        return env.obs(), 1.0 - d, d < 0.1


def backend_for(tasks: list[str]):
    return ToyBackend() if tasks and all(t in ToyEnv.GOALS for t in tasks) else MetaWorldBackend()
