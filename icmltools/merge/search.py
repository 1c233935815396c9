"""The lambda search of the merge engine and the user's evaluation command (shared by every merging command).

* :func:`search` evaluates a grid in order with any evaluator (built in, or :class:`CommandEvaluator`) and
  applies a selection rule: :func:`select_lambda` (NegMerge's official ``find_optimal_coef`` with
  ``minimize=True``: skip a lambda whose retain accuracy is below ``ratio x`` the original model's, pick the
  lowest forget accuracy, the first wins ties) or :func:`select_max` (the largest score, first wins ties).
* :func:`search_files` runs the search on checkpoints: one temporary checkpoint per lambda, written from the
  merged task vector with :func:`icmltools.merge.engine.apply_task_vector`, evaluated, deleted.
"""
from __future__ import annotations

import json
import logging
import math
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from icmltools.core.errors import BadInputError, RuntimeFailure

log = logging.getLogger(__name__)


def parse_grid(spec: str) -> list[float]:
    """`"0:5:0.25"` (start:stop:step, stop included) or `"0,0.5,1,2"` -> sorted unique floats."""
    s = (spec or "").strip()
    if not s:
        raise BadInputError("the lambda grid is empty", param="lam_grid")
    try:
        if ":" in s:
            parts = [float(x) for x in s.split(":")]
            if len(parts) != 3:
                raise ValueError
            a, b, step = parts
            if not all(math.isfinite(x) for x in parts):
                raise BadInputError(f"{spec!r}: values must be finite numbers", param="lam_grid")
            if step <= 0 or b < a:
                raise BadInputError(f"{spec!r}: need start <= stop and step > 0", param="lam_grid")
            q = (b - a) / step + 1e-9  # inf when it overflows: compared before any int conversion
            n = int(math.floor(q)) + 1 if q < 10_000 else None
            if n is None or n > 10_000:
                raise BadInputError(f"{spec!r}: more than 10000 points", param="lam_grid")
            vals = [round(a + i * step, 12) for i in range(n)]
        else:
            vals = [float(x) for x in s.split(",") if x.strip()]
    except BadInputError:
        raise
    except ValueError:
        raise BadInputError(f"{spec!r}: use start:stop:step or a comma list of numbers", param="lam_grid") from None
    if not vals or not all(math.isfinite(v) for v in vals):
        raise BadInputError(f"{spec!r}: values must be finite numbers", param="lam_grid")
    return sorted(set(vals))


@dataclass
class Selection:
    lam: float | None
    index: int | None
    feasible: bool
    threshold: float


def select_lambda(rows: Sequence[dict], original_retain: float, ratio: float = 0.95) -> Selection:
    """Lowest `forget_acc` among rows with `retain_acc >= ratio * original_retain` (first in order wins ties).

    When no row meets the constraint (possible only if lambda = 0 is not in the grid), the row with the
    highest retain accuracy is returned with ``feasible=False``.
    """
    thr = ratio * original_retain
    best_i = None
    for i, r in enumerate(rows):
        if r["retain_acc"] < thr:
            continue
        if best_i is None or r["forget_acc"] < rows[best_i]["forget_acc"]:
            best_i = i
    if best_i is not None:
        return Selection(rows[best_i]["lam"], best_i, True, thr)
    if not rows:
        return Selection(None, None, False, thr)
    j = max(range(len(rows)), key=lambda i: rows[i]["retain_acc"])
    return Selection(rows[j]["lam"], j, False, thr)


def search(evaluate: Callable[[float], dict], grid: Sequence[float], original_retain: float, ratio: float = 0.95,
           progress: Callable | None = None, desc: str = "lambda grid", patience: int = 0):
    """Evaluate the lambdas of `grid` in order; return (rows, Selection).

    `patience` > 0 stops after that many consecutive lambdas below the retain threshold (larger
    lambdas push the model further from the original; a speed-up, not in the official code, which
    evaluates the whole grid: patience 0).
    """
    rows = []
    thr = ratio * original_retain
    bad = 0
    for i, lam in enumerate(grid):
        m = dict(evaluate(lam))
        m["lam"] = float(lam)
        rows.append(m)
        if progress is not None:
            progress(desc, i + 1, len(grid))
        bad = bad + 1 if m["retain_acc"] < thr else 0
        if patience and bad >= patience:
            break
    return rows, select_lambda(rows, original_retain, ratio)


def select_max(rows: Sequence[dict], key: str = "score") -> Selection:
    """The row with the largest `key` (first in order wins ties); threshold unused (nan)."""
    best = None
    for i, r in enumerate(rows):
        if best is None or r[key] > rows[best][key]:
            best = i
    return Selection(None if best is None else rows[best]["lam"], best, best is not None, float("nan"))


