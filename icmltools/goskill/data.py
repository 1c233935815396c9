"""The offline dataset: reading the official `<task>/<i>.npz` layout, normalisation, goal windows, samplers."""
from __future__ import annotations

import os
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError

REQUIRED = ("observations", "actions", "rewards")
PER_STEP = ("next_observations", "successes", "terminals")   # optional; one entry per step when present
_F32_MAX = float(np.finfo(np.float32).max)


def load_task_dir(task_dir: Path) -> list[dict]:
    """Episodes of one task folder, in the integer order of their file names (`0.npz`, `1.npz`, ...)."""
    return [ep for _, ep in _load_task(Path(task_dir))]


def _episode_files(task_dir: Path) -> list[Path]:
    files = [p for p in task_dir.iterdir() if p.suffix == ".npz" and re.fullmatch(r"\d+", p.stem)]
    files.sort(key=lambda p: (int(p.stem), p.name))
    for a, b in zip(files, files[1:]):
        if int(a.stem) == int(b.stem):
            raise BadInputError(f"{b}: same episode number as {a.name} (episodes are ordered by number)")
    return files


def _load_task(task_dir: Path) -> list[tuple[Path, dict]]:
    return [(p, _check_episode(p, _read_npz(p))) for p in _episode_files(task_dir)]


def _read_npz(p: Path) -> dict:
    """Every array of one episode file; any failure is one error naming the file."""
    try:
        size = p.stat().st_size
    except OSError as e:
        raise BadInputError(f"{p}: cannot read ({(e.strerror or type(e).__name__).lower()})") from None
    if size == 0:
        raise BadInputError(f"{p}: empty file (0 bytes), not a .npz episode")
    if not os.access(p, os.R_OK):
        raise BadInputError(f"{p}: cannot read (permission denied)")
    if not zipfile.is_zipfile(p):
        raise BadInputError(f"{p}: not a .npz archive (truncated, or another format)")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise BadInputError(f"{p}: not a readable .npz episode ({str(e).splitlines()[0][:200]})") from None


def _check_episode(p, ep: dict) -> dict:
    """The arrays the pipeline uses, as float32, after checking names, dtypes, shapes, lengths and values."""
    missing = [k for k in REQUIRED if k not in ep]
    if missing:
        raise BadInputError(f"{p}: missing array {missing[0]!r} (an episode needs {', '.join(REQUIRED)}; "
                            f"this file has {', '.join(sorted(ep)) or 'no arrays'})")
    for k in (*REQUIRED, *PER_STEP):
        if k in ep and ep[k].dtype.kind not in "biuf":
            raise BadInputError(f"{p}: {k} has dtype {ep[k].dtype}; expected real numbers")
    o, a, r = ep["observations"], ep["actions"], ep["rewards"]
    if o.ndim != 2 or a.ndim != 2:
        raise BadInputError(f"{p}: observations {o.shape} and actions {a.shape} must be 2-D (T, dim)")
    r = r.reshape(-1) if r.ndim == 2 and r.shape[1] == 1 else r
    if r.ndim != 1 or not (len(o) == len(a) == len(r)) or len(o) < 1:
        raise BadInputError(f"{p}: observations {o.shape}, actions {a.shape}, rewards {r.shape} "
                            "must share the episode length T >= 1")
    no = ep.get("next_observations")
    if no is None:
        no = np.concatenate([o[1:], o[-1:]], axis=0)
    elif no.shape != o.shape:
        raise BadInputError(f"{p}: next_observations {no.shape} differs from observations {o.shape}")
    for k in ("successes", "terminals"):
        if k in ep and ep[k].size != len(o):
            raise BadInputError(f"{p}: {k} has {ep[k].size} entries; the episode has {len(o)} steps")
    raw = {"observations": o, "next_observations": no, "actions": a, "rewards": r}
    if "successes" in ep:
        raw["successes"] = ep["successes"].reshape(-1)
    return {k: _float32(p, k, v) for k, v in raw.items()}


def _float32(p, name: str, v: np.ndarray) -> np.ndarray:
    bad = ~np.isfinite(v)
    if bad.any():
        raise BadInputError(f"{p}: {name} has non-finite values (NaN or inf; first at step "
                            f"{int(np.argwhere(bad)[0][0])})")
    if v.dtype.kind == "f" and v.dtype.itemsize > 4 and v.size and float(np.abs(v).max()) > _F32_MAX:
        raise BadInputError(f"{p}: {name} has values beyond the float32 range (|x| > {_F32_MAX:.3g})")
    return v.astype(np.float32)


def _widths(ep: dict) -> tuple[int, int]:
    return ep["observations"].shape[1], ep["actions"].shape[1]


