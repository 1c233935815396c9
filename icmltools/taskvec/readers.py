"""Lazy per-tensor checkpoint readers (nothing is unpickled beyond tensors).

* ``.safetensors`` files, read lazily tensor by tensor. The handle is reopened for each tensor, so the
  memory map of a file never keeps more than one tensor resident (keeping one handle open lets the
  kernel account the whole touched file to the process RSS).
* torch checkpoints (``.pt .pth .bin .ckpt``) loaded with ``weights_only=True`` (``mmap=True`` where
  the file is in the zip format, so tensors are paged in on use); a ``state_dict`` or ``model``
  wrapper key is unwrapped; failures go through :func:`icmltools.core.checkpoint.safe_torch_load`.
* Hugging Face style folders: ``model.safetensors.index.json`` (sharded safetensors),
  ``model.safetensors``, ``pytorch_model.bin.index.json`` (sharded torch) or ``pytorch_model.bin``.
* in-memory state_dicts behind the same interface (:class:`MemoryReader`).
"""
from __future__ import annotations

import abc
import json
import os
import struct
from pathlib import Path
from typing import Iterable

from icmltools.core.checkpoint import SAFETENSORS_SUFFIXES, TORCH_SUFFIXES, safe_torch_load, unwrap_state_dict
from icmltools.core.errors import BadInputError
from icmltools.core.files import check_input_file

