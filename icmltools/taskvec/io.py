"""Checkpoint I/O for every task-vector method: lazy per-tensor readers and streaming writers.

Formats read (all without unpickling arbitrary code):

* ``.safetensors`` files, read lazily tensor by tensor with ``safetensors.safe_open``. The handle is
  reopened for each tensor, so the memory map of a file never keeps more than one tensor resident
  (keeping one handle open lets the kernel account the whole touched file to the process RSS).
* torch checkpoints (``.pt .pth .bin .ckpt``) loaded with ``weights_only=True`` (``mmap=True`` where
  the file is in the zip format, so tensors are paged in on use); a ``state_dict`` or ``model``
  wrapper key is unwrapped; failures go through :func:`icmltools.core.checkpoint.safe_torch_load`.
* Hugging Face style folders: ``model.safetensors.index.json`` (sharded safetensors),
  ``model.safetensors``, ``pytorch_model.bin.index.json`` (sharded torch) or ``pytorch_model.bin``.

Writers produce the base's format (or the one asked for) atomically: a ``.safetensors`` file is
streamed (header first, then each tensor as it is computed) so a merge never holds the whole output;
a torch file is collected then saved with :func:`icmltools.core.checkpoint.save_torch`; an HF folder
is built in a temporary sibling folder (same shard layout, index JSON, the base's other small files
such as ``config.json`` copied) and renamed into place. A JSON record of how the output was made goes
into the safetensors ``__metadata__`` (key ``icml``) and, for every format, into a ``<output>.json``
sidecar (``icml_record.json`` inside a folder).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from icmltools.core.checkpoint import SAFETENSORS_SUFFIXES, TORCH_SUFFIXES, safe_torch_load
from icmltools.core.files import check_input_file
from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import apply_umask, atomic_path, atomic_write_json, dumps

ST_INDEX = "model.safetensors.index.json"
ST_SINGLE = "model.safetensors"
PT_INDEX = "pytorch_model.bin.index.json"
PT_SINGLE = "pytorch_model.bin"
RECORD_KEY = "icml"

# safetensors dtype codes <-> torch dtype names (resolved lazily so this module imports without torch)
_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "U16": "uint16", "U32": "uint32", "U64": "uint64",
}


def _torch_dtype(code: str, where: str):
    import torch

    name = _ST_DTYPES.get(code)
    dt = getattr(torch, name, None) if name else None
    if dt is None:
        raise BadInputError(f"{where}: unsupported safetensors dtype {code!r}")
    return dt


def _st_code(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    for code, n in _ST_DTYPES.items():
        if n == name:
            return code
    raise BadInputError(f"dtype {dtype} cannot be written to safetensors")


def is_float_dtype(dtype) -> bool:
    """Task vectors are taken over floating tensors only; integer/bool buffers are copied from the base."""
    return bool(getattr(dtype, "is_floating_point", False))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: object  # torch.dtype
    shape: tuple

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


# --------------------------------------------------------------------------------------------- readers


class CheckpointReader(abc.ABC):
    """A name -> tensor mapping whose tensors are read on demand.

    ``specs`` (name -> TensorSpec) is known up front without reading data, so key/shape/dtype checks run
    before any arithmetic; ``get(name)`` returns one CPU tensor. ``shards`` lists (file name, tensor
    names) in storage order, for writing an output with the same layout.
    """

    format: str = ""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.specs: dict[str, TensorSpec] = {}
        self.shards: list[tuple[str, list[str]]] = []
        self.file_metadata: dict = {}

    def keys(self) -> list[str]:
        return list(self.specs)

    @abc.abstractmethod
    def get(self, name: str):
        """Return tensor `name` as a CPU tensor (each reader implements its own storage access)."""

    def get_into(self, name: str, out):
        """Read tensor `name` into the preallocated contiguous tensor `out` (same shape and dtype); returns `out`.

        Merges call this with reused buffers so that streaming never allocates per tensor.
        """
        out.copy_(self.get(name))
        return out

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _SafetensorsFile:
    """One .safetensors file: header parsed once, each tensor read through a fresh ``safe_open``."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = check_input_file(path)
        try:
            with safe_open(str(self.path), framework="pt") as f:
                self.metadata = dict(f.metadata() or {})
                self.specs = {}
                for k in f.keys():
                    sl = f.get_slice(k)
                    self.specs[k] = TensorSpec(k, _torch_dtype(sl.get_dtype(), f"{self.path}: tensor {k!r}"),
                                               tuple(int(s) for s in sl.get_shape()))
        except BadInputError:
            raise
        except Exception as e:  # SafetensorError on bad/short headers, OSError on unreadable files
            raise BadInputError(f"{self.path}: corrupt or truncated safetensors file ({str(e).splitlines()[0][:200]})") from e
        # safetensors keeps keys sorted; storage order (by offset) is what a faithful rewrite keeps
        self.offsets: dict[str, tuple[int, int]] = {}
        self.data_start = 0
        self.order = self._storage_order()

    def _storage_order(self) -> list[str]:
        """Tensor names by file offset; also records the byte ranges used by :meth:`get_into`."""
        try:
            with open(self.path, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            self.data_start = 8 + n
            self.offsets = {k: tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}
            return sorted(self.specs, key=lambda k: (self.offsets.get(k, (0, 0))[0], k))
        except Exception:  # the header was already validated by safetensors; fall back to safe_open reads
            self.offsets = {}
            return list(self.specs)

    def get_into(self, name: str, out):
        """Read the tensor's bytes straight into `out` (positioned read; the range was validated by safe_open)."""
        import torch

        rng = self.offsets.get(name)
        spec = self.specs[name]
        if rng is None or out.dtype != spec.dtype or tuple(out.shape) != tuple(spec.shape) or not out.is_contiguous() \
                or out.device.type != "cpu":
            out.copy_(self.get(name))
            return out
        a, b = rng
        if b - a != spec.nbytes:
            raise BadInputError(f"{self.path}: tensor {name!r} has {b - a} bytes for {spec.nbytes} expected")
        if b > a:
            mv = memoryview(out.reshape(-1).view(torch.uint8).numpy())
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.data_start + a)
                    got = fh.readinto(mv)
            except OSError as e:
                raise BadInputError(f"{self.path}: cannot read tensor {name!r} ({e})") from e
            if got != b - a:
                raise BadInputError(f"{self.path}: truncated while reading tensor {name!r}")
        return out

    def get(self, name: str):
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as f:
                return f.get_tensor(name)
        except Exception as e:
            raise BadInputError(f"{self.path}: cannot read tensor {name!r} ({str(e).splitlines()[0][:200]})") from e


