"""mergekit YAML configs for the methods both tools have, so a mergekit user can switch with their file.

Read (with ``yaml.safe_load``): ``merge_method``, ``base_model``, ``models`` (each ``model`` with optional
``parameters``: ``weight``, ``density``, and for ``cabs`` ``n_m_ratio: [n, m]``), top-level ``parameters``
(defaults of the per-model ones; ``cabs``: ``default_n_m_ratio``, ``pruning_order``; the others
``normalize`` (a boolean; unset: mergekit's default, true for ties only), ``lambda`` (a number: the merged
vector's scale), ``rescale`` (DARE's: true, the default, rescales by 1/density, false drops alone; the other
methods: false only, their default), breadcrumbs' ``gamma`` (top level only), ``int8_mask`` (true or false:
the dtype of mergekit's sign mask, which holds -1, 0 and 1 exactly in either, so the merge is the same; accepted
and not used); a density left unset is mergekit's 1.0; weight and density may be set per tensor: gradients and
filter conditions, :func:`evaluate`), ``dtype`` and ``out_dtype`` (the output dtype of the floating tensors:
``out_dtype`` if set, else ``dtype``, as mergekit writes them; the merge itself computes in float32, where
mergekit computes in ``dtype``), ``tokenizer_source`` (base or union where every vocabulary is the base's:
:func:`same_vocabulary`). Anything else (``slices``, ``tokenizer``, an unknown method or parameter) is refused in
one line naming it: a silently ignored field would merge something else than the file asks for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from icmltools.core.errors import BadInputError
from icmltools.merge.options import OUT_DTYPES

# mergekit merge_method -> ours
METHODS = {"cabs": "cabs", "task_arithmetic": "task_arithmetic", "ties": "ties", "dare_linear": "dare",
           "dare_ties": "dare_ties", "breadcrumbs": "breadcrumbs", "breadcrumbs_ties": "breadcrumbs_ties"}
CABS_FALLBACK_NM = (1, 4)   # the authors' mergekit method when neither n_m_ratio nor default_n_m_ratio is set
TOP_KEYS = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "tokenizer_source"}
TOKENIZER_SOURCES = ("base", "union")   # the same output as no tokenizer_source when every vocabulary is the base's
MODEL_KEYS = {"model", "parameters"}
MODEL_PARAMS = {"cabs": {"weight", "n_m_ratio"}, "task_arithmetic": {"weight"}, "ties": {"weight", "density"},
                "dare_linear": {"weight", "density"}, "dare_ties": {"weight", "density"},
                "breadcrumbs": {"weight", "density"}, "breadcrumbs_ties": {"weight", "density"}}
GTA_PARAMS = {"normalize", "lambda", "int8_mask", "rescale"}   # mergekit's generalized task arithmetic (not cabs)
GLOBAL_PARAMS = {"cabs": {"default_n_m_ratio", "pruning_order"}, "task_arithmetic": GTA_PARAMS, "ties": GTA_PARAMS,
                 "dare_linear": GTA_PARAMS, "dare_ties": GTA_PARAMS,
                 "breadcrumbs": GTA_PARAMS | {"gamma"}, "breadcrumbs_ties": GTA_PARAMS | {"gamma"}}
FLAGS = ("normalize", "rescale", "int8_mask")       # booleans in mergekit: a string such as "no" is refused
NOT_OPTIONS = {"default_n_m_ratio", "pruning_order", "int8_mask"}  # read here; int8_mask changes nothing (above)
TENSOR_PARAMS = ("weight", "density")   # per model, settable per tensor (filters, layer gradients)
NORMALIZED = {"ties"}   # mergekit 0.1.5's default_normalize is true for these only (our own dare_ties: true)
RESCALED = {"dare_linear", "dare_ties"}   # mergekit 0.1.5's default_rescale is true for these (della too)
ELECTING = {"ties", "dare_ties", "breadcrumbs_ties"}   # mergekit's sum consensus: a sum of 0 elects + there


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
    params: dict = field(default_factory=dict)   # our method's options, and "lambda" (_global_params)
    warnings: list = field(default_factory=list)
    out_dtype: str = "same"               # out_dtype, else dtype, else each tensor keeps its own
    tokenizer_source: str | None = None   # base / union: checked by same_vocabulary before the merge
    tensor: "TensorSettings | None" = None  # per-tensor weights / densities (filters, gradients), else None


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


def _value(path, where: str, v, lo, hi):
    """A number, or a gradient: a non-empty list of numbers."""
    if isinstance(v, list):
        if not v:
            _fail(path, f"{where}: an empty list (a gradient needs at least one number)")
        return ("gradient", tuple(_number(path, f"{where}[{j}]", x, lo, hi) for j, x in enumerate(v)))
    return _number(path, where, v, lo, hi)


def _setting(path, where: str, v, lo: float | None = None, hi: float | None = None):
    """A per-tensor setting of a weight or density as mergekit's ``ParameterSetting`` (config.py): a number; a
    gradient (numbers interpolated over the layers); or a list of conditions ``{filter, value}`` (value a number
    or a gradient; the first whose filter is in the tensor name, or is unset or "*", applies). Returned as a float,
    ("gradient", values) or ("conds", ((filter or None, value), ...))."""
    if isinstance(v, dict):
        _fail(path, f"{where}: a condition goes in a list ([{{filter: ..., value: ...}}]; mergekit refuses a "
                    "lone mapping too)")
    if not (isinstance(v, list) and v and any(isinstance(e, dict) for e in v)):
        return _value(path, where, v, lo, hi)
    conds = []
    for j, c in enumerate(v):
        at = f"{where}[{j}]"
        if not isinstance(c, dict):
            _fail(path, f"{at}: expected {{filter: ..., value: ...}} like the other entries, got {c!r}")
        _check_keys(path, c, {"filter", "value"}, at)
        if "value" not in c:
            _fail(path, f"{at}: no value")
        f = c.get("filter")
        if f is not None and not isinstance(f, str):
            _fail(path, f"{at}.filter: expected a string (a part of tensor names), got {f!r}")
        conds.append((None if f in (None, "*") else f, _value(path, f"{at}.value", c["value"], lo, hi)))
    return ("conds", tuple(conds))


def evaluate(setting, name: str, t: float) -> float | None:
    """mergekit's evaluate_setting (config.py) for tensor `name` at layer position t in [0, 1]: a gradient of n
    values is linear between values i0 = int(t (n - 1)) and i0 + 1; conditions give their first match, else
    None (the next level's setting applies)."""
    if not isinstance(setting, tuple):
        return setting
    kind, body = setting
    if kind == "gradient":
        scaled = t * (len(body) - 1)
        i0 = int(scaled)
        i1 = min(len(body) - 1, i0 + 1)
        frac = scaled - i0
        return (1 - frac) * body[i0] + frac * body[i1]
    for f, value in body:
        if f is None or f in name:
            return evaluate(value, name, t)
    return None


LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)\.")


