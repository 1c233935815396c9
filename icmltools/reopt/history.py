"""History: solution files, solving history instances (plain SCIP, cached by file hash) and the
process pool used for independent solves (`--jobs`)."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from icmltools.core.errors import BadInputError
from icmltools.core.files import file_sha256
from icmltools.core.jsonio import atomic_write_json, atomic_write_text, output_errors

from .milp import check_instance_path
from .options import SolveConfig, check_budget

CACHE_VERSION = 3  # bumped when the same (file, limit, seed) may solve differently (2: SCIP seed via derive;
#                   3: every outcome cached, deterministic budgets, variable names kept)

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """`$ICML_REOPT_CACHE`, else `<runs root>/_cache/reopt` (next to the run folders)."""
    env = os.environ.get("ICML_REOPT_CACHE")
    if env:
        return Path(env)
    from icmltools.core.runs import runs_root

    return runs_root() / "_cache" / "reopt"


def read_solution_file(path) -> dict:
    """A solution as {variable name: value}: SCIP's .sol text format or a JSON object."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p}: no such solution file")
    text = p.read_text(errors="replace")
    if text.lstrip().startswith("{"):
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadInputError(f"{p}: invalid JSON ({e})") from None
        d = d.get("values", d)
        try:
            return {str(k): float(v) for k, v in d.items()}
        except (TypeError, ValueError):
            raise BadInputError(f"{p}: JSON solution must map variable names to numbers") from None
    sol = {}
    for ln, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        low = s.lower()
        if not s or s.startswith("#") or low.startswith("solution status") or low.startswith("objective value") \
                or low.startswith("=obj="):
            continue
        parts = s.split()
        if len(parts) < 2:
            raise BadInputError(f"{p}: line {ln} is not '<name> <value>'")
        try:
            sol[parts[0]] = float(parts[1])
        except ValueError:
            raise BadInputError(f"{p}: line {ln}: value {parts[1]!r} is not a number") from None
    if not sol:
        raise BadInputError(f"{p}: no variable values found")
    return sol


def check_writable(path, folder: bool = False) -> None:
    """Fail before any work if `path` (a file, or with `folder` a folder) could not be written: 'cannot
    write PATH: reason' (OutputError), as the writer would say after the work."""
    import errno

    p = Path(path)
    with output_errors(path):
        if p.is_dir() != folder and p.exists():
            raise (IsADirectoryError(errno.EISDIR, "is a directory") if not folder
                   else NotADirectoryError(errno.ENOTDIR, "not a directory"))
        parent = p if folder else p.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied")


def write_solution_file(path, names, values, objective) -> None:
    """SCIP .sol text format (readable by SCIP's readSol and by `read_solution_file`)."""
    lines = ["solution status: feasible", f"objective value: {objective!r}"]
    lines += [f"{n} {float(v)!r}" for n, v in zip(names, values) if v != 0]
    atomic_write_text(path, "\n".join(lines) + "\n")


