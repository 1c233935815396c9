"""History: solution files, solving history instances (plain SCIP, cached by file hash) and the
process pool used for independent solves (`--jobs`)."""
from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import signal
from pathlib import Path

from icmltools.core.errors import BadInputError
from icmltools.core.files import file_sha256
from icmltools.core.jsonio import atomic_write_json, atomic_write_text, output_errors

from .milp import check_instance_path
from .options import SolveConfig

CACHE_VERSION = 2  # bumped when the same (file, limit, seed) may solve differently (2: SCIP seed via derive)

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
    from . import solve

    solve.CATCH_CTRL_C = False


def _indexed(args):
    fn, i, item = args
    return i, fn(item)


def pool_map(fn, items: list, jobs: int, progress=None, desc: str = "solving") -> list:
    """`[fn(x) for x in items]`, in `jobs` worker processes when jobs > 1 (order kept). On Ctrl-C (or any
    error) the workers are terminated at once, so no solve goes on (or writes a cache entry) after it."""
    out = [None] * len(items)
    if jobs <= 1 or len(items) <= 1:
        for i, it in enumerate(items):
            out[i] = fn(it)
            if progress:
                progress(desc, i + 1, len(items))
        return out
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    pool = ctx.Pool(min(jobs, len(items)), initializer=_worker_init)
    try:
        for done, (i, res) in enumerate(pool.imap_unordered(_indexed, [(fn, i, it) for i, it in enumerate(items)]), 1):
            out[i] = res
            if progress:
                progress(desc, done, len(items))
    except BaseException:
        pool.terminate()
        pool.join()
        raise
    pool.close()
    pool.join()
    return out


def _history_job(args):
    path, time_limit, seed, cache_dir = args
    from .solve import solve_one

    sha = file_sha256(path)
    key = f"{sha}_t{time_limit:g}_s{seed}_v{CACHE_VERSION}.json"
    cfile = Path(cache_dir) / key if cache_dir else None
    if cfile is not None and cfile.is_file():
        try:
            d = json.loads(cfile.read_text())
            d["cached"] = True
            return d
        except (OSError, json.JSONDecodeError):
            pass
    res = solve_one("scip", path, [], SolveConfig(time_limit=time_limit, seed=seed))
    d = {"path": str(path), "sha256": sha, "time_limit": time_limit, "status": res.status,
         "objective": res.objective, "feasible": res.feasible, "values": res.solution(), "cached": False}
    if cfile is not None and res.feasible:
        try:
            atomic_write_json(cfile, d, indent=None)
        except OSError as e:  # a read-only cache is not fatal
            log.warning("could not write history cache %s: %s", cfile, e)
    return d


def solve_history(paths: list, time_limit: float, seed: int = 0, cache_dir=None, jobs: int = 1,
                  progress=None) -> list:
    """Solve each history instance with plain SCIP under `time_limit` (cached by sha256 of the file,
    the limit and the seed). Returns one dict per path: status, objective, values (or None), cached."""
    if not (time_limit > 0) or not math.isfinite(time_limit):
        raise BadInputError(f"must be a positive number of seconds, got {time_limit}", param="history_limit")
    for p in paths:
        check_instance_path(p)
    return pool_map(_history_job, [(str(p), float(time_limit), int(seed), str(cache_dir) if cache_dir else None)
                                   for p in paths], jobs, progress, "history")