def check_widths(tasks: list[str], files: list[list[Path]], episodes: list[list[dict]]) -> None:
    """Every episode has the widths of the first one, and of its task's environment when the task is one
    (MetaWorld v3: 39 x 4; toy: 6 x 2)."""
    from .tasks import env_widths

    ref_path, ref = files[0][0], _widths(episodes[0][0])
    for task, paths, eps in zip(tasks, files, episodes):
        env = env_widths(task)
        for p, ep in zip(paths, eps):
            w = _widths(ep)
            if env is not None and w != env:
                raise BadInputError(f"{p}: observations have {w[0]} columns and actions {w[1]}; the {task} "
                                    f"environment has {env[0]} and {env[1]}")
            if w != ref:
                raise BadInputError(f"{p}: observations have {w[0]} columns and actions {w[1]}, but {ref_path} "
                                    f"has {ref[0]} and {ref[1]} (every episode needs the same widths)")


def load_dataset_dir(root: str | Path, tasks: list[str] | None = None) -> tuple[list[str], list[list[dict]]]:
    """Read `<root>/<task>/<i>.npz` for the given tasks (default: every sub-folder holding episodes), checked:
    every file readable, the arrays present, finite and of one length per episode, the same widths across
    tasks (those of the environment for a known task), at least one episode per task."""
    root = Path(root)
    if not root.is_dir():
        raise BadInputError(f"{root}: not a directory", param="data")
    if tasks is None:
        tasks = sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.npz")))
        if not tasks:
            hint = ("it holds .npz files itself: give the folder above it (one sub-folder per task)"
                    if any(root.glob("*.npz")) else None)
            raise BadInputError(f"{root}: no <task>/<i>.npz episodes found", param="data", hint=hint)
    files, episodes = [], []
    for t in tasks:
        d = root / t
        if not d.is_dir():
            raise BadInputError(f"{root}: no folder for task {t!r}", param="data")
        loaded = _load_task(d)
        if not loaded:
            raise BadInputError(f"{d}: no <i>.npz episodes", param="data")
        files.append([p for p, _ in loaded])
        episodes.append([ep for _, ep in loaded])
    check_widths(list(tasks), files, episodes)
    return list(tasks), episodes