class SafetensorsReader(CheckpointReader):
    format = "safetensors"

    def __init__(self, path):
        super().__init__(path)
        self._file = _SafetensorsFile(self.path)
        self.specs = {k: self._file.specs[k] for k in self._file.order}
        self.shards = [(self.path.name, list(self.specs))]
        self.file_metadata = self._file.metadata

    def get(self, name):
        return self._file.get(name)

    def get_into(self, name, out):
        return self._file.get_into(name, out)


def _unwrap_state_dict(obj, path: Path, unwrap_keys=("state_dict", "model")) -> dict:
    import torch

    if isinstance(obj, dict):
        for k in unwrap_keys:
            if k in obj and isinstance(obj[k], dict):
                obj = obj[k]
                break
    if not isinstance(obj, dict) or not obj:
        raise BadInputError(f"{path}: expected a state_dict (name -> tensor), got {type(obj).__name__}")
    bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise BadInputError(f"{path}: entry {bad[0]!r} is a {type(obj[bad[0]]).__name__}, not a tensor; "
                            "expected a flat state_dict (optionally under a 'state_dict' key)")
    return obj


def _torch_load_lazy(path: Path) -> dict:
    """weights_only load, memory-mapped when the file allows it; errors come from core's safe_torch_load."""
    import torch

    import warnings

    p = check_input_file(path)
    with warnings.catch_warnings():
        # torch warns about pickle protocols on stderr; the outcome (tensors or a clear error) is what counts
        warnings.simplefilter("ignore")
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            # not a zip checkpoint (legacy format), or bad: the core loader loads it or raises the clear error
            obj = safe_torch_load(p)
    return _unwrap_state_dict(obj, p)


