"""Streaming, atomic checkpoint writers.

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
from collections.abc import Callable
from pathlib import Path

from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import apply_umask, atomic_path, atomic_write_json, dumps, output_errors

from .formats import (
    PT_INDEX,
    PT_SINGLE,
    RECORD_IN_FOLDER,
    RECORD_KEY,
    ST_INDEX,
    ST_SINGLE,
    TensorSpec,
    resolve_output_format,
    sidecar_path,
    st_code,
)
from .readers import CheckpointReader, MemoryReader


def _tensor_bytes(t) -> memoryview:
    import torch

    t = t.detach().to("cpu").contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


DIRECT_MIN_BYTES = 64 << 20  # a safetensors file at least this large is written with O_DIRECT (when the OS allows)
DIRECT_BLOCK = 4096  # O_DIRECT: buffer address, file offset and length in whole blocks (4096 covers 512-byte disks)
_STAGE = 16 << 20  # the aligned staging buffer
_DIRECT_MIN = 64 << 10  # bytes a write must hold, past its first block boundary, to go to the disk from its own buffer


def _address(mv) -> int:
    """The address of a non-empty contiguous memoryview's first byte."""
    import numpy as np

    return np.frombuffer(mv, np.uint8).ctypes.data


class _DirectFile:
    """A new file written with ``O_DIRECT``: the bytes go from one page-aligned staging buffer straight to the
    disk, in whole blocks as it fills, without passing through the page cache. A large output then takes no
    fresh memory and leaves no write-back for the final fsync (measured on our 2-core VM, whose host backs
    fresh guest memory lazily: 1 GB written through the page cache took 0.26-11.3 s + 0.4-0.5 s of fsync; with
    O_DIRECT 0.47-0.51 s, 0.02 s of CPU). :meth:`flush` ends the file: the tail is padded to a block, written,
    and the file truncated to its true length. Opening raises OSError where the file system refuses O_DIRECT
    (tmpfs); the caller then writes through the page cache."""

    def __init__(self, path):
        import mmap

        self.closed = True
        self.fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_DIRECT)
        self.closed = False
        self._buf = mmap.mmap(-1, _STAGE)  # anonymous maps are page-aligned
        self._view = memoryview(self._buf)
        self._fill = 0
        self.size = 0
        self._ended = False

    def write(self, data) -> int:
        """Append `data`. Where its bytes from the file's next block boundary on lie at a block-aligned address
        (the merge engine places its output slots so: :meth:`CheckpointWriter.byte_offset`), the whole blocks go
        to the disk straight from `data` (the bytes before them complete the staged block, which is written
        first); the rest is copied through the staging buffer."""
        if self._ended:
            raise ValueError("write after the end of a direct file")
        mv = memoryview(data).cast("B")
        n = len(mv)
        head = -self.size % DIRECT_BLOCK  # bytes to the file's next block boundary
        if n - head >= _DIRECT_MIN and (_address(mv) + head) % DIRECT_BLOCK == 0:
            self._stage(mv[:head])
            if self._fill:
                self._drain(self._fill)  # whole blocks: the staged bytes end at the boundary
            body = (n - head) // DIRECT_BLOCK * DIRECT_BLOCK
            self._write_all(mv[head:head + body])
            self._stage(mv[head + body:])
        else:
            self._stage(mv)
        self.size += n
        return n

    def _stage(self, mv) -> None:
        """Copy `mv` into the staging buffer, writing it out whenever it is full."""
        n, pos = len(mv), 0
        while pos < n:
            k = min(n - pos, _STAGE - self._fill)
            self._view[self._fill:self._fill + k] = mv[pos:pos + k]
            self._fill += k
            pos += k
            if self._fill == _STAGE:
                self._drain(_STAGE)

    def _write_all(self, mv) -> None:
        done = 0
        while done < len(mv):
            done += os.write(self.fd, mv[done:])

    def _drain(self, nbytes: int) -> None:
        self._write_all(self._view[:nbytes])
        self._fill = 0

    def flush(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._fill:
            pad = -self._fill % DIRECT_BLOCK
            self._view[self._fill:self._fill + pad] = bytes(pad)
            self._drain(self._fill + pad)
            os.ftruncate(self.fd, self.size)

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._view.release()
            self._buf.close()
            os.close(self.fd)


def _open_stream(path, nbytes: int):
    """A writable file for a streamed safetensors file of about `nbytes`: direct I/O when large and allowed."""
    if nbytes >= DIRECT_MIN_BYTES and hasattr(os, "O_DIRECT"):
        try:
            return _DirectFile(path)
        except OSError:
            pass
    return open(path, "wb")


def _st_header(specs: list[TensorSpec], metadata: dict[str, str] | None) -> bytes:
    """A safetensors file's JSON header for `specs` in that order (padded to 8 bytes); the tensors' bytes follow
    the 8-byte length and this header."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for s in specs:
        header[s.name] = {"dtype": st_code(s.dtype), "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return raw + b" " * ((8 - len(raw) % 8) % 8)


class _StreamingSafetensorsFile:
    """Write a .safetensors file tensor by tensor: the header (offsets from the known specs) goes first."""

    def __init__(self, fh, specs: list[TensorSpec], metadata: dict[str, str] | None):
        raw = _st_header(specs, metadata)
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        self.fh = fh
        self.pending = [s for s in specs]
        self.pos = 0
        self.part = 0  # bytes of the current tensor written by write_part

    def write(self, name, tensor):
        s = self.pending[self.pos]
        if s.name != name:
            raise RuntimeError(f"streaming writer expected tensor {s.name!r}, got {name!r}")
        if tuple(tensor.shape) != tuple(s.shape) or tensor.dtype != s.dtype:
            raise RuntimeError(f"tensor {name!r}: got {tuple(tensor.shape)} {tensor.dtype}, expected {s.shape} {s.dtype}")
        self.fh.write(_tensor_bytes(tensor))
        self.pos += 1

    def write_part(self, name, start: int, data) -> bool:
        """Bytes of tensor `name` from element `start` on (parts in order, from 0); True when it is complete."""
        s = self.pending[self.pos]
        if s.name != name:
            raise RuntimeError(f"streaming writer expected tensor {s.name!r}, got {name!r}")
        if start * s.dtype.itemsize != self.part:
            raise RuntimeError(f"tensor {name!r}: part at element {start}, expected {self.part // s.dtype.itemsize}")
        self.part += self.fh.write(data)
        if self.part > s.nbytes:
            raise RuntimeError(f"tensor {name!r}: {self.part} bytes written for {s.nbytes}")
        if self.part < s.nbytes:
            return False
        self.pos += 1
        self.part = 0
        return True

    def done(self) -> bool:
        return self.pos == len(self.pending)


def _largest_last_first(names, specs) -> list:
    """A safetensors file's tensors in `names`' order, except that a last tensor at least as large as every other
    one goes first. A streamed file is written in its own order, so the tensor merged last is written after every
    other one: a Llama checkpoint's lm_head (131 MB in the merge benchmark's bf16 files) was written alone after
    the merge's last computation, 0.07 s of a 1.1 s TIES merge; first in its file, it is written while the rest
    is merged. The header gives every tensor's offsets: readers find the tensors in any order."""
    names = list(names)
    if len(names) > 1 and all(specs[names[-1]].nbytes >= specs[n].nbytes for n in names[:-1]):
        return names[-1:] + names[:-1]
    return names


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
        if self.fmt.endswith("safetensors"):
            self.layout = [(fname, _largest_last_first(names, base.specs)) for fname, names in self.layout]
        self.order = [n for _, names in self.layout for n in names]
        self._offsets: dict | None = None  # tensor name -> its first byte's offset in its safetensors file
        self._stack = contextlib.ExitStack()
        self._cur = None
        self._cur_left: list = []

    def byte_offset(self, name: str, start: int = 0) -> int | None:
        """The offset in its output file of element `start` of tensor `name` (flattened), for a safetensors output;
        None for torch files. The merge engine places an output chunk at an address congruent to it modulo a
        block, so that a file written with O_DIRECT takes the chunk's whole blocks from the chunk itself
        (:class:`_DirectFile`)."""
        if not self.fmt.endswith("safetensors"):
            return None
        if self._offsets is None:
            self._offsets = {}
            for _, names in self.layout:
                specs = [self.base.specs[n] for n in names]
                at = 8 + len(_st_header(specs, self._metadata()))
                for sp in specs:
                    self._offsets[sp.name] = at
                    at += sp.nbytes
        return self._offsets[name] + start * self.base.specs[name].dtype.itemsize

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
            with output_errors(self.path):
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
            specs = [self.base.specs[n] for n in names]
            fh = _open_stream(tmp, sum(sp.nbytes for sp in specs))
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
        self._tensor_done()

    def _tensor_done(self) -> None:
        self._cur_left.pop(0)
        if not self._cur_left:
            self._next_shard()

    def write_range(self, name, start: int, stop: int, part) -> None:
        """Elements [start, stop) of tensor `name` (flattened, in its dtype): the parts of a tensor in order, from
        0 to its size; the tensor is complete with its last part. `part` may be reused once this returns."""
        if self._cur is None:
            raise RuntimeError(f"writer got tensor {name!r} after every tensor was written")
        if not self._cur_left or self._cur_left[0] != name:
            raise RuntimeError(f"writer expected tensor {self._cur_left[0] if self._cur_left else None!r}, got {name!r}")
        spec = self.base.specs[name]
        if part.dtype != spec.dtype or part.numel() != stop - start \
                or not (0 <= start < stop <= spec.numel or start == stop == spec.numel == 0):
            raise RuntimeError(f"tensor {name!r}: wrong part [{start}, {stop}) {part.dtype} for the output")
        if self._cur[0] == "st":
            done = self._cur[4].write_part(name, start, _tensor_bytes(part))
        else:
            import torch

            full = self._collected.get(name)
            if full is None:
                full = self._collected[name] = torch.empty(spec.numel, dtype=spec.dtype)
            full[start:stop].copy_(part.reshape(-1))
            done = stop == spec.numel
            if done:
                self._collected[name] = full.view(tuple(spec.shape))
        if done:
            self._tensor_done()

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
                with output_errors(self.path):
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
                    if item.name == "config.json" and getattr(base, "float_dtype", None) is not None:
                        _retyped_config(item, self.tmpdir / item.name, base.float_dtype)
                    else:
                        shutil.copy2(item, self.tmpdir / item.name)
        if len(self.layout) > 1:
            index_name = ST_INDEX if self.fmt == "hf_safetensors" else PT_INDEX
            total = sum(base.specs[n].nbytes for _, names in self.layout for n in names)
            meta = dict(getattr(base, "index_metadata", {}) or {})
            meta.update(total_size=total)
            doc = {"metadata": meta, "weight_map": {n: f for f, names in self.layout for n in names}}
            atomic_write_json(self.tmpdir / index_name, doc)
        atomic_write_json(self.tmpdir / RECORD_IN_FOLDER, self.record)


