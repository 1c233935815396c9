"""Run directories: `--out DIR`, or `$ICML_RUNS_DIR/<command>/<timestamp>/` (default `runs/`)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from .errors import BadInputError
from .jsonio import output_errors


def runs_root() -> Path:
    return Path(os.environ.get("ICML_RUNS_DIR") or "runs")


def make_run_dir(command: str, out: str | os.PathLike | None = None, allow_existing: bool = False) -> Path:
    """Create and return the run directory; never silently reuse a non-empty one.

    `allow_existing=True` is for resuming: an existing folder is returned as it is.
    """
    if out is not None:
        d = Path(out)
        if d.exists() and not d.is_dir():
            raise BadInputError(f"{d}: exists and is not a directory", param="out")
        if d.exists() and any(d.iterdir()) and not allow_existing:
            raise BadInputError(f"{d}: directory is not empty", param="out",
                              hint="choose a new folder (or resume where supported)")
        with output_errors(d):
            d.mkdir(parents=True, exist_ok=True)
        return d
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = runs_root() / command
    d = base / stamp
    i = 1
    while d.exists():
        d = base / f"{stamp}-{i}"
        i += 1
    with output_errors(d):
        d.mkdir(parents=True)
    return d
