"""Reading feature matrices and labels, with validation that names the file at fault.

Feature files hold one 2-D array: `.npy` (memory-mapped, so a 3 GB matrix costs no RAM until read),
`.npz` (one array, or the key given as `file.npz:key`), `.pt` (a tensor, or a dict with one tensor),
`.safetensors` (one tensor, or `file.safetensors:key`). Labels: `.npy` (1-D), or a column of a
CSV/TSV/text file given as `file.csv:column` (name or 0-based index; default: the last column).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.files import check_input_file
from icmltools.core.table import read_column

FEATURE_SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".safetensors")


def _split_key(spec: str) -> tuple[Path, str | None]:
    """`path[:key]` -> (path, key); a Windows-like drive letter is not treated as a key."""
    s = str(spec)
    if ":" in s and not Path(s).exists():
        head, _, key = s.rpartition(":")
        if head and Path(head).exists():
            return Path(head), key
    return Path(s), None


def _choose_key(keys: list, key: str | None, p: Path):
    """The one array key to read: the given one (checked) or the only one."""
    if key is not None:
        if key not in keys:
            raise BadInputError(f"{p}: no array named {key!r} (has: {', '.join(sorted(map(str, keys)))[:200]})")
        return key
    if len(keys) != 1:
        raise BadInputError(f"{p}: holds {len(keys)} arrays ({', '.join(sorted(map(str, keys)))[:200]}); "
                            f"name one as {p}:KEY")
    return keys[0]


def _read_npy(p: Path, key, mmap: bool):
    return np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)


def _read_npz(p: Path, key, mmap: bool):
    with np.load(p, allow_pickle=False) as z:
        return z[_choose_key(list(z.files), key, p)]


def _read_pt(p: Path, key, mmap: bool):
    import torch

    from icmltools.core.checkpoint import safe_torch_load

    obj = safe_torch_load(p)
    if isinstance(obj, dict):
        obj = obj[_choose_key(list(obj), key, p)]
    if not isinstance(obj, torch.Tensor):
        raise BadInputError(f"{p}: expected a tensor, got {type(obj).__name__}")
    return obj.detach().float().numpy() if obj.dtype in (torch.float16, torch.bfloat16) else obj.detach().numpy()


def _read_safetensors(p: Path, key, mmap: bool):
    from safetensors import safe_open

    try:
        with safe_open(str(p), framework="np") as f:
            return f.get_tensor(_choose_key(list(f.keys()), key, p))
    except BadInputError:
        raise
    except Exception as e:  # bf16 is not representable in numpy: go through torch
        if "bf16" not in str(e).lower() and "bfloat16" not in str(e).lower():
            raise BadInputError(f"{p}: corrupt or unreadable safetensors file ({str(e)[:200]})") from e
    from icmltools.core.checkpoint import load_safetensors

    tensors = load_safetensors(p)
    return tensors[_choose_key(list(tensors), key, p)].float().numpy()


_READERS = {".npy": _read_npy, ".npz": _read_npz, ".pt": _read_pt, ".pth": _read_pt,
            ".safetensors": _read_safetensors}


def _check_matrix(arr: np.ndarray, p: Path) -> np.ndarray:
    """A 2-D, non-empty, numeric matrix (float16 widened to float32)."""
    if arr.ndim != 2:
        raise BadInputError(f"{p}: features must be a 2-D array (N, d), got shape {tuple(arr.shape)}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise BadInputError(f"{p}: empty feature array of shape {tuple(arr.shape)}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise BadInputError(f"{p}: features must be numeric, got dtype {arr.dtype}")
    return arr.astype(np.float32) if arr.dtype == np.float16 else arr


def load_features(spec: str | os.PathLike, mmap: bool = True) -> np.ndarray:
    """Load one 2-D float feature matrix (N, d). `.npy` files are memory-mapped (read-only)."""
    p, key = _split_key(str(spec))
    check_input_file(p)
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise BadInputError(f"{p}: unsupported feature file type {p.suffix.lower()!r}; use one of "
                            f"{', '.join(FEATURE_SUFFIXES)}")
    try:
        arr = reader(p, key, mmap)
    except BadInputError:
        raise
    except (ValueError, OSError, EOFError, KeyError) as e:
        raise BadInputError(f"{p}: cannot read feature array ({type(e).__name__}: {str(e)[:200]})") from e
    return _check_matrix(arr, p)


def load_labels(spec: str | os.PathLike) -> np.ndarray:
    """Load labels (N,) from `.npy` or a column of a CSV/TSV/text file (`file.csv:column`)."""
    p, key = _split_key(str(spec))
    check_input_file(p)
    suffix = p.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(p, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise BadInputError(f"{p}: cannot read labels ({str(e)[:200]})") from e
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if arr.ndim != 1:
            raise BadInputError(f"{p}: labels must be a 1-D array, got shape {tuple(arr.shape)}")
        return arr
    # text: CSV / TSV / whitespace, one column (see core.table.read_column)
    with open(p, newline="", encoding="utf-8") as fh:
        text = fh.read()
    vals, _ = read_column(text, str(p), key, tab=suffix == ".tsv")
    if all(_is_int(v) for v in vals):
        return np.asarray([int(v) for v in vals], dtype=np.int64)
    return np.asarray(vals)


def _is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False


def encode_labels(labels: np.ndarray, name: str = "labels") -> tuple[np.ndarray, list]:
    """Map arbitrary labels to 0..C-1 (sorted unique order); returns (codes int64, class names)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise BadInputError(f"{name}: labels must be 1-D, got shape {labels.shape}")
    if np.issubdtype(labels.dtype, np.floating):
        if not np.all(np.isfinite(labels)):
            raise BadInputError(f"{name}: labels contain NaN or inf")
        if np.any(labels != np.round(labels)):
            raise BadInputError(f"{name}: labels must be integers or strings, got non-integer floats")
        labels = labels.astype(np.int64)
    classes, codes = np.unique(labels, return_inverse=True)
    return codes.astype(np.int64).reshape(-1), [c.item() if hasattr(c, "item") else c for c in classes]


def validate(views: list, labels: np.ndarray, names: list[str], classes: list | None = None) -> None:
    """Row counts agree across views and labels; every class has at least two samples."""
    n = len(labels)
    for v, nm in zip(views, names):
        if v.shape[0] != n:
            raise BadInputError(f"{nm}: {v.shape[0]} rows but the labels have {n} entries; "
                                "every feature file and the labels must share the same row order and count")
    counts = np.bincount(labels)
    if np.any(counts < 2):
        bad = int(np.flatnonzero(counts < 2)[0])
        what = f"class {classes[bad]!r}" if classes is not None else f"class index {bad}"
        raise BadInputError(f"labels: {what} has {int(counts[bad])} sample; every class needs at least "
                            "two samples for class means and ranks (a CSV header? name the column as FILE:COLUMN)")


def check_finite(view: np.ndarray, name: str, chunk: int = 65536) -> None:
    """Chunked NaN/inf scan (memory-mapped files are read once, chunk by chunk)."""
    for s in range(0, view.shape[0], chunk):
        block = np.asarray(view[s:s + chunk])
        if not np.all(np.isfinite(block)):
            bad = s + int(np.flatnonzero(~np.all(np.isfinite(block), axis=1))[0])
            raise BadInputError(f"{name}: row {bad} holds NaN or inf")