def layer_positions(names) -> Callable[[str], float]:
    """A tensor's t as mergekit 0.1.5's planner gives it (plan.py, plan_module / plan_slice): layer i of L gets
    i / (L - 1) (1 when L is 1); every tensor outside the layers (embeddings, the final norm, lm_head) gets 0
    (0.1.5's reader for them is made with t = 0; an older planner gave the ones after the layers 1; checked
    against mergekit 0.1.5's output, docs/cabs-merge.md). The layers are the names' ``layers.N.`` / ``layer.N.`` /
    ``h.N.`` / ``blocks.N.`` and L is 1 + the largest N (mergekit reads L from config.json: the same for a whole
    model)."""
    index = {n: int(m.group(1)) for n in names if (m := LAYER.search(n))}
    n_layers = 1 + max(index.values(), default=-1)

    def position(name: str) -> float:
        if name not in index:
            return 0.0
        return index[name] / (n_layers - 1) if n_layers > 1 else 1.0

    return position


@dataclass
class TensorSettings:
    """The per-tensor weights / densities of a config whose settings are not all plain numbers: per model (in
    the merge order) its own setting or None, then the top-level one, then the default (mergekit's lookup:
    ConfigReader.parameter)."""

    own: dict       # "weight" / "density" -> [setting or None per model]
    top: dict       # "weight" / "density" -> setting or None
    raw: dict       # as written, for the record

    def bind(self, names) -> Callable[[str], dict]:
        """name -> {"weights": .., "densities": ..} (densities only where the method has them)."""
        position = layer_positions(names)

        def values(key: str, name: str, t: float, default) -> tuple:
            out = []
            for s in self.own[key]:
                v = evaluate(s, name, t) if s is not None else None
                if v is None and self.top[key] is not None:
                    v = evaluate(self.top[key], name, t)
                out.append(default if v is None else v)
            return tuple(out)

        def params(name: str) -> dict:
            t = position(name)
            got = {"weights": values("weight", name, t, 1.0)}
            if "density" in self.own:
                got["densities"] = values("density", name, t, 1.0)
            return got

        params.describe = lambda: self.raw
        return params