class TorchReader(CheckpointReader):
    format = "torch"

    def __init__(self, path):
        super().__init__(path)
        self._sd = _torch_load_lazy(self.path)
        self.specs = {k: TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in self._sd.items()}
        self.shards = [(self.path.name, list(self.specs))]

    def get(self, name):
        return self._sd[name]

    def close(self):
        self._sd = {}


class ShardedReader(CheckpointReader):
    """A Hugging Face folder: an index JSON mapping tensor names to shard files (or one weights file)."""

    def __init__(self, folder: Path):
        super().__init__(folder)
        folder = self.path
        if (folder / ST_INDEX).exists():
            self.format, index = "hf_safetensors", folder / ST_INDEX
        elif (folder / ST_SINGLE).exists():
            self.format, index = "hf_safetensors", None
        elif (folder / PT_INDEX).exists():
            self.format, index = "hf_torch", folder / PT_INDEX
        elif (folder / PT_SINGLE).exists():
            self.format, index = "hf_torch", None
        else:
            raise BadInputError(f"{folder}: folder has none of {ST_INDEX}, {ST_SINGLE}, {PT_INDEX}, {PT_SINGLE}")
        self.index_metadata: dict = {}
        if index is None:
            shard_names = {ST_SINGLE if self.format == "hf_safetensors" else PT_SINGLE: None}
        else:
            try:
                doc = json.loads(check_input_file(index).read_text())
                wmap = doc["weight_map"]
                if not isinstance(wmap, dict) or not wmap:
                    raise ValueError("empty weight_map")
            except BadInputError:
                raise
            except Exception as e:
                raise BadInputError(f"{index}: not a valid index JSON with a 'weight_map' ({e})") from e
            self.index_metadata = dict(doc.get("metadata") or {})
            shard_names = {}
            for k, f in wmap.items():
                if not isinstance(f, str) or not f or Path(f).name != f or f in (".", ".."):
                    raise BadInputError(f"{index}: shard {f!r} of tensor {k!r} is not a plain file name in the folder")
                shard_names.setdefault(f, []).append(k)
        self._files: dict[str, object] = {}
        self._where: dict[str, str] = {}
        for fname, listed in shard_names.items():
            fpath = folder / fname
            if not fpath.exists():
                raise BadInputError(f"{fpath}: shard listed in the index is missing")
            if self.format == "hf_safetensors":
                sf = _SafetensorsFile(fpath)
                names, specs = sf.order, sf.specs
                self._files[fname] = sf
            else:
                sd = _torch_load_lazy(fpath)
                names = list(sd)
                specs = {k: TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in sd.items()}
                self._files[fname] = sd
            if listed is not None:
                missing = sorted(set(listed) - set(names))
                if missing:
                    raise BadInputError(f"{fpath}: tensor {missing[0]!r} listed in the index is not in this shard")
                names = [n for n in names if n in set(listed)]
            for n in names:
                self.specs[n] = specs[n]
                self._where[n] = fname
            self.shards.append((fname, names))

    def get(self, name):
        f = self._files[self._where[name]]
        return f.get(name) if isinstance(f, _SafetensorsFile) else f[name]

    def get_into(self, name, out):
        f = self._files[self._where[name]]
        if isinstance(f, _SafetensorsFile):
            return f.get_into(name, out)
        out.copy_(f[name])
        return out

    def close(self):
        self._files = {}