def _worker_init() -> None:
    """In a `--jobs` worker: ignore SIGINT and let SCIP ignore it too; the parent stops its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from . import budget

    budget.CATCH_CTRL_C = False


def _indexed(args):
    fn, i, item = args
    return i, fn(item)


class SolutionSet:
    """Solution files written into `folder` all or none: each goes to a hidden temporary file first, and
    `commit` renames them all at the end; `discard` (on an error or Ctrl-C) removes the temporaries and a
    folder this set created."""

    def __init__(self, folder):
        check_writable(folder, folder=True)
        self.folder = Path(folder)
        self._created = not self.folder.exists()
        self._pending: list = []

    def add(self, name: str, names, values, objective) -> str:
        final = self.folder / name
        with output_errors(final):
            self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{name}.part"
        self._pending.append((tmp, final))
        write_solution_file(tmp, names, values, objective)
        return str(final)

    def commit(self) -> list:
        done = []
        for tmp, final in self._pending:
            with output_errors(final):
                os.replace(tmp, final)
            done.append(str(final))
        self._pending = []
        return done

    def discard(self) -> None:
        for tmp, _ in self._pending:
            tmp.unlink(missing_ok=True)
        self._pending = []
        if self._created and self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()


def pool_map(fn, items: list, jobs: int, progress=None, desc: str = "solving", on_result=None) -> list:
    """`[fn(x) for x in items]`, in `jobs` worker processes when jobs > 1 (order kept); `on_result(r)` is
    called in this process with each result as it comes. On Ctrl-C (or any error) the workers are terminated
    at once, so no solve goes on after it."""
    out = [None] * len(items)
    if jobs <= 1 or len(items) <= 1:
        for i, it in enumerate(items):
            out[i] = fn(it)
            if on_result:
                on_result(out[i])
            if progress:
                progress(desc, i + 1, len(items))
        return out
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    pool = ctx.Pool(min(jobs, len(items)), initializer=_worker_init)
    try:
        for done, (i, res) in enumerate(pool.imap_unordered(_indexed, [(fn, i, it) for i, it in enumerate(items)]), 1):
            out[i] = res
            if on_result:
                on_result(res)
            if progress:
                progress(desc, done, len(items))
    except BaseException:
        pool.terminate()
        pool.join()
        raise
    pool.close()
    pool.join()
    return out


@dataclass(frozen=True)
class HistoryLimit:
    """How each history instance is solved with plain SCIP: `time_limit` wall seconds, or a deterministic
    `budget` of `kind` under that wall cap."""

    time_limit: float
    kind: str = "wall"
    budget: float | None = None

    def validate(self) -> HistoryLimit:
        if not (self.time_limit > 0) or not math.isfinite(self.time_limit):
            raise BadInputError(f"must be a positive number of seconds, got {self.time_limit}", param="history_limit")
        check_budget(self.kind, self.budget, "history_budget")  # also checks the kind
        return self

    def key(self) -> str:
        t = f"t{self.time_limit:g}"
        return t if self.kind == "wall" else f"{self.kind}{self.budget:g}_{t}"

    def describe(self) -> str:
        return f"{self.time_limit:g} s" if self.kind == "wall" else \
            f"{self.kind} {self.budget:g} (wall cap {self.time_limit:g} s)"

    def config(self, seed: int) -> SolveConfig:
        return SolveConfig(time_limit=self.time_limit, seed=seed, limit_kind=self.kind, budget=self.budget)


def _cache_file(cache_dir, sha: str, limit: HistoryLimit, seed: int) -> Path | None:
    return Path(cache_dir) / f"{sha}_{limit.key()}_s{seed}_v{CACHE_VERSION}.json" if cache_dir else None


def _read_cache(cfile: Path | None) -> dict | None:
    """The entry of `cfile`: held by this command (`cache_held`; also in its --jobs workers, forked after it
    was made), else on disk; None if neither."""
    if cfile is not None and _held and cfile in _held:
        return dict(_held[cfile], cached=True)
    if cfile is None or not cfile.is_file():
        return None
    try:
        d = json.loads(cfile.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    d["cached"] = True
    return d


def _history_job(args):
    """Solve one history instance with plain SCIP (or take its cache entry): (entry, its cache file or None
    when it came from the cache or there is none). Every outcome, with or without a solution, is an entry
    (status and limit in it, the limit in the key), so a rerun does not spend the limit again; the parent
    writes it (`_store`). An interrupted solve raises: no entry."""
    path, limit, seed, cache_dir, expect = args
    from .predict import check_names
    from .solve import solve_history_instance

    sha = file_sha256(path)
    cfile = _cache_file(cache_dir, sha, limit, seed)
    d = _read_cache(cfile)
    if d is not None:
        if expect is not None:
            check_names(expect[0], d["names"], f"history instance {path}", expect[1])
        return d, None
    res = solve_history_instance(path, limit.config(seed), *(expect or (None, "")))
    d = {"path": str(path), "sha256": sha, "limit": limit.describe(), "status": res.status,
         "objective": res.objective, "feasible": res.feasible, "values": res.solution(), "names": res.names,
         "wall_cap_hit": bool(res.details.get("wall_cap_hit", False)), "cached": False}
    return d, cfile


_held: dict | None = None  # {cache file: entry} held back by `cache_held`, written when its block ends


@contextlib.contextmanager
def cache_held(interrupted=None):
    """History-cache entries made inside the block are written when it ends, and not at all when it ends
    with Ctrl-C (KeyboardInterrupt, or `interrupted()` true at its end: a Ctrl-C something swallowed): an
    interrupted command leaves nothing cached, not even the solves that finished before the signal. On an
    error they are written (a failed run does not cost the next one its finished solves). Nested blocks
    defer to the outermost."""
    global _held
    if _held is not None:
        yield
        return
    _held = {}
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException:
        _write_held()
        raise
    else:
        if interrupted is None or not interrupted():
            _write_held()
    finally:
        _held = None


def _write_held() -> None:
    for cfile, d in (_held or {}).items():
        _write_entry(cfile, d)


def _store(cfile: Path | None, d: dict) -> None:
    """Write a new cache entry now, or hold it for the end of a `cache_held` block."""
    if cfile is None:
        return
    if _held is not None:
        _held[cfile] = d
    else:
        _write_entry(cfile, d)


def _write_entry(cfile: Path, d: dict) -> None:
    try:
        atomic_write_json(cfile, d, indent=None)
    except OSError as e:  # a read-only cache is not fatal
        log.warning("could not write history cache %s: %s", cfile, e)


def uncached(paths: list, limit: HistoryLimit, seed: int, cache_dir) -> list:
    """The history instances among `paths` that would be solved (not in the cache)."""
    return [p for p in paths if _read_cache(_cache_file(cache_dir, file_sha256(p), limit, seed)) is None]


def solve_history(paths: list, limit: HistoryLimit | float, seed: int = 0, cache_dir=None, jobs: int = 1,
                  progress=None, notice=None, expect: tuple | None = None) -> list:
    """Solve each history instance with plain SCIP under `limit` (a HistoryLimit, or wall seconds), cached by
    sha256 of the file, the limit and the seed. Returns one dict per path: status, objective, values (or
    None), names, cached. `notice(n, limit, seconds)` is told, before they start, how many solves will run
    and how long they may take at most. `expect`: (variable names, label) every instance must have (checked
    before its solve, or against its cache entry)."""
    limit = (limit if isinstance(limit, HistoryLimit) else HistoryLimit(float(limit))).validate()
    for p in paths:
        check_instance_path(p)
    todo = uncached(paths, limit, seed, cache_dir)
    if todo and notice is not None:
        rounds = math.ceil(len(todo) / max(1, min(jobs, len(todo))))
        notice(len(todo), limit, rounds * limit.time_limit)
    done = pool_map(_history_job, [(str(p), limit, int(seed), str(cache_dir) if cache_dir else None, expect)
                                   for p in paths], jobs, progress, "history", on_result=lambda r: _store(r[1], r[0]))
    return [d for d, _ in done]
