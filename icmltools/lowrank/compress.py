"""Streamed truncated-SVD compression of a checkpoint's Linear weights (spec (b); the paper's layout).

Reading and writing go through the project's checkpoint I/O only (`icmltools.taskvec`: `open_checkpoint`
readers for .safetensors, HF folders and weights-only torch files; `CheckpointWriter`, atomic). One tensor is
resident at a time (the exact solver reads it in row blocks; see `svd` for each solver's memory): peak memory
~3x the largest float32 tensor above the import baseline (safetensors and HF outputs; a torch-format output is
collected whole by the writer). `--energy` needs every rank before the output header is written: a first pass
takes the singular values (`torch.linalg.svdvals`) of each selected tensor, the second pass factors it.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive
from icmltools.taskvec import (
    CheckpointReader,
    CheckpointWriter,
    TensorSpec,
    all_finite,
    count_non_finite,
    is_float_dtype,
    open_checkpoint,
    resolve_output_format,
)

from . import svd
from .options import DEFAULT_RANK_RATIO, CompressConfig


@dataclass
class Plan:
    """What happens to each tensor: `ranks` {weight key: r}, `skipped` [{key, reason}], output layout."""

    reader: CheckpointReader
    cfg: CompressConfig
    ranks: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)
    fmt: str = "safetensors"


class OutputLayout(CheckpointReader):
    """The output's names, specs and shards for the writer (a layout, not a reader: tensors come from `produce`)."""

    def __init__(self, base: CheckpointReader, specs: dict, shards: list):
        super().__init__(base.path)
        self.format = base.format
        self.specs = specs
        self.shards = shards
        self.index_metadata = dict(getattr(base, "index_metadata", {}) or {})

    def get(self, name):
        """An output layout holds shapes, not tensors (CheckpointWriter reads only `specs` and `shards`)."""
        raise TypeError(f"OutputLayout describes the output's tensors and holds none (asked for {name!r})")


def return_freed_buffers() -> bool:
    """glibc only: serve every allocation of 1 MiB or more by its own memory map, so a freed tensor goes back to
    the system at once. By default glibc raises that threshold after the first big free, up to 32 MiB, and the
    freed tensors below it stay in the heap: a 2048 x 2048 float32 layer's SVD temporaries then add up in the
    resident set (measured peak 3.6x -> 2.95x the tensor with the randomized SVD, benchmarks/lowrank_compress.py).
    Process-wide, set once; False where there is no glibc."""
    import ctypes
    import ctypes.util

    global _MALLOPT_DONE
    if _MALLOPT_DONE is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _MALLOPT_DONE = bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 20))
        except (OSError, AttributeError):
            _MALLOPT_DONE = False
    return _MALLOPT_DONE


M_MMAP_THRESHOLD = -3     # glibc's mallopt parameter number
_MALLOPT_DONE: bool | None = None


def prefix(key: str) -> str:
    return key[: -len(".weight")] if key.endswith(".weight") else key


def validate(cfg: CompressConfig) -> None:
    if cfg.rank_ratio is not None and cfg.energy is not None:
        raise BadInputError("give a rank ratio or an energy, not both", param="energy")
    if cfg.rank_ratio is not None and not 0 < cfg.rank_ratio <= 1:
        raise BadInputError(f"must be in (0, 1], got {cfg.rank_ratio}", param="rank_ratio")
    if cfg.energy is not None and not 0 < cfg.energy <= 1:
        raise BadInputError(f"must be in (0, 1], got {cfg.energy}", param="energy")
    for name in ("include", "exclude"):
        try:
            re.compile(getattr(cfg, name) or "")
        except re.error as e:
            raise BadInputError(f"not a regular expression ({e})", param=name) from None


def skip_reason(key: str, spec: TensorSpec, cfg: CompressConfig) -> str | None:
    """Why a selected key is not factored (None: factor it)."""
    if cfg.exclude and re.search(cfg.exclude, key):
        return "excluded"
    if len(spec.shape) != 2:
        return f"{len(spec.shape)}-D, not a matrix"
    if not is_float_dtype(spec.dtype):
        return f"{str(spec.dtype).replace('torch.', '')} is not a float dtype"
    if min(spec.shape) < cfg.min_dim:
        return f"smaller than {cfg.min_dim} on a side"
    return None


def read_checked(reader: CheckpointReader, name: str):
    """One tensor, refused if any float element is NaN/inf (named, with the count). Read into a fresh buffer
    (`get_into`: a positioned read for safetensors) rather than `get`, whose memory map would count the file's
    pages in the resident set next to the copy (2x the tensor)."""
    spec = reader.specs[name]
    t = reader.get_into(name, torch.empty(tuple(spec.shape), dtype=spec.dtype))
    if is_float_dtype(t.dtype) and not all_finite(t):
        raise BadInputError(f"{reader.path}: tensor {name!r} has {count_non_finite(t)} non-finite values (NaN/inf)")
    return t