from .formats import PT_INDEX, PT_SINGLE, ST_INDEX, ST_SINGLE, TensorSpec, torch_dtype


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
        self.closed = False

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

    def get_range_into(self, name: str, start: int, stop: int, out):
        """Read elements [start, stop) of tensor `name`, flattened in row-major order, into the contiguous
        1-D tensor `out` (stop - start elements, the tensor's dtype); returns `out`. Chunked merges read one
        slice of a tensor at a time with it."""
        out.copy_(self.get(name).reshape(-1)[start:stop])
        return out

    def view_range(self, name: str, start: int, stop: int):
        """Elements [start, stop) of tensor `name` (flattened) as a tensor over the file's bytes, without a copy,
        or None where this reader cannot (then use :meth:`get_range_into`). The caller must not write into it
        (the file is mapped copy-on-write: a write would stay in this process's memory, never in the file)."""
        return None

    def release_range(self, name: str, start: int, stop: int) -> None:
        """Drop from this process's resident memory the pages a view of [start, stop) mapped (they stay in the
        page cache; a later access maps them again). The view stays valid. Readers without views: nothing."""
        return None

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

    def close(self) -> None:
        """Mark the reader closed; readers holding mapped tensors or shard handles also drop them."""
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# --------------------------------------------------------------------------------------------- safetensors


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
                    self.specs[k] = TensorSpec(k, torch_dtype(sl.get_dtype(), f"{self.path}: tensor {k!r}"),
                                               tuple(int(s) for s in sl.get_shape()))
        except BadInputError:
            raise
        except Exception as e:  # SafetensorError on bad/short headers, OSError on unreadable files
            raise BadInputError(f"{self.path}: corrupt or truncated safetensors file ({str(e).splitlines()[0][:200]})") from e
        # safetensors keeps keys sorted; storage order (by offset) is what a faithful rewrite keeps
        self._map = None  # the file mapped on the first view_range (False: not mappable)
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

    def get_range_into(self, name: str, start: int, stop: int, out):
        """Read elements [start, stop) of the flattened tensor straight into the contiguous 1-D `out`."""
        import torch

        rng = self.offsets.get(name)
        spec = self.specs[name]
        if rng is None or out.dtype != spec.dtype or not out.is_contiguous() or out.device.type != "cpu" \
                or not 0 <= start <= stop <= spec.numel or out.numel() != stop - start:
            out.copy_(self.get(name).reshape(-1)[start:stop])
            return out
        a, b = rng
        if b - a != spec.nbytes:
            raise BadInputError(f"{self.path}: tensor {name!r} has {b - a} bytes for {spec.nbytes} expected")
        size = spec.dtype.itemsize
        n = (stop - start) * size
        if n:
            mv = memoryview(out.view(torch.uint8).numpy())
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.data_start + a + start * size)
                    got = fh.readinto(mv)
            except OSError as e:
                raise BadInputError(f"{self.path}: cannot read tensor {name!r} ({e})") from e
            if got != n:
                raise BadInputError(f"{self.path}: truncated while reading tensor {name!r}")
        return out

    def _byte_range(self, name: str, start: int, stop: int):
        """(file offset, length) of elements [start, stop), or None (no offsets, a bad range or misaligned)."""
        rng, spec = self.offsets.get(name), self.specs[name]
        if rng is None or rng[1] - rng[0] != spec.nbytes or not 0 <= start <= stop <= spec.numel:
            return None
        size = spec.dtype.itemsize
        off = self.data_start + rng[0] + start * size
        return (off, (stop - start) * size) if off % size == 0 else None

    def view_range(self, name: str, start: int, stop: int):
        """See :meth:`CheckpointReader.view_range`: a slice of one copy-on-write map of the whole file."""
        import mmap

        import numpy as np
        import torch

        where = self._byte_range(name, start, stop)
        if where is None or where[1] == 0:
            return None
        if self._map is None:
            try:
                with open(self.path, "rb") as fh:
                    self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError):  # not mappable (a pipe, an empty or special file): read it instead
                self._map = False
        if self._map is False or where[0] + where[1] > len(self._map):
            return None  # a truncated file: get_range_into names it
        arr = np.frombuffer(self._map, dtype=np.uint8, count=where[1], offset=where[0])
        return torch.from_numpy(arr).view(self.specs[name].dtype)

    def unmap(self) -> None:
        """Forget the file's map (unmapped once no view of it is left)."""
        self._map = None

    def release_range(self, name: str, start: int, stop: int) -> None:
        import mmap

        where = self._byte_range(name, start, stop)
        if not self._map or where is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        a = where[0] // page * page
        b = min(len(self._map), -(-(where[0] + where[1]) // page) * page)
        if b > a:
            self._map.madvise(mmap.MADV_DONTNEED, a, b - a)  # private, never written: the file's bytes stay

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

    def get_range_into(self, name, start, stop, out):
        return self._file.get_range_into(name, start, stop, out)

    def view_range(self, name, start, stop):
        return self._file.view_range(name, start, stop)

    def release_range(self, name, start, stop):
        self._file.release_range(name, start, stop)

    def close(self):
        self._file.unmap()
        super().close()


# --------------------------------------------------------------------------------------------- torch


def _torch_load_lazy(path: Path) -> dict:
    """weights_only load, memory-mapped when the file allows it; errors come from core's safe_torch_load."""
    import warnings

    import torch

    p = check_input_file(path)
    with warnings.catch_warnings():
        # torch warns about pickle protocols on stderr; the outcome (tensors or a clear error) is what counts
        warnings.simplefilter("ignore")
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            # not a zip checkpoint (legacy format), or bad: the core loader loads it or raises the clear error
            obj = safe_torch_load(p)
    return unwrap_state_dict(obj, p)


def _specs_of(sd: dict) -> dict[str, TensorSpec]:
    return {k: TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in sd.items()}


class TorchReader(CheckpointReader):
    format = "torch"

    def __init__(self, path):
        super().__init__(path)
        self._sd = _torch_load_lazy(self.path)
        self.specs = _specs_of(self._sd)
        self.shards = [(self.path.name, list(self.specs))]

    def get(self, name):
        return self._sd[name]

    def close(self):
        self._sd = {}
        super().close()


# --------------------------------------------------------------------------------------------- HF folders


def _folder_layout(folder: Path) -> tuple[str, Path | None]:
    """(format, index JSON or None for a single weights file) of a Hugging Face folder."""
    for fmt, index, single in (("hf_safetensors", ST_INDEX, ST_SINGLE), ("hf_torch", PT_INDEX, PT_SINGLE)):
        if (folder / index).exists():
            return fmt, folder / index
        if (folder / single).exists():
            return fmt, None
    raise BadInputError(f"{folder}: folder has none of {ST_INDEX}, {ST_SINGLE}, {PT_INDEX}, {PT_SINGLE}")


def _read_index(index: Path) -> tuple[dict[str, list[str]], dict]:
    """The index JSON's shard file -> tensor names (in index order) and its metadata."""
    try:
        doc = json.loads(check_input_file(index).read_text())
        wmap = doc["weight_map"]
        if not isinstance(wmap, dict) or not wmap:
            raise ValueError("empty weight_map")
    except BadInputError:
        raise
    except Exception as e:
        raise BadInputError(f"{index}: not a valid index JSON with a 'weight_map' ({e})") from e
    shard_names: dict[str, list[str]] = {}
    for k, f in wmap.items():
        if not isinstance(f, str) or not f or Path(f).name != f or f in (".", ".."):
            raise BadInputError(f"{index}: shard {f!r} of tensor {k!r} is not a plain file name in the folder")
        shard_names.setdefault(f, []).append(k)
    return shard_names, dict(doc.get("metadata") or {})


class ShardedReader(CheckpointReader):
    """A Hugging Face folder: an index JSON mapping tensor names to shard files (or one weights file)."""

    def __init__(self, folder: Path):
        super().__init__(folder)
        self.format, index = _folder_layout(self.path)
        self.index_metadata: dict = {}
        if index is None:
            shard_names = {ST_SINGLE if self.format == "hf_safetensors" else PT_SINGLE: None}
        else:
            shard_names, self.index_metadata = _read_index(index)
        self._files: dict[str, object] = {}
        self._where: dict[str, str] = {}
        for fname, listed in shard_names.items():
            self._open_shard(fname, listed)

    def _open_shard(self, fname: str, listed: list[str] | None) -> None:
        fpath = self.path / fname
        if not fpath.exists():
            raise BadInputError(f"{fpath}: shard listed in the index is missing")
        if self.format == "hf_safetensors":
            sf = _SafetensorsFile(fpath)
            names, specs = sf.order, sf.specs
            self._files[fname] = sf
        else:
            sd = _torch_load_lazy(fpath)
            names, specs = list(sd), _specs_of(sd)
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

    def get_range_into(self, name, start, stop, out):
        f = self._files[self._where[name]]
        if isinstance(f, _SafetensorsFile):
            return f.get_range_into(name, start, stop, out)
        out.copy_(f[name].reshape(-1)[start:stop])
        return out

    def view_range(self, name, start, stop):
        f = self._files[self._where[name]]
        return f.view_range(name, start, stop) if isinstance(f, _SafetensorsFile) else None

    def release_range(self, name, start, stop):
        f = self._files[self._where[name]]
        if isinstance(f, _SafetensorsFile):
            f.release_range(name, start, stop)

    def close(self):
        for f in self._files.values():
            if isinstance(f, _SafetensorsFile):
                f.unmap()
        self._files = {}
        super().close()


# --------------------------------------------------------------------------------------------- memory


class MemoryReader(CheckpointReader):
    """An in-memory state_dict behind the reader interface (demos, tests, exports)."""

    def __init__(self, tensors: dict, fmt: str = "safetensors", name: str = "<memory>", shards=None):
        super().__init__(Path(name))
        self.format = fmt
        self._sd = tensors
        self.specs = _specs_of(tensors)
        self.shards = [(None, list(names)) for names in shards] if shards else [(None, list(tensors))]

    def get(self, name):
        return self._sd[name]

    def view_range(self, name, start, stop):
        """The held tensor's elements [start, stop) themselves (no copy) when it is a contiguous CPU tensor."""
        t = self._sd[name]
        if t.device.type != "cpu" or not t.is_contiguous():
            return None
        return t.reshape(-1)[start:stop]


# --------------------------------------------------------------------------------------------- opening, checks


def sniff(path: Path) -> str | None:
    """What a file holds, from its first bytes: "safetensors" (a u64 header length, then '{'), "torch" (a zip
    archive or a pickle), "json", or None (unknown, or too short to tell)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as e:
        raise BadInputError(f"{path}: cannot read ({e.strerror or e})") from e
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return "torch"
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return None


def open_checkpoint(path: str | os.PathLike) -> CheckpointReader:
    """Open a checkpoint (file or HF folder) for lazy per-tensor reading. A file is read as what its first
    bytes say it is (a .safetensors file saved under a .pt name works; a torch file under a .safetensors name is
    refused with a hint); content that no reader recognises is a clear error (a JSON file, e.g. the record
    next to a checkpoint, says so)."""
    p = Path(path)
    if not p.exists():
        raise BadInputError(f"{p}: no such file or folder")
    if p.is_dir():
        return ShardedReader(p)
    kind = sniff(p)
    if kind == "json":
        record = p.name.endswith(tuple(s + ".json" for s in SAFETENSORS_SUFFIXES + TORCH_SUFFIXES))
        raise BadInputError(f"{p}: a JSON file, not a checkpoint" +
                            (" (the record written next to a checkpoint: give the checkpoint itself)" if record else ""))
    if kind == "safetensors" or kind is None and p.suffix in SAFETENSORS_SUFFIXES:
        return SafetensorsReader(p)  # unrecognised content: the reader says what is wrong with the header
    if kind == "torch" and p.suffix in SAFETENSORS_SUFFIXES:  # torch.load itself reads that suffix as safetensors
        raise BadInputError(f"{p}: a torch checkpoint under a .safetensors name; rename it to .pt")
    if kind == "torch":
        return TorchReader(p)
    check_input_file(p)  # an empty or unreadable file says so
    what = "a torch checkpoint (neither a zip archive nor a pickle)" if p.suffix in TORCH_SUFFIXES else \
        "a checkpoint (neither safetensors nor a torch file)"
    raise BadInputError(f"{p}: not {what}")


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


def iter_tensors(reader: CheckpointReader, names: Iterable[str] | None = None):
    """Yield (name, tensor) one at a time."""
    for n in names if names is not None else reader.keys():
        yield n, reader.get(n)