def search_files(base, tau: dict, grid: Sequence[float], evaluate: Callable, work_dir, *, fmt: str = "same",
                 record: Callable[[float], dict] | None = None, tainted=(), sign: int = -1, skip_zero: bool = False,
                 at_zero: dict | None = None, rule: Callable[[list], Selection], progress: Callable | None = None,
                 patience: Callable[[dict], bool] | None = None, out_name: str = "merged", out_dtype: str | None = None):
    """Search lambda over `grid` on checkpoints: for each lambda, theta_0 + sign * lambda * tau is written (in
    `fmt`, floating tensors in `out_dtype` if given) to a temporary path under `work_dir`, `evaluate(path,
    label)` scores it, the file is deleted; `at_zero` (the base's scores, when known) stands for lambda = 0. `rule(rows)` picks the lambda; `patience(row)` says
    whether to stop after a row. Returns (rows, Selection); the temporary folder is removed in every case."""
    import shutil

    from .engine import apply_task_vector

    grid_dir = Path(work_dir) / ".lambda_grid"
    grid_dir.mkdir(parents=True, exist_ok=True)

    def one(lam):
        if lam == 0 and at_zero is not None:
            return dict(at_zero)
        p = grid_dir / out_name
        try:
            apply_task_vector(base, tau, lam, p, fmt=fmt, record=record(lam) if record else None,
                              tainted=tainted, param="lam_grid", sign=sign, skip_zero=skip_zero, out_dtype=out_dtype)
            return evaluate(p, label=f"the checkpoint for lambda = {lam:g}")
        finally:
            _remove_checkpoint(p)

    try:
        return run_grid(one, grid, rule, progress=progress, stop=patience)
    finally:
        shutil.rmtree(grid_dir, ignore_errors=True)


def run_grid(evaluate: Callable[[float], dict], grid: Sequence[float], rule: Callable[[list], Selection],
             progress: Callable | None = None, stop: Callable[[dict], bool] | None = None):
    """Evaluate the lambdas of `grid` in order (`evaluate(lam)` -> scores, built in or a command); `stop(row)`
    ends early; returns (rows, rule(rows)). Each row is the scores plus "lam"."""
    rows: list = []
    for i, lam in enumerate(grid):
        m = dict(evaluate(lam))
        m["lam"] = float(lam)
        rows.append(m)
        if progress is not None:
            progress("lambda grid", i + 1, len(grid))
        if stop is not None and stop(m):
            break
    return rows, rule(rows)


def _remove_checkpoint(p: Path) -> None:
    import shutil

    from icmltools.taskvec import sidecar_path

    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
        sidecar_path(p).unlink(missing_ok=True)


class CommandEvaluator:
    """Runs a user command on a checkpoint path and reads `{"forget_acc": x, "retain_acc": y, ...}` (the
    `fields` it requires; e.g. `("score",)`) from its stdout (the last line that parses as a JSON object). `{checkpoint}` in the command is replaced by
    the path; without it the path is appended as the last argument. No shell is involved. The program
    must exist when the evaluator is made (so a typo fails before any merge); every failure names the
    command, the checkpoint and, for a failed run, its exit status and last line of output."""

    def __init__(self, command: str, timeout: float | None = None, fields: Sequence[str] = ("forget_acc", "retain_acc")):
        try:
            self.argv = shlex.split(command)
        except ValueError as e:
            raise BadInputError(f"{command!r}: cannot parse ({e})", param="eval_cmd") from None
        if not self.argv:
            raise BadInputError("the evaluation command is empty", param="eval_cmd")
        if "{checkpoint}" not in self.argv[0] and shutil.which(self.argv[0]) is None:
            raise BadInputError(f"program {self.argv[0]!r} not found (or not executable)", param="eval_cmd")
        self.command = command
        self.timeout = timeout
        self.fields = tuple(fields)
        self.calls = 0

    def argv_for(self, path) -> list[str]:
        if any("{checkpoint}" in a for a in self.argv):
            return [a.replace("{checkpoint}", str(path)) for a in self.argv]
        return self.argv + [str(path)]

    def __call__(self, path, label: str | None = None) -> dict:
        """Scores of the checkpoint at `path`; `label` says which checkpoint in errors (default: the path)."""
        argv = self.argv_for(path)
        what = label or str(path)
        self.calls += 1
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout)
        except (FileNotFoundError, PermissionError):
            raise BadInputError(f"program {argv[0]!r} not found (or not executable)", param="eval_cmd") from None
        except OSError as e:
            raise BadInputError(f"{self.command!r}: cannot run ({e.strerror or e})", param="eval_cmd") from None
        except subprocess.TimeoutExpired:
            raise RuntimeFailure(f"{self.command!r} timed out after {self.timeout:g} s on {what}",
                                 param="eval_cmd") from None
        if p.returncode != 0:
            raise RuntimeFailure(f"{self.command!r} {_exit_words(p.returncode)} on {what}: {_tail(p)}",
                                 param="eval_cmd")
        return _scores(_last_json_object(p.stdout), f"{self.command!r} on {what}", self.fields)


def _exit_words(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def _tail(p: subprocess.CompletedProcess) -> str:
    """The last non-empty line of the command's stderr (else stdout), cut to 200 characters."""
    for stream in (p.stderr, p.stdout):
        lines = [ln.strip() for ln in (stream or "").splitlines() if ln.strip()]
        if lines:
            return lines[-1][:200]
    return "(no output)"


def _last_json_object(stdout: str) -> dict | None:
    """The last line of `stdout` that parses as a JSON object, else the whole output if it is one."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            cand = json.loads(line)
        except ValueError:
            continue
        if isinstance(cand, dict):
            return cand
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _scores(doc: dict | None, where, fields: Sequence[str] = ("forget_acc", "retain_acc")) -> dict:
    """The required `fields` (finite numbers) plus the other scalar fields of `doc`; `where` names the command
    and checkpoint in errors."""
    if doc is None:
        raise RuntimeFailure(f"{where}: printed no JSON object (expected {' and '.join(fields)})",
                             param="eval_cmd")
    out = {}
    for k in fields:
        v = doc.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RuntimeFailure(f"{where}: {k!r} missing or not a finite number (got {v!r})", param="eval_cmd")
        out[k] = float(v)
    for k, v in doc.items():
        if k not in out and isinstance(v, (int, float, str, bool)):
            out[k] = v
    return out
