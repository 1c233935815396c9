"""NaN-safe JSON and atomic file writes.

`to_jsonable` converts numpy/torch scalars and arrays, paths, dataclasses, sets and tuples; non-finite
floats become `None` (jq silently rewrites NaN and Infinity), and `dumps` uses `allow_nan=False` so a
missed one fails loudly instead of producing invalid JSON.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

_UNCONVERTED = object()


def _array_like(obj: Any) -> Any:
    """numpy / torch values as plain Python (or `_UNCONVERTED`)."""
    mod = type(obj).__module__
    if mod == "numpy" or mod.startswith("numpy."):
        import numpy as np

        if isinstance(obj, np.ndarray):
            return obj.tolist()
        if isinstance(obj, np.dtype):
            return str(obj)
        if isinstance(obj, np.generic):
            return obj.item()
    if mod.startswith("torch"):
        import torch

        if isinstance(obj, torch.Tensor):
            return obj.detach().cpu().tolist()
        if isinstance(obj, (torch.dtype, torch.device)):
            return str(obj)
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return obj.item()
        except Exception:
            pass
    return _UNCONVERTED


def to_jsonable(obj: Any) -> Any:
    """Recursively convert `obj` to plain JSON types; non-finite floats become None."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    plain = _array_like(obj)
    return str(obj) if plain is _UNCONVERTED else to_jsonable(plain)


def dumps(obj: Any, indent: int | None = None) -> str:
    """Serialise `obj` as strict JSON (no NaN/Infinity tokens)."""
    sep = (",", ": ") if indent else (",", ":")
    return json.dumps(to_jsonable(obj), indent=indent, separators=sep, allow_nan=False)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path in the same folder as `path`; rename it onto `path` on success.

    On any exception the temporary file is removed and `path` (if it existed) is left intact.
    Use it for writers that want a file name (torch.save, safetensors, PySCIPOpt).
    """
    path = Path(path)
    with output_errors(path):
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix or ".tmp" + path.suffix)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        apply_umask(tmp_path)  # mkstemp makes 0600; give the result normal permissions
        with output_errors(path):
            os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def output_errors(path: str | os.PathLike) -> Iterator[None]:
    """OS errors while creating an output become one `cannot write PATH: reason` error naming the
    user's path (not a temporary file)."""
    try:
        yield
    except OSError as e:
        from .errors import OutputError

        reason = (e.strerror or type(e).__name__).lower()
        raise OutputError(f"cannot write {path}: {reason}") from None


def apply_umask(path: str | os.PathLike) -> None:
    """Give a finished output (a file, or a folder and everything in it) the permissions of a normally created
    one: temp files and folders (mkstemp, mkdtemp) are private (0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    p = Path(path)
    for q in ([p, *p.rglob("*")] if p.is_dir() else [p]):
        os.chmod(q, (0o777 if q.is_dir() else 0o666) & ~mask)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, dumps(obj, indent=indent) + "\n")