def plan(reader: CheckpointReader, cfg: CompressConfig, device="cpu") -> Plan:
    """Select the tensors, fix each rank (ratio: from the shape; energy: from the singular values)."""
    validate(cfg)
    return_freed_buffers()
    p = Plan(reader, cfg, fmt=resolve_output_format(reader, cfg.out_format))
    ratio = cfg.rank_ratio if cfg.rank_ratio is not None else (None if cfg.energy is not None else DEFAULT_RANK_RATIO)
    for key, spec in reader.specs.items():
        if not re.search(cfg.include, key):
            continue
        why = skip_reason(key, spec, cfg)
        if why is None:
            if ratio is not None:
                r = svd.rank_from_ratio(spec.shape, ratio)
            else:
                w = read_checked(reader, key).to(device, svd.compute_dtype(spec.dtype))
                r = svd.rank_from_energy(torch.linalg.svdvals(w), cfg.energy)
                del w
            if svd.saves(spec.shape, r) or cfg.force:
                p.ranks[key] = r
                continue
            why = f"rank {r} saves nothing (r (out + in) >= out * in); --force factors it anyway"
        p.skipped.append({"key": key, "reason": why})
    if not p.ranks:
        raise BadInputError(f"{reader.path}: no tensor to factor ({len(p.skipped)} selected, all skipped"
                            + (f": {p.skipped[0]['key']}: {p.skipped[0]['reason']}" if p.skipped else "") + ")",
                            param="include")
    return p


def bias_key(reader: CheckpointReader, key: str) -> str | None:
    b = prefix(key) + ".bias"
    spec = reader.specs.get(b)
    return b if spec is not None and tuple(spec.shape) == (reader.specs[key].shape[0],) else None


def layout(p: Plan) -> tuple[OutputLayout, dict, dict]:
    """Output specs/shards, name -> (kind, source key), and the map {prefix: {in, out, rank, bias}}."""
    rd, factored = p.reader, p.cfg.fmt == "factored"
    moved = {bias_key(rd, k): k for k in p.ranks if factored and bias_key(rd, k)}
    specs, shards, source, lmap = {}, [], {}, {}
    for fname, names in rd.shards:
        out_names = []
        for n in names:
            s = rd.specs[n]
            if factored and n in p.ranks:
                pre, r = prefix(n), p.ranks[n]
                (o, i) = s.shape
                items = [(f"{pre}.down.weight", (r, i), "down"), (f"{pre}.up.weight", (o, r), "up")]
                lmap[pre] = {"in": i, "out": o, "rank": r, "bias": bias_key(rd, n) is not None, "weight": n}
            elif n in moved:
                items = [(f"{prefix(moved[n])}.up.bias", tuple(s.shape), "copy")]
            else:
                items = [(n, tuple(s.shape), "dense" if n in p.ranks else "copy")]
            for name, shape, kind in items:
                if name in specs:
                    raise BadInputError(f"{rd.path}: output tensor {name!r} would be written twice (the checkpoint "
                                        "already has a factored name)")
                specs[name] = TensorSpec(name, s.dtype, shape)
                source[name] = (kind, n)
                out_names.append(name)
        shards.append((fname, out_names))
    if not factored:
        lmap = {prefix(k): {"in": rd.specs[k].shape[1], "out": rd.specs[k].shape[0], "rank": r, "dense": True,
                            "weight": k} for k, r in p.ranks.items()}
    return OutputLayout(rd, specs, shards), source, lmap


def row_source(reader: CheckpointReader, name: str, device) -> svd.Rows:
    """Weight `name` read in row blocks (positioned reads), each refused if it holds NaN/inf (the message then
    names the tensor and counts its non-finite values)."""
    spec = reader.specs[name]
    m, n = spec.shape

    def rows(a: int, b: int):
        t = torch.empty((b - a, n), dtype=spec.dtype)
        reader.get_range_into(name, a * n, b * n, t.view(-1))
        if not all_finite(t):
            read_checked(reader, name)
            raise BadInputError(f"{reader.path}: tensor {name!r} has non-finite values (NaN/inf)")
        return t.to(device)

    return svd.Rows((m, n), spec.dtype, rows, device)


def factor(rd: CheckpointReader, key: str, rank: int, cfg: CompressConfig, device, seed: int) -> svd.Factors:
    """Factor weight `key` on `device`; factors in float32 (float64 for float64 weights). The exact solver reads
    the weight in row blocks (twice) and never holds it whole; the randomized one reads it once, whole."""
    if cfg.svd == "exact":
        return svd.exact(row_source(rd, key, device), rank)
    w = read_checked(rd, key)
    w = w.to(device, svd.compute_dtype(w.dtype))
    return svd.randomized(w, rank, cfg.oversample, cfg.niter, derive(seed, "compress", "svd", key))