def _retyped_config(src: Path, dst: Path, dtype) -> None:
    """The base's Hugging Face config.json with its dtype entry (``torch_dtype``, or transformers 5's ``dtype``;
    ``torch_dtype`` added if it has neither) naming the output's float dtype, as mergekit writes it; a config that
    is not a JSON object is copied as is."""
    try:
        doc = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        shutil.copy2(src, dst)
        return
    name = str(dtype).removeprefix("torch.")
    keys = [k for k in ("torch_dtype", "dtype") if k in doc] or ["torch_dtype"]
    doc.update({k: name for k in keys})
    dst.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


_TAKEN = object()  # WriteBehind's mark of a slot handed out whose write is not yet submitted


class WriteBehind:
    """A :class:`CheckpointWriter` fed from another thread: ``write`` hands the tensor to one writer thread and
    returns, so copying the output into the page cache (and a shard's fsync) runs on another core while the
    caller computes the next tensor. Tensors are written in the order given.

    A caller that fills its own buffers takes a buffer index from :meth:`slot` (0..slots-1; it waits until the
    write that last used that buffer is done) and passes it to :meth:`write`; a tensor written without a slot
    must not be changed afterwards. Use as a context manager inside the writer's: a clean exit waits for every
    write and re-raises the first error of the thread; an exception (Ctrl-C included) drops the writes not
    started, waits for the one running, and lets the writer's own exit remove the temporary output.
    """

    def __init__(self, writer: CheckpointWriter, slots: int = 2):
        from concurrent.futures import ThreadPoolExecutor

        self.writer = writer
        self.order = writer.order
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="icml-write")
        self._slots: list = [None] * max(1, int(slots))
        self._next = 0
        self._last = None
        self._error: BaseException | None = None

    def __enter__(self):
        return self

    def slot(self, fits: Callable[[int], int] | None = None) -> int:
        """The index of an output buffer no pending write still reads: round robin, except where `fits` is given
        (buffer index -> its size where it is already large enough, else 0; a bool serves where sizes do not
        matter). Then the smallest buffer that fits among those whose write is done is taken at once, the first in
        turn among equals (a large tensor after small ones reuses a large buffer instead of growing the next one,
        and small chunks leave it free where a smaller one is free); with none free that fits, the turn's (its
        write waited for)."""
        n = len(self._slots)
        i = self._next
        if fits is not None:
            best = None
            for j in [*range(i, n), *range(i)]:
                fut = self._slots[j]
                if fut is None or (fut is not _TAKEN and fut.done()):
                    size = fits(j)
                    if size and (best is None or size < best[0]):
                        best = (size, j)
            i = i if best is None else best[1]
        if i == self._next:
            self._next = (i + 1) % n
        fut, self._slots[i] = self._slots[i], _TAKEN  # until its write is handed over, not free to `fits`
        if fut is not None and fut is not _TAKEN:
            fut.result()
        self._raise()
        return i

    def _run(self, fn, *args) -> None:
        if self._error is None:  # after a failure the rest is dropped; the first error is the one raised
            try:
                fn(*args)
            except BaseException as e:
                self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _submit(self, slot: int | None, fn, *args) -> None:
        self._raise()
        self._last = self._pool.submit(self._run, fn, *args)
        if slot is not None:
            self._slots[slot] = self._last

    def byte_offset(self, name: str, start: int = 0) -> int | None:
        """:meth:`CheckpointWriter.byte_offset` (read only: safe beside the writer thread)."""
        return self.writer.byte_offset(name, start)

    def write(self, name, tensor, slot: int | None = None) -> None:
        """:meth:`CheckpointWriter.write` in the writer thread."""
        self._submit(slot, self.writer.write, name, tensor)

    def write_range(self, name, start: int, stop: int, part, slot: int | None = None) -> None:
        """:meth:`CheckpointWriter.write_range` in the writer thread (`part` unchanged until its slot is free)."""
        self._submit(slot, self.writer.write_range, name, start, stop, part)

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None and self._last is not None:
                self._last.result()  # writes run in order: the last done means every one is
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if exc_type is None:
            self._raise()
        return False


def _apply_umask(path: Path) -> None:
    """Normal permissions on the finished output and its sidecar record (never fail a finished write over them)."""
    try:
        for p in (path,) if path.is_dir() else (path, sidecar_path(path)):
            if p.exists():
                apply_umask(p)
    except OSError:
        pass


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