def split_episodes(episodes: list[list[dict]], split: str) -> list[list[dict]]:
    """near = all episodes; sub = the first half of each task's episodes (the paper's replay split)."""
    if split == "near":
        return episodes
    if split == "sub":
        return [eps[: max(1, len(eps) // 2)] for eps in episodes]
    raise BadInputError(f"{split!r}: use near or sub", param="split")


def goal_end_index(t: np.ndarray, ep_end: np.ndarray, H: int) -> np.ndarray:
    """Index j such that the goal of the window starting at t is next_obs[j] - obs[t]: j = t + H - 1,
    clipped to the last step of the episode (so g_t = s_{t+H} - s_t, or s_T - s_t near the end)."""
    return np.minimum(np.asarray(t) + H - 1, np.asarray(ep_end) - 1)


@dataclass
class FlatData:
    """All episodes concatenated (normalised states), with per-step indices for fast batching."""

    tasks: list[str]
    obs: np.ndarray          # (N, ds) normalised
    next_obs: np.ndarray     # (N, ds) normalised
    actions: np.ndarray      # (N, da)
    rewards: np.ndarray      # (N,)
    rtg: np.ndarray          # (N,) undiscounted return-to-go (raw)
    task_id: np.ndarray      # (N,)
    ep_start: np.ndarray     # (N,) start index of the step's episode
    ep_end: np.ndarray       # (N,) one past the end
    timestep: np.ndarray     # (N,) step within the episode
    mean: np.ndarray
    std: np.ndarray
    episodes: list[tuple[int, int, int]] = field(default_factory=list)  # (task_id, start, end)
    ep_return: np.ndarray = None

    @property
    def n(self) -> int:
        return len(self.obs)

    def normalize(self, s: np.ndarray) -> np.ndarray:
        return ((s - self.mean) / self.std).astype(np.float32)

    def task_max_return(self) -> np.ndarray:
        out = np.zeros(len(self.tasks))
        for (k, _, _), R in zip(self.episodes, self.ep_return):
            out[k] = max(out[k], R) if out[k] else R
        return out


def flatten(tasks: list[str], episodes: list[list[dict]], mean=None, std=None) -> FlatData:
    """Concatenate episodes; states normalised with one global mean/std (as the official code does)."""
    obs = np.concatenate([e["observations"] for eps in episodes for e in eps])
    if mean is None:
        mean, std = obs.mean(0), obs.std(0) + 1e-6
    mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    parts = {k: [] for k in ("no", "a", "r", "rtg", "tid", "s", "e", "ts")}
    eps_idx, rets, pos = [], [], 0
    for k, eps in enumerate(episodes):
        for e in eps:
            T = len(e["rewards"])
            parts["no"].append(e["next_observations"])
            parts["a"].append(e["actions"])
            parts["r"].append(e["rewards"])
            parts["rtg"].append(np.cumsum(e["rewards"][::-1])[::-1])
            parts["tid"].append(np.full(T, k))
            parts["s"].append(np.full(T, pos))
            parts["e"].append(np.full(T, pos + T))
            parts["ts"].append(np.arange(T))
            eps_idx.append((k, pos, pos + T))
            rets.append(float(e["rewards"].sum()))
            pos += T
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return FlatData(tasks=list(tasks), obs=((obs - mean) / std).astype(np.float32),
                    next_obs=((cat["no"] - mean) / std).astype(np.float32), actions=cat["a"].astype(np.float32),
                    rewards=cat["r"].astype(np.float32), rtg=cat["rtg"].astype(np.float32),
                    task_id=cat["tid"].astype(np.int64), ep_start=cat["s"].astype(np.int64),
                    ep_end=cat["e"].astype(np.int64), timestep=cat["ts"].astype(np.int64), mean=mean, std=std,
                    episodes=eps_idx, ep_return=np.asarray(rets))


def goals(fd: FlatData, idx: np.ndarray, H: int) -> np.ndarray:
    """g_t = norm(s_{t+H}) - norm(s_t) for windows starting at `idx` (clipped at the episode end)."""
    j = goal_end_index(idx, fd.ep_end[idx], H)
    return fd.next_obs[j] - fd.obs[idx]


def windows(fd: FlatData, idx: np.ndarray, H: int):
    """In-skill windows starting at `idx`: states (B,H,ds), actions (B,H,da), mask (B,H) (0 past the end)."""
    k = np.arange(H)[None, :]
    pos = idx[:, None] + k
    mask = pos < fd.ep_end[idx][:, None]
    pos = np.where(mask, pos, idx[:, None])
    s = np.where(mask[..., None], fd.obs[pos], 0.0).astype(np.float32)
    a = np.where(mask[..., None], fd.actions[pos], 0.0).astype(np.float32)
    return s, a, mask.astype(np.float32)


def balanced_indices(codes: np.ndarray, per_code: int, rng: np.random.Generator) -> np.ndarray:
    """Class-balanced batch (Sec. 4.2): `per_code` window starts for every used code, uniformly within it."""
    out = []
    for c in np.unique(codes):
        members = np.flatnonzero(codes == c)
        out.append(rng.choice(members, size=per_code, replace=True))
    return np.concatenate(out)


def skill_sequences(fd: FlatData, codes: np.ndarray, ends: np.ndarray, L: int, H: int, rtg_scale: float):
    """High-level training sequences: L skill steps with stride H ending at step `ends`, left-padded.

    Timesteps are skill-step indices t // H, as the official batcher (`timesteps = si_idx // interval_length`)
    and its evaluation loop (`timesteps // skill_length`) use them.
    Returns states (B,L,ds), codes (B,L), rtg (B,L,1) scaled, timesteps (B,L), mask (B,L)."""
    offs = (np.arange(L) - (L - 1)) * H  # ..., -2H, -H, 0
    pos = ends[:, None] + offs[None, :]
    mask = pos >= fd.ep_start[ends][:, None]
    pos = np.where(mask, pos, ends[:, None])
    s = np.where(mask[..., None], fd.obs[pos], 0.0).astype(np.float32)
    c = np.where(mask, codes[pos], 0).astype(np.int64)
    r = np.where(mask, fd.rtg[pos] / rtg_scale, 0.0).astype(np.float32)[..., None]
    ts = np.where(mask, fd.timestep[pos] // H, 0).astype(np.int64)
    return s, c, r, ts, mask.astype(np.float32)


def prompt_sequence(fd: FlatData, codes: np.ndarray, ep: tuple[int, int, int], P: int, H: int, rtg_scale: float):
    """A trajectory prompt (Prompt-DT, official `get_prompt`): the LAST P skill steps (stride H) of episode
    `ep`, i.e. steps T - P*H, ..., T - H, left-padded when the episode has fewer than P skill steps.
    Timesteps are skill-step indices t // H."""
    _, b, e = ep
    T = e - b
    n = min(P, T // H) if T >= H else 1
    first = T - n * H if T >= H else T - 1
    loc = first + np.arange(n) * H
    pad = P - n
    mask = np.concatenate([np.zeros(pad), np.ones(n)]).astype(np.float32)
    pos = np.concatenate([np.full(pad, b), b + loc]).astype(np.int64)
    m = mask > 0
    s = np.where(m[:, None], fd.obs[pos], 0.0).astype(np.float32)
    c = np.where(m, codes[pos], 0).astype(np.int64)
    r = np.where(m, fd.rtg[pos] / rtg_scale, 0.0).astype(np.float32)[:, None]
    ts = np.where(m, fd.timestep[pos] // H, 0).astype(np.int64)
    return s, c, r, ts, mask
