"""Checks and hashes for input files, shared by every command that reads the user's files."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .errors import BadInputError


def check_input_file(path: str | os.PathLike, allow_empty: bool = False) -> Path:
    """Return `path` as a Path if it is an existing, readable, regular (and by default non-empty) file;
    otherwise raise `BadInputError` naming the file."""
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such file")
    if not p.is_file():
        raise BadInputError(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise BadInputError(f"{p}: not readable")
    if not allow_empty and p.stat().st_size == 0:
        raise BadInputError(f"{p}: file is empty")
    return p


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()
