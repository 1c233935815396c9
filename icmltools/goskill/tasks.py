"""Task lists, environment back-ends (MetaWorld 3.x `-v3` and a pure-numpy toy) and warning hygiene.

Arrays we store never reach code we do not own: the scripted experts get a copy of the observation (the
door experts shift parts of the array they are given in place; issue 20), and observations coming back
from an environment are copied into our own float32 arrays.
"""
from __future__ import annotations

import contextlib
import difflib
import logging
import sys
import warnings
from typing import Callable

import numpy as np

from icmltools.core.errors import BadInputError, MissingDependencyError
from icmltools.core.seed import derive

MT10 = ["reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3"]

log = logging.getLogger(__name__)


def _mujoco_warning(msg: str) -> None:
    log.warning("MuJoCo: %s", str(msg).strip())


@contextlib.contextmanager
def quiet():
    """Silence the warnings MetaWorld, gymnasium and the scripted policies emit, and send MuJoCo's own
    warnings (printed on stdout and appended to ./MUJOCO_LOG.TXT by default) to the log, which `-q` silences."""
    mj = sys.modules.get("mujoco")
    old_hook = mj.get_mju_user_warning() if mj is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lg = logging.getLogger("gymnasium")
        old = lg.level
        lg.setLevel(logging.ERROR)
        if mj is not None:
            mj.set_mju_user_warning(_mujoco_warning)
        try:
            yield
        finally:
            lg.setLevel(old)
            if mj is not None:
                mj.set_mju_user_warning(old_hook)


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


def _split(spec) -> list[str]:
    if isinstance(spec, str):
        return [s.strip().lower() for s in spec.split(",") if s.strip()]
    return [str(s).strip().lower() for s in spec]


def resolve_tasks(spec: str | list[str] | tuple) -> list[str]:
    """`mt10`, `mt50` or a comma-separated list of MetaWorld `-v3` task names, any case (validated); or the
    toy tasks toy-a..toy-d of the pure-numpy test env."""
    names = _split(spec)
    if names == ["mt10"]:
        return list(MT10)
    if names == ["mt50"]:
        return list(_metaworld()[2])
    if not names:
        raise BadInputError("no task names given (use mt10, mt50 or a comma-separated list)", param="tasks")
    if len(set(names)) != len(names):
        raise BadInputError("a task is listed twice", param="tasks")
    if all(t in ToyEnv.GOALS for t in names):
        return names
    check_metaworld_tasks(names, param="tasks")
    return names


def check_metaworld_tasks(names: list[str], *, param: str | None = None, what: str = "unknown MetaWorld task {!r}",
                          hint: str | None = None) -> None:
    """Raise naming the first name that is not a MetaWorld v3 task (close matches as the hint by default)."""
    known = set(all_task_names())
    for n in names:
        if n not in known:
            if hint is None:
                close = difflib.get_close_matches(n, sorted(known), n=3)
                hint = f"did you mean {', '.join(close)}?" if close else "names look like reach-v3; or use mt10 / mt50"
            raise BadInputError(what.format(n), hint=hint, param=param)


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
        """MetaWorld's scripted policy for `task`. It gets a copy of the observation: the door experts modify
        the array they are given (door-close shifts obs[4:7], door-open obs[4]), which corrupted stored data."""
        pol = _metaworld()[3][task]()

        def act(obs):
            with quiet():
                return np.asarray(pol.get_action(np.array(obs, copy=True)), dtype=np.float64)
        return act

    @staticmethod
    def reset(env):
        with quiet():
            obs, _ = env.reset()
        return np.array(obs, dtype=np.float32, copy=True)

    @staticmethod
    def step(env, action):
        with quiet():
            obs, r, term, trunc, info = env.step(np.clip(np.array(action, dtype=np.float64), -1.0, 1.0))
        return np.array(obs, dtype=np.float32, copy=True), float(r), bool(info.get("success", 0.0) > 0)


# --------------------------------------------------------------------------------------------- toy


class ToyEnv:
    """A point in the unit square must reach a task-specific corner region (pure numpy, for tests).

    obs = [x, y, goal_x, goal_y, 0, 0]; action in [-1, 1]^2 moves the point by 0.1 * action;
    reward = 1 - distance; success when the distance is below 0.1.
    """

    GOALS = {"toy-a": (0.85, 0.85), "toy-b": (0.15, 0.85), "toy-c": (0.85, 0.15), "toy-d": (0.15, 0.15)}

    def __init__(self, task: str, seed: int):
        if task not in self.GOALS:
            raise BadInputError(f"unknown toy task {task!r}", param="tasks")
        self.task = task
        self.seed = seed
        self.rng = self.start_rng(seed)
        self.pos = np.zeros(2)
        self.goal = np.asarray(self.GOALS[task], dtype=np.float64)

    @staticmethod
    def start_rng(seed: int) -> np.random.Generator:
        return derive(int(seed), "toy-env").numpy()

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
        env.rng = ToyEnv.start_rng(env.seed)

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


def is_toy(tasks) -> bool:
    return bool(tasks) and all(t in ToyEnv.GOALS for t in tasks)


def env_widths(task: str) -> tuple[int, int] | None:
    """(observation, action) widths of the environment of `task`, or None when no environment has that name."""
    if task in ToyEnv.GOALS:
        return ToyBackend.obs_dim, ToyBackend.act_dim
    if task.endswith("-v3") and task in set(all_task_names()):
        return MetaWorldBackend.obs_dim, MetaWorldBackend.act_dim
    return None


def backend_for(tasks: list[str], obs_dim: int | None = None, act_dim: int | None = None):
    """The back-end that can run `tasks` (all toy, or all MetaWorld v3), checked against the data's widths."""
    if is_toy(tasks):
        b = ToyBackend()
    else:
        check_metaworld_tasks(tasks, what="task {!r} of the dataset is not a MetaWorld v3 task; it cannot be "
                                           "evaluated",
                              hint="run the training stages only (extract, enhance, policy, baselines)")
        b = MetaWorldBackend()
    for what, got, want in (("observations", obs_dim, b.obs_dim), ("actions", act_dim, b.act_dim)):
        if got is not None and got != want:
            raise BadInputError(f"dataset {what} have {got} dims; the {b.name} environments have {want}")
    return b