def _per_model(path, mk: str, entry, top_nm, i: int) -> dict:
    """Model i's own settings (weight / density as :func:`_setting`s, as written in "raw") and its n:m."""
    params = entry.get("parameters") or {} if isinstance(entry, dict) else {}
    if isinstance(entry, dict):
        _check_keys(path, entry, MODEL_KEYS, f"models[{i}]")
    if not isinstance(params, dict):
        _fail(path, f"models[{i}].parameters: expected a mapping")
    _check_keys(path, params, MODEL_PARAMS[mk], f"models[{i}].parameters")
    out = {"nm": None, "raw": {k: params[k] for k in TENSOR_PARAMS if params.get(k) is not None}}
    for key, lo, hi in (("weight", None, None), ("density", 0.0, 1.0)):
        if params.get(key) is not None:
            out[key] = _setting(path, f"models[{i}].{key}", params[key], lo, hi)
    nm = params.get("n_m_ratio", top_nm)
    if nm is not None:
        out["nm"] = _nm(path, f"models[{i}].n_m_ratio", nm)
    return out


def _order(path, refs: list, order) -> list[int]:
    """cabs `pruning_order` (model names) -> indices; mergekit sorts by name when it is unset."""
    if order is None:
        return sorted(range(len(refs)), key=lambda i: refs[i])
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(refs):
        _fail(path, "parameters.pruning_order: expected every model of `models` exactly once")
    return [refs.index(str(name)) for name in order]


def _global_params(path: Path, mk: str, glob: dict) -> dict:
    """The top-level parameters as our method's options, and ``lambda`` (a number, the merged vector's scale):
    flags checked, mergekit 0.1.5's defaults filled (normalize; the sign-electing methods elect + where the sum is
    0, as mergekit's get_mask); ``rescale`` kept for DARE only (false, the others' default, changes nothing there;
    their true, mergekit's L1-norm match after the trim, is refused)."""
    for key in FLAGS:
        if key in glob and not isinstance(glob[key], bool):
            _fail(path, f"parameters.{key}: expected true or false, got {glob[key]!r}")
    if glob.get("lambda") is not None:   # one number: the merged vector's scale (no per-tensor setting here)
        glob = {**glob, "lambda": _number(path, "parameters.lambda", glob["lambda"])}
    params = {k: v for k, v in glob.items() if k in GLOBAL_PARAMS[mk] and k not in NOT_OPTIONS}
    if "normalize" in GLOBAL_PARAMS[mk]:
        params.setdefault("normalize", mk in NORMALIZED)
    if mk not in RESCALED and params.pop("rescale", False):
        _fail(path, f"parameters.rescale: true is not supported for {mk} (mergekit would scale each pruned task "
                    "vector to its L1 norm; false, the default, is)")
    if mk in ELECTING:   # get_mask: majority sign = + where the weighted sum is >= 0 (ours by default: none at 0)
        params["elect_zero"] = "plus"
    return params


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
    top = {k: _setting(path, f"parameters.{k}", glob[k], *((0.0, 1.0) if k == "density" else (None, None)))
           for k in TENSOR_PARAMS if k in MODEL_PARAMS[mk] and glob.get(k) is not None}
    base_ref = _model_ref(path, doc["base_model"], "base_model")
    refs = [_model_ref(path, e, f"models[{i}]") for i, e in enumerate(models)]
    per = [_per_model(path, mk, e, glob.get("n_m_ratio"), i) for i, e in enumerate(models)]
    keep = [i for i, r in enumerate(refs) if r != base_ref]     # mergekit lists the base among models too
    refs, per = [refs[i] for i in keep], [per[i] for i in keep]
    if not refs:
        _fail(path, "models: no model besides base_model")
    order = _order(path, refs, glob.get("pruning_order")) if mk == "cabs" else list(range(len(refs)))
    per = [per[i] for i in order]
    keys = [k for k in TENSOR_PARAMS if k in MODEL_PARAMS[mk]]
    settings = [p.get(k, top.get(k)) for p in per for k in keys]
    per_tensor = any(isinstance(s, tuple) for s in settings)
    default_nm = _nm(path, "parameters.default_n_m_ratio", glob["default_n_m_ratio"]) \
        if glob.get("default_n_m_ratio") is not None else None
    params = _global_params(path, mk, glob)
    tensor = None
    if per_tensor:   # the plan's own weights / densities are placeholders: every tensor gets its own
        tensor = TensorSettings(own={k: [p.get(k) for p in per] for k in keys}, top={k: top.get(k) for k in keys},
                                raw={"models": [p["raw"] for p in per],
                                     "parameters": {k: glob[k] for k in keys if glob.get(k) is not None}})
    cfg = MergekitConfig(method=METHODS[mk], mergekit_method=mk, base=_resolve(path, base_ref),
                         models=[_resolve(path, refs[i]) for i in order],
                         weights=[1.0 if per_tensor else p.get("weight", top.get("weight", 1.0)) for p in per],
                         densities=[None if per_tensor else p.get("density", top.get("density")) for p in per],
                         nms=[p["nm"] or default_nm or CABS_FALLBACK_NM for p in per], params=params,
                         tensor=tensor)
    for key in ("out_dtype", "dtype"):
        if doc.get(key) is not None:
            cfg.out_dtype = _dtype(path, key, doc[key])
            break
    if doc.get("tokenizer_source") is not None:
        if doc["tokenizer_source"] not in TOKENIZER_SOURCES:
            _fail(path, f"tokenizer_source: {doc['tokenizer_source']!r} is not supported (base or union, when every "
                        "model's vocabulary is the base's)")
        cfg.tokenizer_source = doc["tokenizer_source"]
    return cfg