def open_checkpoint(path: str | os.PathLike) -> CheckpointReader:
    """Open a checkpoint (file or HF folder) for lazy per-tensor reading."""
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such file or folder")
    if p.is_dir():
        return ShardedReader(p)
    if p.suffix in SAFETENSORS_SUFFIXES:
        return SafetensorsReader(p)
    if p.suffix in TORCH_SUFFIXES:
        return TorchReader(p)
    # unknown suffix: sniff the safetensors header (u64 length then '{'), else try torch
    try:
        with open(p, "rb") as fh:
            head = fh.read(9)
    except OSError as e:
        raise BadInputError(f"{p}: cannot read ({e})") from e
    if len(head) == 9 and head[8:9] == b"{":
        return SafetensorsReader(p)
    return TorchReader(p)


def check_compatible(base: CheckpointReader, other: CheckpointReader) -> None:
    """Same keys, shapes and dtypes, or a BadInputError naming the first tensor at fault."""
    bk, ok = set(base.specs), set(other.specs)
    if bk != ok:
        only_b, only_o = sorted(bk - ok), sorted(ok - bk)
        if only_b:
            raise BadInputError(f"{other.path}: tensor {only_b[0]!r} of the base {base.path} is missing"
                                f" ({len(only_b)} missing in all)")
        raise BadInputError(f"{other.path}: tensor {only_o[0]!r} is not in the base {base.path}"
                            f" ({len(only_o)} extra in all)")
    for k, s in base.specs.items():
        o = other.specs[k]
        if tuple(o.shape) != tuple(s.shape):
            raise BadInputError(f"{other.path}: tensor {k!r} has shape {list(o.shape)}, the base has {list(s.shape)}")
        if o.dtype != s.dtype:
            raise BadInputError(f"{other.path}: tensor {k!r} has dtype {str(o.dtype).replace('torch.', '')}, "
                                f"the base has {str(s.dtype).replace('torch.', '')}")


# --------------------------------------------------------------------------------------------- writers


