"""Check a factored checkpoint against its low-rank map (and, optionally, the dense checkpoint it came from).

The structure a factored file must fit is the dense model with each mapped nn.Linear swapped for
`LowRank(in, out, r)` (`nets.swap_to_lowrank`): `<p>.down.weight` [r, in], `<p>.up.weight` [out, r] and the bias
as `<p>.up.bias` [out]; a `--format dense` entry keeps `<p>.weight` [out, in]. Shapes are compared from the
headers first (a missing, extra or differently shaped tensor is one error naming it and both shapes), then each
mapped layer is loaded with `load_state_dict(strict=True)` into its own `LowRank` module, one layer at a time
(its tensors read and checked for NaN/inf): the whole file is never resident.
"""
from __future__ import annotations

import json
from pathlib import Path

from icmltools.core.errors import BadInputError
from icmltools.taskvec import CheckpointReader, open_checkpoint, read_record

from .compress import prefix, read_checked
from .options import MAP_NAME


def locate(path) -> tuple[Path, Path | None]:
    """A run folder of `compress` (compressed.* and lowrank_map.json inside) -> (checkpoint, map); else (path, None)."""
    p = Path(path)
    if p.is_dir() and (p / MAP_NAME).is_file():
        inside = sorted(q for q in p.iterdir() if q.name.startswith("compressed") and not q.name.endswith(".json"))
        if inside:
            return inside[0], p / MAP_NAME
    return p, None


def load_map(ckpt: Path, map_path=None, found: Path | None = None) -> tuple[dict, str]:
    """The map: `map_path`; else the one in the run folder; else the checkpoint's record; else lowrank_map.json
    beside the checkpoint."""
    candidates = [Path(map_path)] if map_path else [q for q in (found,) if q is not None]
    if not candidates:
        rec = read_record(ckpt).get("lowrank_map") if ckpt.exists() else None
        if isinstance(rec, dict):
            return validate_map(rec, f"{ckpt} (record)"), f"{ckpt} (record)"
        candidates = [ckpt.parent / MAP_NAME]
    p = candidates[0]
    if not p.is_file():
        raise BadInputError(f"{p}: no such map file" if map_path else
                            f"{ckpt}: no low-rank map found (not in its record, no {MAP_NAME} beside it)", param="map_path")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(f"{p}: not a JSON low-rank map ({e})", param="map_path") from None
    return validate_map(doc, str(p)), str(p)


def validate_map(doc, source: str) -> dict:
    """{prefix: {in, out, rank, bias?, dense?, weight?}} with positive integer sizes and rank <= min(in, out)."""
    if not isinstance(doc, dict) or not doc:
        raise BadInputError(f"{source}: a low-rank map is a non-empty JSON object {{prefix: {{in, out, rank}}}}", param="map_path")
    for p, e in doc.items():
        sizes = [e.get(k) for k in ("in", "out", "rank")] if isinstance(e, dict) else [None]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
            raise BadInputError(f"{source}: entry {p!r} needs positive integers in, out and rank", param="map_path")
        if e["rank"] > min(e["in"], e["out"]):
            raise BadInputError(f"{source}: entry {p!r} has rank {e['rank']} above min(in, out) = "
                                f"{min(e['in'], e['out'])}", param="map_path")
    return doc


def layer_names(p: str, e: dict) -> dict:
    """name -> expected shape of one map entry in the swapped structure."""
    if e.get("dense"):
        return {e.get("weight", p + ".weight"): (e["out"], e["in"])}
    names = {f"{p}.down.weight": (e["rank"], e["in"]), f"{p}.up.weight": (e["out"], e["rank"])}
    if e.get("bias"):
        names[f"{p}.up.bias"] = (e["out"],)
    return names


