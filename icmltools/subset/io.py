"""Reading feature matrices and labels, with validation that names the file at fault.

Feature files hold one 2-D array: `.npy` (memory-mapped, so a 3 GB matrix costs no RAM until read),
`.npz` (one array, or the key given as `file.npz:key`), `.pt` (a tensor, or a dict with one tensor),
`.safetensors` (one tensor, or `file.safetensors:key`). Labels: `.npy` (1-D), or a column of a
CSV/TSV/text file given as `file.csv:column` (name or 0-based index; default: the last column).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError, OutputError
from icmltools.core.files import check_input_file
from icmltools.core.jsonio import apply_umask, output_errors
from icmltools.core.table import read_column

FEATURE_SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".safetensors")


def split_key(spec: str) -> tuple[Path, str | None]:
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


def _npy_header(p: Path) -> None:
    """Check a `.npy` file's header before numpy reads it: a file that is not `.npy` at all, an array of
    Python objects (pickled) or a truncated file each get a message that says so (numpy's own ones talk
    about pickles and mmap lengths)."""
    fmt = np.lib.format
    with open(p, "rb") as fh:
        try:
            version = fmt.read_magic(fh)
        except ValueError:
            raise BadInputError(f"{p}: not a .npy file (no NPY header; written with np.save?)") from None
        readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
        if version not in readers:
            return  # a newer format: numpy checks it
        try:
            shape, _, dtype = readers[version](fh)
        except ValueError as e:
            raise BadInputError(f"{p}: corrupt .npy header ({str(e)[:120]})") from None
        start = fh.tell()
    if dtype.hasobject:
        raise BadInputError(f"{p}: holds Python objects (dtype {dtype}), not numbers")
    need = start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    have = p.stat().st_size
    if have < need:
        raise BadInputError(f"{p}: truncated: its header says shape {tuple(shape)} {dtype} ({need} bytes) but the "
                            f"file holds {have} bytes (not fully written?)")


def _read_npy(p: Path, key, mmap: bool):
    _npy_header(p)
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


def load_array(spec: str | os.PathLike, mmap: bool = True) -> np.ndarray:
    """Load the one array of a `.npy`/`.npz`/`.pt`/`.safetensors` file (`FILE:KEY` picks one of several);
    `.npy` files are memory-mapped (read-only). Any shape; errors name the file."""
    p, key = split_key(str(spec))
    check_input_file(p)
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise BadInputError(f"{p}: unsupported feature file type {p.suffix.lower()!r}; use one of "
                            f"{', '.join(FEATURE_SUFFIXES)}")
    try:
        return reader(p, key, mmap)
    except BadInputError:
        raise
    except (ValueError, OSError, EOFError, KeyError, RuntimeError) as e:
        raise BadInputError(f"{p}: cannot read feature array ({type(e).__name__}: {str(e)[:200]})") from e


def load_features(spec: str | os.PathLike, mmap: bool = True) -> np.ndarray:
    """Load one 2-D float feature matrix (N, d). `.npy` files are memory-mapped (read-only)."""
    return _check_matrix(load_array(spec, mmap), split_key(str(spec))[0])


def load_inputs(spec: str | os.PathLike, what: str = "inputs") -> np.ndarray:
    """A target model's inputs (N, ...) read into memory: numeric, at least 2-D, finite (row named)."""
    p = split_key(str(spec))[0]
    arr = load_array(spec, mmap=False)
    if arr.ndim < 2 or arr.shape[0] < 1:
        raise BadInputError(f"{p}: {what} must be an array (N, ...) with one row per sample, got shape "
                            f"{tuple(arr.shape)}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise BadInputError(f"{p}: {what} must be numeric, got dtype {arr.dtype}")
    arr = np.asarray(arr, dtype=np.float32) if arr.dtype == np.float16 else np.asarray(arr)
    check_finite(arr, str(p))
    return arr


def load_labels(spec: str | os.PathLike) -> np.ndarray:
    """Load labels (N,) from `.npy` or a column of a CSV/TSV/text file (`file.csv:column`)."""
    p, key = split_key(str(spec))
    check_input_file(p)
    suffix = p.suffix.lower()
    if suffix == ".npy":
        _npy_header(p)
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
    try:
        with open(p, newline="", encoding="utf-8-sig") as fh:
            text = fh.read()
    except UnicodeDecodeError:
        raise BadInputError(f"{p}: not a UTF-8 text file (labels are .npy or a CSV/TSV/text column)") from None
    vals, lines = read_column(text, str(p), key, tab=suffix == ".tsv")
    _check_text_rows(text, vals, lines, p)
    return _text_labels(vals, lines, p)


def _check_text_rows(text: str, vals: list, lines: list, p: Path) -> None:
    """A blank line between labels or an empty cell would shift every later row against the features."""
    for v, n in zip(vals, lines):
        if v == "":
            raise BadInputError(f"{p}: line {n}: empty label (every row needs one)")
    used = set(lines)
    rows = text.splitlines()
    for n in range(lines[0], lines[-1] + 1):
        if n not in used and not rows[n - 1].strip():
            raise BadInputError(f"{p}: line {n} is blank between labels (a missing label? every row needs one)")


MISSING = frozenset({"na", "n/a", "nan", "null", "none", "?", "-", "inf", "+inf", "-inf", "infinity"})


def _text_labels(vals: list, lines: list, p: Path) -> np.ndarray:
    """Integers when every value is one (also `3.0`); otherwise strings (class names). A missing-value marker
    (NA, NaN, null, inf, ...) is refused with its line: it is not a class."""
    for v, n in zip(vals, lines):
        if v.lower() in MISSING:
            raise BadInputError(f"{p}: line {n}: label {v!r} is a missing or non-finite value, not a class")
    if all(_is_int(v) for v in vals):
        return np.asarray([int(v) for v in vals], dtype=np.int64)
    nums = [_float(v) for v in vals]
    if all(x is not None and abs(x) < 2**53 and x == round(x) for x in nums):
        return np.asarray(nums, dtype=np.float64).astype(np.int64)
    return np.asarray(vals)


def _is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False


def _float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def encode_labels(labels: np.ndarray, name: str = "labels") -> tuple[np.ndarray, list]:
    """Map arbitrary labels to 0..C-1 (sorted unique order); returns (codes int64, class names)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise BadInputError(f"{name}: labels must be 1-D, got shape {labels.shape}")
    if np.issubdtype(labels.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(labels))
        if len(bad):
            raise BadInputError(f"{name}: label {int(bad[0])} (0-based row) is {labels[bad[0]]}; labels must be "
                                f"finite ({len(bad)} are not)")
        frac = np.flatnonzero(labels != np.round(labels))
        if len(frac):
            raise BadInputError(f"{name}: labels must be integers or strings, got non-integer floats (row "
                                f"{int(frac[0])}: {labels[frac[0]]})")
        labels = labels.astype(np.int64)
    elif not (np.issubdtype(labels.dtype, np.integer) or labels.dtype.kind in "USb"):
        raise BadInputError(f"{name}: labels must be integers or strings, got dtype {labels.dtype}")
    classes, codes = np.unique(labels, return_inverse=True)
    return codes.astype(np.int64).reshape(-1), [c.item() if hasattr(c, "item") else c for c in classes]


def validate(views: list, labels: np.ndarray, names: list[str], classes: list | None = None) -> None:
    """Row counts agree across views and labels; at least two classes; every class has at least two samples."""
    n = len(labels)
    for v, nm in zip(views, names):
        if v.shape[0] != n:
            raise BadInputError(f"{nm}: {v.shape[0]} rows but the labels have {n} entries; "
                                "every feature file and the labels must share the same row order and count")
    counts = np.bincount(labels)
    if len(counts) < 2:
        what = f" ({classes[0]!r})" if classes else ""
        raise BadInputError(f"labels: a single class{what} in all {n} rows; selection ranks samples against "
                            "the other classes' means (wrong labels column?)")
    if np.any(counts < 2):
        bad = int(np.flatnonzero(counts < 2)[0])
        what = f"class {classes[bad]!r}" if classes is not None else f"class index {bad}"
        raise BadInputError(f"labels: {what} has {int(counts[bad])} sample; every class needs at least "
                            "two samples for class means and ranks (a CSV header? name the column as FILE:COLUMN)")


def nonfinite_error(name: str, row: int, values) -> BadInputError:
    """`NAME: row R holds NaN or inf (column C: nan)` for the first non-finite entry of row R (`values`)."""
    values = np.asarray(values).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(values))
    where = f" (column {int(bad[0])}: {values[bad[0]]})" if len(bad) else ""
    return BadInputError(f"{name}: row {row} holds NaN or inf{where}")


def check_finite(view: np.ndarray, name: str, chunk: int = 65536) -> None:
    """Chunked NaN/inf scan (memory-mapped files are read once, chunk by chunk); the error names the file,
    the row and the column."""
    for s in range(0, view.shape[0], chunk):
        block = np.asarray(view[s:s + chunk])
        if not np.all(np.isfinite(block)):
            r = int(np.flatnonzero(~np.all(np.isfinite(block.reshape(len(block), -1)), axis=1))[0])
            raise nonfinite_error(name, s + r, block[r])


class StagedOutputs:
    """All-or-none output files (STYLE 15). Entering reserves a temporary file next to every target (so an
    unwritable path or a missing folder fails before any work, with `cannot write PATH: reason`); the work
    fills them (`open(path)`); leaving without error renames every one onto its target, together at the end.
    On an error or Ctrl-C the temporary files are removed and no target is touched."""

    def __init__(self, paths):
        self.paths = [Path(p) for p in paths]
        self._tmp: dict[Path, Path] = {}

    def __enter__(self) -> "StagedOutputs":
        try:
            for p in self.paths:
                self._tmp[p] = _reserve(p)
        except BaseException:
            self._discard()
            raise
        return self

    def open(self, path):
        """The binary file handle to write `path`'s content into (its temporary file)."""
        return open(self._tmp[Path(path)], "wb")

    def _discard(self) -> None:
        for t in self._tmp.values():
            with contextlib.suppress(FileNotFoundError):
                t.unlink()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._discard()
            return False
        try:
            for p, t in self._tmp.items():
                apply_umask(t)
                with output_errors(p):
                    os.replace(t, p)
        except BaseException:
            self._discard()
            raise
        return False


def _reserve(path: Path) -> Path:
    """A temporary file in `path`'s folder (the folder must exist; `path` must not be a folder)."""
    if not path.parent.exists():
        raise OutputError(f"cannot write {path}: folder {path.parent} does not exist")
    with output_errors(path):
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    return Path(tmp)