def _vocabulary(folder: Path) -> dict | None:
    """token -> id of a Hugging Face folder's tokenizer.json (the model's vocabulary and the added tokens, as
    transformers' get_vocab), or None where the folder has no tokenizer.json."""
    import json

    f = folder / "tokenizer.json"
    if not f.is_file():
        return None
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
        vocab = doc["model"]["vocab"]
        out = dict(vocab) if isinstance(vocab, dict) else {piece[0]: i for i, piece in enumerate(vocab)}
        out.update({t["content"]: t["id"] for t in doc.get("added_tokens") or []})
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise BadInputError(f"{f}: not a tokenizer.json this reads ({type(e).__name__}: {e})", param="config") from None
    return out


def _vocab_size(folder: Path):
    import json

    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None


def same_vocabulary(path, cfg: MergekitConfig) -> None:
    """tokenizer_source base / union (mergekit's tokenizer/build.py, embed.py): the vocabulary-indexed tensors
    are rebuilt row by row in the output vocabulary's order (ids >= config vocab_size stripped first, then
    len(vocab) rows) and the base's tokenizer is written. That is the plain merge exactly when the base's
    vocabulary (tokenizer.json: token -> id, added tokens included) has the ids 0..V-1 with V its config.json
    vocab_size (the embeddings' rows), and every model's is the same (mergekit takes the base's for a model
    without a tokenizer): checked here, anything else refused naming the difference."""
    base = Path(cfg.base)
    vb = _vocabulary(base) if base.is_dir() else None
    if vb is None:
        _fail(path, f"tokenizer_source: {base} has no tokenizer.json (a Hugging Face folder's), so the vocabularies "
                    "cannot be compared")
    v = _vocab_size(base)
    if sorted(vb.values()) != list(range(len(vb))) or v != len(vb):
        ids = f"{min(vb.values(), default=None)}..{max(vb.values(), default=None)}"
        _fail(path, f"tokenizer_source: {base}'s vocabulary has {len(vb)} tokens (ids {ids}) for vocab_size {v}: "
                    "mergekit would resize the embeddings; not supported")
    for m in map(Path, cfg.models):
        if not m.is_dir():
            _fail(path, f"tokenizer_source: {m} is not a Hugging Face folder (mergekit reads its tokenizer there)")
        vm = _vocabulary(m)
        if vm is not None and vm != vb:
            diff = sorted(set(vm.items()) ^ set(vb.items()), key=str)[:3]
            _fail(path, f"tokenizer_source: {m}'s vocabulary is not the base's (e.g. {diff}); mergekit would "
                        "permute the embeddings; not supported")
        if _vocab_size(m) not in (None, v):
            _fail(path, f"tokenizer_source: {m}'s vocab_size {_vocab_size(m)} is not the base's {v}")


def _dtype(path, key: str, value) -> str:
    """A config's dtype name as ours (a "torch." prefix allowed, as mergekit's dtype_from_name does)."""
    name = value.removeprefix("torch.") if isinstance(value, str) else value
    if name not in OUT_DTYPES:
        _fail(path, f"{key}: {value!r} is not supported (use {', '.join(OUT_DTYPES)})")
    return name