def expected_from_model(lmap: dict, model: CheckpointReader) -> dict:
    """The dense checkpoint's names and shapes with every mapped layer swapped (what load_state_dict(strict=True)
    into the swapped model needs); a map entry that does not fit the dense model is an error naming both."""
    by_weight = {e.get("weight", p + ".weight"): p for p, e in lmap.items()}
    missing = [w for w in by_weight if w not in model.specs]
    if missing:
        raise BadInputError(f"{model.path}: the model has no tensor {missing[0]!r} named in the low-rank map "
                            f"({len(missing)} of {len(by_weight)} missing)", param="model_ckpt")
    want: dict = {}
    moved = set()
    for w, p in by_weight.items():
        e, shape = lmap[p], tuple(model.specs[w].shape)
        if shape != (e["out"], e["in"]):
            raise BadInputError(f"{model.path}: tensor {w!r} has shape {list(shape)}, the low-rank map says "
                                f"[{e['out']}, {e['in']}]", param="model_ckpt")
        b = prefix(w) + ".bias"
        if not e.get("dense") and b in model.specs:
            moved.add(b)
            want[f"{p}.up.bias"] = tuple(model.specs[b].shape)
        want.update({k: v for k, v in layer_names(p, e).items() if not k.endswith(".up.bias")})
    for k, s in model.specs.items():
        if k not in by_weight and k not in moved:
            want[k] = tuple(s.shape)
    return want


def compare(rd: CheckpointReader, want: dict, strict_extra: bool) -> list[str]:
    """Missing/extra/shape errors as one BadInputError naming the first tensor; the unchecked extra names."""
    missing = [k for k in want if k not in rd.specs]
    extra = [k for k in rd.specs if k not in want]
    if missing or (extra and strict_extra):
        k = (missing or extra)[0]
        raise BadInputError(f"{rd.path}: tensor {k!r} is {'missing' if missing else 'not in the model'}"
                            f" ({len(missing)} missing, {len(extra) if strict_extra else 0} extra)")
    for k, shape in want.items():
        got = tuple(rd.specs[k].shape)
        if got != tuple(shape):
            raise BadInputError(f"{rd.path}: tensor {k!r} has shape {list(got)}, the low-rank model expects "
                                f"{list(shape)}")
    return extra


def load_layer(rd: CheckpointReader, p: str, e: dict) -> None:
    """Strict load of one mapped layer into its own module (LowRank, or nn.Linear for a dense entry)."""
    from torch import nn

    from .nets import LowRank

    if e.get("dense"):
        mod, names = nn.Linear(e["in"], e["out"], bias=False), {"weight": e.get("weight", p + ".weight")}
    else:
        mod = LowRank(e["in"], e["out"], e["rank"], bias=bool(e.get("bias")))
        names = {k[len(p) + 1:]: k for k in layer_names(p, e)}
    mod.load_state_dict({local: read_checked(rd, full) for local, full in names.items()}, strict=True)


def check(factored, map_path=None, model_ckpt=None, progress=None) -> dict:
    """Verify `factored` against its map (and the dense `model_ckpt`): per-layer shapes, ranks, parameters."""
    ckpt, found = locate(factored)
    lmap, map_source = load_map(ckpt, map_path, found)
    with open_checkpoint(ckpt) as rd:
        if model_ckpt is not None:
            with open_checkpoint(model_ckpt) as model:
                want = expected_from_model(lmap, model)
        else:
            want = {k: v for p, e in lmap.items() for k, v in layer_names(p, e).items()}
        extra = compare(rd, want, strict_extra=model_ckpt is not None)
        rows = []
        for i, (p, e) in enumerate(lmap.items()):
            load_layer(rd, p, e)
            factored_params = e["out"] * e["in"] if e.get("dense") else e["rank"] * (e["in"] + e["out"])
            rows.append({"prefix": p, "shape": [e["out"], e["in"]], "rank": e["rank"], "bias": bool(e.get("bias")),
                         "format": "dense" if e.get("dense") else "factored", "params_dense": e["out"] * e["in"],
                         "params_factored": factored_params})
            if progress:
                progress("check", i + 1, len(lmap))
    pd, pf = sum(r["params_dense"] for r in rows), sum(r["params_factored"] for r in rows)
    return {"checkpoint": str(ckpt), "map": map_source, "model": None if model_ckpt is None else str(model_ckpt),
            "strict_load": True, "layers": rows,
            "totals": {"layers": len(rows), "params_dense": pd, "params_factored": pf, "param_saving": 1 - pf / pd,
                       "tensors_checked": len(want), "tensors_not_checked": len(extra)}}
