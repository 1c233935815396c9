"""mergekit YAML configs for the methods both tools have, so a mergekit user can switch with their file.

Read (with ``yaml.safe_load``): ``merge_method``, ``base_model``, ``models`` (each ``model`` with optional
``parameters``: ``weight``, ``density``, and for ``cabs`` ``n_m_ratio: [n, m]``), top-level ``parameters``
(defaults of the per-model ones; ``cabs``: ``default_n_m_ratio``, ``pruning_order``; the others
``normalize`` (a boolean), ``lambda`` (1 only), ``rescale`` (true only), breadcrumbs' ``gamma`` (top level only),
``int8_mask`` (true or false: the dtype of mergekit's sign mask, which holds -1, 0 and 1 exactly in either, so
the merge is the same; accepted and not used); a density left unset is mergekit's 1.0), ``dtype`` and
``out_dtype`` (the output dtype of the floating tensors: ``out_dtype`` if set, else ``dtype``, as mergekit writes
them; the merge itself computes in float32, where mergekit computes in ``dtype``). Anything else (``slices``,
``tokenizer_source``, an unknown method or parameter) is refused in one line naming it: a silently ignored field
would merge something else than the file asks for.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from icmltools.core.errors import BadInputError
from icmltools.merge.options import OUT_DTYPES

# mergekit merge_method -> ours
METHODS = {"cabs": "cabs", "task_arithmetic": "task_arithmetic", "ties": "ties", "dare_linear": "dare",
           "dare_ties": "dare_ties", "breadcrumbs": "breadcrumbs"}
CABS_FALLBACK_NM = (1, 4)   # the authors' mergekit method when neither n_m_ratio nor default_n_m_ratio is set
TOP_KEYS = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype"}
MODEL_KEYS = {"model", "parameters"}
MODEL_PARAMS = {"cabs": {"weight", "n_m_ratio"}, "task_arithmetic": {"weight"}, "ties": {"weight", "density"},
                "dare_linear": {"weight", "density"}, "dare_ties": {"weight", "density"},
                "breadcrumbs": {"weight", "density"}}
GTA_PARAMS = {"normalize", "lambda", "int8_mask"}   # mergekit's generalized task arithmetic: every method but cabs
GLOBAL_PARAMS = {"cabs": {"default_n_m_ratio", "pruning_order"}, "task_arithmetic": GTA_PARAMS, "ties": GTA_PARAMS,
                 "dare_linear": GTA_PARAMS | {"rescale"}, "dare_ties": GTA_PARAMS | {"rescale"},
                 "breadcrumbs": GTA_PARAMS | {"gamma"}}
FLAGS = ("normalize", "rescale", "int8_mask")       # booleans in mergekit: a string such as "no" is refused
NOT_OPTIONS = {"default_n_m_ratio", "pruning_order", "int8_mask"}  # read here; int8_mask changes nothing (above)


@dataclass
class MergekitConfig:
    """A parsed config: our method name, paths in the merge order, per-model parameters, global ones."""

    method: str
    mergekit_method: str
    base: str
    models: list
    weights: list
    densities: list                       # per model, None where unset
    nms: list                             # cabs: per model (n, m)
    params: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    out_dtype: str = "same"               # out_dtype, else dtype, else each tensor keeps its own


def _fail(path, msg: str):
    raise BadInputError(f"{path}: {msg}", param="config")


def _model_ref(path, entry, where: str) -> str:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("model"), str):
        return entry["model"]
    _fail(path, f"{where}: expected a model path, got {entry!r}")


def _resolve(path: Path, ref: str) -> str:
    p = Path(ref).expanduser()
    return str(p if p.is_absolute() or p.exists() else (path.parent / p))


def _number(path, where: str, v, lo: float | None = None, hi: float | None = None) -> float:
    import math

    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        _fail(path, f"{where}: expected a finite number, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        _fail(path, f"{where}: {v} is outside [{lo}, {hi}]")
    return float(v)


def _nm(path, where: str, v):
    if (not isinstance(v, (list, tuple)) or len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            or not 1 <= v[0] <= v[1]):
        _fail(path, f"{where}: expected [n, m] with 1 <= n <= m, got {v!r}")
    return int(v[0]), int(v[1])


def _load(path: Path) -> dict:
    import yaml

    from icmltools.core.files import check_input_file

    check_input_file(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        _fail(path, f"not a YAML file ({str(e).splitlines()[0]})")
    if not isinstance(doc, dict):
        _fail(path, "expected a mergekit config (a mapping with merge_method, base_model, models)")
    return doc


def _check_keys(path, got, allowed, where: str) -> None:
    extra = sorted(set(got) - set(allowed))
    if extra:
        _fail(path, f"{where}: {', '.join(map(str, extra))} not supported (supported: {', '.join(sorted(allowed))})")


def _per_model(path, mk: str, entry, defaults: dict, i: int) -> dict:
    params = entry.get("parameters") or {} if isinstance(entry, dict) else {}
    if isinstance(entry, dict):
        _check_keys(path, entry, MODEL_KEYS, f"models[{i}]")
    if not isinstance(params, dict):
        _fail(path, f"models[{i}].parameters: expected a mapping")
    _check_keys(path, params, MODEL_PARAMS[mk], f"models[{i}].parameters")
    merged = {**defaults, **params}
    out = {"weight": _number(path, f"models[{i}].weight", merged.get("weight", 1.0)),
           "density": None, "nm": None}
    if merged.get("density") is not None:
        out["density"] = _number(path, f"models[{i}].density", merged["density"], 0.0, 1.0)
    if merged.get("n_m_ratio") is not None:
        out["nm"] = _nm(path, f"models[{i}].n_m_ratio", merged["n_m_ratio"])
    return out


def _order(path, refs: list, order) -> list[int]:
    """cabs `pruning_order` (model names) -> indices; mergekit sorts by name when it is unset."""
    if order is None:
        return sorted(range(len(refs)), key=lambda i: refs[i])
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(refs):
        _fail(path, "parameters.pruning_order: expected every model of `models` exactly once")
    return [refs.index(str(name)) for name in order]


def read_config(path) -> MergekitConfig:
    """Parse and validate a mergekit config (nothing is read from the model paths yet)."""
    path = Path(path)
    doc = _load(path)
    _check_keys(path, doc, TOP_KEYS, "top level")
    mk = doc.get("merge_method")
    if mk not in METHODS:
        _fail(path, f"merge_method {mk!r} is not supported (supported: {', '.join(METHODS)})")
    if doc.get("base_model") is None:
        _fail(path, f"{mk} needs base_model")
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        _fail(path, "models: expected a non-empty list")
    glob = doc.get("parameters") or {}
    if not isinstance(glob, dict):
        _fail(path, "parameters: expected a mapping")
    _check_keys(path, glob, MODEL_PARAMS[mk] | GLOBAL_PARAMS[mk], "parameters")
    defaults = {k: v for k, v in glob.items() if k in MODEL_PARAMS[mk]}
    base_ref = _model_ref(path, doc["base_model"], "base_model")
    refs = [_model_ref(path, e, f"models[{i}]") for i, e in enumerate(models)]
    per = [_per_model(path, mk, e, defaults, i) for i, e in enumerate(models)]
    keep = [i for i, r in enumerate(refs) if r != base_ref]     # mergekit lists the base among models too
    refs, per = [refs[i] for i in keep], [per[i] for i in keep]
    if not refs:
        _fail(path, "models: no model besides base_model")
    order = _order(path, refs, glob.get("pruning_order")) if mk == "cabs" else list(range(len(refs)))
    default_nm = _nm(path, "parameters.default_n_m_ratio", glob["default_n_m_ratio"]) \
        if glob.get("default_n_m_ratio") is not None else None
    for key in FLAGS:
        if key in glob and not isinstance(glob[key], bool):
            _fail(path, f"parameters.{key}: expected true or false, got {glob[key]!r}")
    params = {k: v for k, v in glob.items() if k in GLOBAL_PARAMS[mk] and k not in NOT_OPTIONS}
    cfg = MergekitConfig(method=METHODS[mk], mergekit_method=mk, base=_resolve(path, base_ref),
                         models=[_resolve(path, refs[i]) for i in order], weights=[per[i]["weight"] for i in order],
                         densities=[per[i]["density"] for i in order],
                         nms=[per[i]["nm"] or default_nm or CABS_FALLBACK_NM for i in order], params=params)
    for key in ("out_dtype", "dtype"):
        if doc.get(key) is not None:
            cfg.out_dtype = _dtype(path, key, doc[key])
            break
    return cfg


def _dtype(path, key: str, value) -> str:
    """A config's dtype name as ours (a "torch." prefix allowed, as mergekit's dtype_from_name does)."""
    name = value.removeprefix("torch.") if isinstance(value, str) else value
    if name not in OUT_DTYPES:
        _fail(path, f"{key}: {value!r} is not supported (use {', '.join(OUT_DTYPES)})")
    return name