def layer_row(key: str, shape, f: svd.Factors, bias: bool) -> dict:
    """Per layer: weight params and MACs (out*in per sample) before, r(out+in) factored."""
    o, i = shape
    return {"key": key, "shape": [o, i], "rank": f.rank, "rel_fro_err": f.rel_fro_err, "solver": f.solver, "bias": bias,
            "params_before": o * i, "params_factored": f.rank * (o + i),
            "macs_before": o * i, "macs_factored": f.rank * (o + i)}


PIECES = {"down": lambda f: f.down, "up": lambda f: f.up, "dense": lambda f: f.up @ f.down}


def execute(p: Plan, out_path: Path, *, device="cpu", seed: int = 0, record: dict | None = None,
            progress=None) -> dict:
    """Write the output tensor by tensor in the writer's order; factors live until their pair is written."""
    rd = p.reader
    lay, source, lmap = layout(p)
    rows, cur = [], None
    rec = dict(record or {}, lowrank_map=lmap)
    with CheckpointWriter(lay, out_path, fmt=p.fmt, record=rec) as w:
        for k, name in enumerate(w.order):
            kind, src = source[name]
            if kind == "copy":
                t = read_checked(rd, src)
            else:
                if cur is None or cur[0] != src:
                    cur = None  # the previous layer's factors go before this layer's SVD starts
                    cur = (src, factor(rd, src, p.ranks[src], p.cfg, device, seed))
                    rows.append(layer_row(src, rd.specs[src].shape, cur[1], bias_key(rd, src) is not None))
                t = PIECES[kind](cur[1]).to("cpu", rd.specs[src].dtype)
            w.write(name, t)
            del t
            if progress:
                progress("compress", k + 1, len(w.order))
    return {"layers": rows, "lowrank_map": lmap, "out_specs": lay.specs}


def totals(rows: list[dict], in_specs: dict, out_specs: dict, secs: float, fmt: str) -> dict:
    """Parameter and MAC savings over the factored layers; bytes and throughput of the whole file."""
    pb, pf = sum(r["params_before"] for r in rows), sum(r["params_factored"] for r in rows)
    bytes_in = sum(s.nbytes for s in in_specs.values())
    return {"layers": len(rows), "params_before": pb, "params_factored": pf,
            "param_saving": 1 - pf / pb, "mac_saving": 1 - pf / pb,
            "checkpoint_params_in": sum(s.numel for s in in_specs.values()),
            "checkpoint_params_out": sum(s.numel for s in out_specs.values()),
            "bytes_in": bytes_in, "bytes_out": sum(s.nbytes for s in out_specs.values()),
            "max_rel_fro_err": max(r["rel_fro_err"] for r in rows),
            "seconds": round(secs, 3), "gb_per_s": bytes_in / 1e9 / secs if secs > 0 else None, "format": fmt}


OUT_NAMES = {"safetensors": "compressed.safetensors", "torch": "compressed.pt"}


def prepare(path, cfg: CompressConfig, device="cpu") -> Plan:
    """Open the checkpoint and plan every rank (all input errors surface here, before any output exists)."""
    rd = open_checkpoint(path)
    try:
        return plan(rd, cfg, device)
    except BaseException:
        rd.close()
        raise


def compress_checkpoint(path, out_dir, cfg: CompressConfig, *, device="cpu", seed: int = 0, progress=None) -> dict:
    """Open, plan, write `compressed.*` and `lowrank_map.json` into `out_dir` (both or neither)."""
    return run_plan(prepare(path, cfg, device), out_dir, device=device, seed=seed, progress=progress)


def run_plan(p: Plan, out_dir, *, device="cpu", seed: int = 0, progress=None) -> dict:
    """Write the planned output (closes the reader)."""
    import json

    from icmltools.core.jsonio import atomic_path

    from .options import MAP_NAME

    t0 = time.perf_counter()
    cfg = p.cfg
    with p.reader as rd:
        out_path = Path(out_dir) / OUT_NAMES.get(p.fmt, "compressed")
        record = {"method": "lowrank-svd", "source": str(rd.path), "format": cfg.fmt, "svd": cfg.svd,
                  "rank_ratio": cfg.rank_ratio, "energy": cfg.energy, "seed": seed}
        with atomic_path(Path(out_dir) / MAP_NAME) as tmp_map:
            done = execute(p, out_path, device=device, seed=seed, record=record, progress=progress)
            tmp_map.write_text(json.dumps(done["lowrank_map"], indent=1))
        secs = time.perf_counter() - t0
        return {"input": str(rd.path), "input_format": rd.format, "output": str(out_path),
                "map": str(Path(out_dir) / MAP_NAME), "format": cfg.fmt, "svd": cfg.svd,
                "totals": totals(done["layers"], rd.specs, done["out_specs"], secs, p.fmt),
                "layers": done["layers"], "skipped": p.skipped,
                "copied": sum(1 for v in rd.specs if v not in p.ranks)}