def _tensor_bytes(t) -> memoryview:
    t = t.detach().to("cpu").contiguous()
    import torch

    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class _StreamingSafetensorsFile:
    """Write a .safetensors file tensor by tensor: the header (offsets from the known specs) goes first."""

    def __init__(self, fh, specs: list[TensorSpec], metadata: dict[str, str] | None):
        header: dict = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        off = 0
        for s in specs:
            header[s.name] = {"dtype": _st_code(s.dtype), "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
            off += s.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * ((8 - len(raw) % 8) % 8)
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        self.fh = fh
        self.pending = [s for s in specs]
        self.pos = 0

    def write(self, name, tensor):
        s = self.pending[self.pos]
        if s.name != name:
            raise RuntimeError(f"streaming writer expected tensor {s.name!r}, got {name!r}")
        if tuple(tensor.shape) != tuple(s.shape) or tensor.dtype != s.dtype:
            raise RuntimeError(f"tensor {name!r}: got {tuple(tensor.shape)} {tensor.dtype}, expected {s.shape} {s.dtype}")
        self.fh.write(_tensor_bytes(tensor))
        self.pos += 1

    def done(self) -> bool:
        return self.pos == len(self.pending)


def default_output_name(base: CheckpointReader, fmt: str) -> str:
    """`merged.safetensors`, `merged.pt` or `merged/` (HF folder) for the chosen output format."""
    return {"safetensors": "merged.safetensors", "torch": "merged.pt"}.get(fmt, "merged")


def resolve_output_format(base: CheckpointReader, fmt: str = "same") -> str:
    """`same` keeps the base's format: safetensors, torch, hf_safetensors or hf_torch."""
    if fmt in ("same", "auto", None):
        return base.format
    if fmt not in ("safetensors", "torch", "hf_safetensors", "hf_torch"):
        raise BadInputError(f"unknown output format {fmt!r}; use same, safetensors, torch, hf_safetensors or hf_torch")
    return fmt


class CheckpointWriter:
    """Write a checkpoint shaped like `base` tensor by tensor, atomically; use as a context manager.

    Iterate ``writer.order`` and call ``writer.write(name, tensor)`` for every name in that order. On a
    clean exit the output appears at `path` (with its JSON record); on an exception nothing is left.
    """

    def __init__(self, base: CheckpointReader, path: str | os.PathLike, fmt: str = "same", record: dict | None = None):
        self.base = base
        self.path = Path(path)
        self.fmt = resolve_output_format(base, fmt)
        self.record = dict(record or {})
        self.folder = self.fmt.startswith("hf_")
        if self.folder:
            shards = base.shards
            ext = ".safetensors" if self.fmt == "hf_safetensors" else ".bin"
            self.layout = []
            for i, (fname, names) in enumerate(shards):
                if len(shards) == 1:
                    fname = ST_SINGLE if ext == ".safetensors" else PT_SINGLE
                elif fname is None or not base.format.startswith("hf_") or not fname.endswith(ext):
                    fname = (f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if ext == ".safetensors"
                             else f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin")
                self.layout.append((fname, list(names)))
        else:
            self.layout = [(self.path.name, base.keys())]
        self.order = [n for _, names in self.layout for n in names]
        self._stack = contextlib.ExitStack()
        self._cur = None
        self._cur_left: list = []

    # -- lifecycle
    def __enter__(self):
        self.tmpdir = None
        try:
            self._open()
        except BaseException as e:
            self._abort(type(e), e, e.__traceback__)
            raise
        return self

    def _metadata(self) -> dict[str, str]:
        return {RECORD_KEY: dumps(self.record)} if self.record else {}

    def _open(self):
        if self.folder:
            if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
                raise BadInputError(f"{self.path}: output folder exists and is not empty")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.tmpdir = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}.tmp-"))
        else:
            self.tmpdir = None
        self._shard_i = -1
        self._cur = None
        self._collected: dict = {}
        self._next_shard()

    def _cleanup_tmpdir(self):
        if self.tmpdir is not None and self.tmpdir.exists():
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _shard_path(self, fname) -> Path:
        return (self.tmpdir / fname) if self.folder else self.path

    def _next_shard(self):
        self._finish_shard()
        self._shard_i += 1
        if self._shard_i >= len(self.layout):
            self._cur = None
            return
        fname, names = self.layout[self._shard_i]
        target = self._shard_path(fname)
        if self.fmt.endswith("safetensors"):
            cm = atomic_path(target, suffix=".tmp.safetensors")
            tmp = self._stack.enter_context(cm)
            fh = open(tmp, "wb")
            specs = [self.base.specs[n] for n in names]
            self._cur = ("st", cm, tmp, fh, _StreamingSafetensorsFile(fh, specs, self._metadata()))
        else:
            self._cur = ("pt", None, target, None, names)
            self._collected = {}
        self._cur_left = list(names)

    def _finish_shard(self):
        cur = self._cur
        if cur is None:
            return
        kind = cur[0]
        if kind == "st":
            _, cm, tmp, fh, sw = cur
            if not sw.done():
                raise RuntimeError("streaming writer closed before every tensor was written")
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        else:
            from icmltools.core.checkpoint import save_torch

            save_torch(self._collected, cur[2])
            self._collected = {}
        self._cur = None

    def write(self, name, tensor):
        if self._cur is None:
            raise RuntimeError(f"writer got tensor {name!r} after every tensor was written")
        if not self._cur_left or self._cur_left[0] != name:
            raise RuntimeError(f"writer expected tensor {self._cur_left[0] if self._cur_left else None!r}, got {name!r}")
        if self._cur[0] == "st":
            self._cur[4].write(name, tensor)
        else:
            spec = self.base.specs[name]
            if tuple(tensor.shape) != tuple(spec.shape) or tensor.dtype != spec.dtype:
                raise RuntimeError(f"tensor {name!r}: wrong shape/dtype for the output")
            self._collected[name] = tensor.detach().to("cpu").clone()  # callers may reuse their buffers
        self._cur_left.pop(0)
        if not self._cur_left:
            self._next_shard()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._abort(exc_type, exc, tb)
            return False
        try:
            if self._cur is not None:
                raise RuntimeError(f"writer closed with tensors left to write: {self._cur_left[:3]}")
            if self.folder:
                self._write_folder_extras()
        except BaseException as e:
            self._abort(type(e), e, e.__traceback__)
            raise
        try:
            self._stack.close()  # renames each finished temp file into place
            if self.folder:
                if self.path.exists():
                    self.path.rmdir()  # empty (checked on open)
                os.replace(self.tmpdir, self.path)
                self.tmpdir = None
            else:
                atomic_write_json(sidecar_path(self.path), self.record)
        except BaseException:
            self._cleanup_tmpdir()
            raise
        _apply_umask(self.path)
        return False

    def _abort(self, exc_type, exc, tb):
        cur = self._cur
        if cur is not None and cur[0] == "st" and not cur[3].closed:
            cur[3].close()
        self._cur = None
        try:
            self._stack.__exit__(exc_type, exc, tb)  # atomic_path removes its temp file
        finally:
            self._cleanup_tmpdir()

    def _write_folder_extras(self):
        base = self.base
        if base.format.startswith("hf_"):
            skip = {ST_INDEX, PT_INDEX} | {f for f, _ in base.shards}
            for item in sorted(base.path.iterdir()):
                if item.is_file() and item.name not in skip and not item.name.endswith((".safetensors", ".bin", ".pt", ".pth")):
                    shutil.copy2(item, self.tmpdir / item.name)
        if len(self.layout) > 1:
            index_name = ST_INDEX if self.fmt == "hf_safetensors" else PT_INDEX
            total = sum(base.specs[n].nbytes for _, names in self.layout for n in names)
            meta = dict(getattr(base, "index_metadata", {}) or {})
            meta.update(total_size=total)
            doc = {"metadata": meta, "weight_map": {n: f for f, names in self.layout for n in names}}
            atomic_write_json(self.tmpdir / index_name, doc)
        atomic_write_json(self.tmpdir / "icml_record.json", self.record)


def _apply_umask(path: Path) -> None:
    """Normal permissions on the finished output and its sidecar record (never fail a finished write over them)."""
    try:
        for p in (path,) if path.is_dir() else (path, sidecar_path(path)):
            if p.exists():
                apply_umask(p)
    except OSError:
        pass


def sidecar_path(path: str | os.PathLike) -> Path:
    """`merged.safetensors` -> `merged.safetensors.json` (the record of how a file was made)."""
    p = Path(path)
    return p / "icml_record.json" if p.is_dir() else p.with_name(p.name + ".json")


def read_record(path: str | os.PathLike) -> dict:
    """The JSON record written next to (or inside) an output made by :class:`CheckpointWriter`."""
    p = sidecar_path(path)
    return json.loads(p.read_text()) if p.exists() else {}


class MemoryReader(CheckpointReader):
    """An in-memory state_dict behind the reader interface (demos, tests, exports)."""

    def __init__(self, tensors: dict, fmt: str = "safetensors", name: str = "<memory>", shards=None):
        super().__init__(Path(name))
        self.format = fmt
        self._sd = tensors
        self.specs = {k: TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()}
        self.shards = [(None, list(names)) for names in shards] if shards else [(None, list(tensors))]

    def get(self, name):
        return self._sd[name]


def write_state_dict(tensors: dict, path: str | os.PathLike, fmt: str = "safetensors", record: dict | None = None,
                     shards: list[list[str]] | None = None) -> Path:
    """Write an in-memory state_dict in `fmt` (safetensors, torch, hf_safetensors, hf_torch) atomically.

    `shards` (lists of tensor names) splits an HF folder into several shard files with an index JSON.
    """
    mem = MemoryReader(tensors, fmt="torch" if fmt == "torch" else "safetensors", shards=shards)
    with CheckpointWriter(mem, path, fmt=fmt, record=record) as w:
        for n in w.order:
            w.write(n, tensors[n])
    return Path(path)


def iter_tensors(reader: CheckpointReader, names: Iterable[str] | None = None):
    """Yield (name, tensor) one at a time."""
    for n in names if names is not None else reader.keys():
        yield n, reader.get(n)
