"""The one entry point of `icml subset-select`: resolve the defaults, load inputs, select or evaluate, write
index files. `run(cfg)` returns (result, artifacts); `resolve(cfg)` shows the defaults it would pick."""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import atomic_path
from icmltools.core.seed import derive

from . import io, options
from .data import Dataset, digits, inject_noise, synthetic
from .engine import Engine
from .evaluate import evaluate
from .options import Config
from .select import CITATIONS, METHODS, Context, check_rate, select_many

log = logging.getLogger(__name__)

__all__ = ["Config", "resolve", "run", "load_user", "run_select", "eval_inputs", "write_indices"]

EMBEDDED = options.DATASETS


def resolve(cfg: Config) -> Config:
    """Fill what the user left open: evaluation is on for the embedded data and off for feature files;
    methods and rates default to `options.EVALUATE_*` when evaluating, `options.SELECT_*` when selecting."""
    do_eval = cfg.evaluate if cfg.evaluate is not None else not cfg.features
    methods = cfg.methods or (options.EVALUATE_METHODS if do_eval else options.SELECT_METHODS)
    rates = cfg.rates or (options.EVALUATE_RATES if do_eval else options.SELECT_RATES)
    return replace(cfg, evaluate=bool(do_eval), methods=tuple(dict.fromkeys(methods)),
                   rates=tuple(dict.fromkeys(float(p) for p in rates)))


def validate(cfg: Config) -> None:
    """Checks that need no data (run after `resolve`)."""
    for p in cfg.rates:
        check_rate(p)
    bad = [m for m in cfg.methods if m not in METHODS]
    if bad:
        raise BadInputError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}", param="methods")
    if not 0.0 <= cfg.noise < 1.0:
        raise BadInputError(f"{cfg.noise}: must lie in [0, 1)", param="noise")
    if not cfg.features:
        if cfg.labels:
            raise BadInputError("given without feature files (the embedded data brings its own labels)",
                                param="labels")
        if cfg.dataset not in EMBEDDED:
            raise BadInputError(f"unknown dataset {cfg.dataset!r}; use {' or '.join(EMBEDDED)}", param="dataset")


def _lazy(spec: str):
    """A view opener: the file is memory-mapped when used and released when the caller drops it."""
    def open_view():
        return io.load_features(spec)
    open_view.spec = spec
    return open_view


class _Shape:
    def __init__(self, shape):
        self.shape = shape


def _shape_only(v):
    if callable(v):
        X = v()
        s = X.shape
        del X
        return _Shape(s)
    return v


def load_user(cfg: Config) -> tuple[Dataset, list]:
    """Validate the user's feature files and labels (shapes first, values streamed later)."""
    if not cfg.labels:
        raise BadInputError("required with feature files", param="labels")
    raw_labels = io.load_labels(cfg.labels)
    labels, classes = io.encode_labels(raw_labels, name=str(cfg.labels))
    views, names = [], []
    for spec in cfg.features:
        X = io.load_features(spec)
        if X.shape[0] != len(labels):
            raise BadInputError(f"{spec}: {X.shape[0]} rows but {cfg.labels} has {len(labels)} labels; every "
                                "feature file and the labels must share the same rows")
        names.append(Path(str(spec)).name)
        # .npy files stay on disk (memory-mapped per pass); other formats are already in memory
        views.append(_lazy(spec) if isinstance(X, np.memmap) else X)
        del X
    io.validate([_shape_only(v) for v in views], labels, names, classes)
    ds = Dataset(name="user", views=views, view_names=names, labels=labels, n_classes=len(classes),
                 class_names=classes)
    return ds, classes


def load(cfg: Config) -> Dataset:
    """The user's files, or the embedded dataset (digits is fixed; synthetic is drawn from the seed)."""
    if cfg.features:
        return load_user(cfg)[0]
    if cfg.dataset == "digits":
        return digits(cfg.n_views)
    return synthetic(cfg.n_views, seed=cfg.seed)


def _index_path(base: str, method: str, rate: float, many: bool) -> Path:
    p = Path(base)
    if not many:
        return p
    return p.with_name(f"{p.stem}.{method}.p{rate:g}{p.suffix or '.txt'}")


def write_indices(base: str, sels, many: bool) -> list[str]:
    paths = []
    for s in sels:
        path = _index_path(base, s.method, s.rate, many)
        if not path.parent.exists():
            raise BadInputError(f"{base}: folder {path.parent} does not exist", param="indices_out")
        with atomic_path(path) as tmp:
            np.savetxt(tmp, s.indices, fmt="%d")
        paths.append(str(path))
    return paths


def _write_scores(path: str, stats) -> str:
    if stats is None:
        raise BadInputError("needs ram-apl, ram or concat among the methods", param="scores_out")
    with atomic_path(path, suffix=".tmp.npy") as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, np.stack([stats.ram, stats.apl], axis=1))
    return str(path)


def run_select(cfg: Config, ds: Dataset, engine: Engine) -> tuple[dict, dict]:
    """Selection mode: per (method, rate) sorted indices, per-class counts, weights. Returns (result, artifacts)."""
    sels, stats = select_many(cfg.methods, ds.views, ds.labels, ds.n_classes, cfg.rates, engine=engine,
                              seed=cfg.seed, view=cfg.view, names=ds.view_names)
    names = ds.class_names or list(range(ds.n_classes))
    out = []
    for s in sels:
        row = {"method": s.method, "rate": s.rate, "n_selected": int(len(s.indices)),
               "per_class": {str(names[c]): int(n) for c, n in enumerate(s.per_class)}}
        if s.weights:
            row["weights"] = s.weights
        if cfg.include_indices:
            row["indices"] = s.indices
        out.append(row)
    artifacts = {"_indices": [s.indices for s in sels]}
    if cfg.indices_out:
        paths = write_indices(cfg.indices_out, sels, many=len(sels) > 1)
        artifacts["indices"] = paths if len(paths) > 1 else paths[0]
    if cfg.scores_out:
        artifacts["scores"] = _write_scores(cfg.scores_out, stats)
    res = {"mode": "select", "n": int(len(ds.labels)), "n_classes": int(ds.n_classes),
           "extractors": [{"name": n, "dim": int(_shape_only(v).shape[1])} for n, v in zip(ds.view_names, ds.views)],
           "baseline_view": ds.view_names[cfg.view], "selections": out,
           "citations": {m: CITATIONS[m] for m in cfg.methods}}
    return res, artifacts


# ------------------------------------------------------------------------------------------ evaluation inputs
def _view_index(spec: str, ds: Dataset) -> int:
    s = spec[5:] if spec.startswith("view:") else spec
    if s.isdigit() and int(s) < len(ds.views):
        return int(s)
    if s in ds.view_names:
        return ds.view_names.index(s)
    raise BadInputError(f"{spec}: use raw, or view:K with K < {len(ds.views)} (views: {', '.join(ds.view_names)})",
                        param="eval_input")


def _embedded_inputs(cfg: Config, ds: Dataset):
    """Target-model inputs of the embedded data: its raw inputs (images for the CNN) or one view."""
    if cfg.eval_input != "raw":
        k = _view_index(cfg.eval_input, ds)
        return ds, ds.views[k], ds.test_views[k]
    if cfg.target != "cnn":
        return ds, ds.raw, ds.raw_test
    if ds.name != "digits":
        raise BadInputError("cnn needs image inputs; the synthetic data has none (use mlp or logreg)",
                            param="target")
    a, b = ds.info["raw_images"]
    return ds, a, b


def _test_split(cfg: Config, ds: Dataset, views: list):
    """The user's test split (test features + test labels): (train rows, test labels, test views)."""
    if not (cfg.test_features and cfg.test_labels):
        raise BadInputError("test features and test labels go together",
                            param="test_labels" if cfg.test_features else "test_features")
    if len(cfg.test_features) != len(views):
        raise BadInputError(f"{len(cfg.test_features)} files for {len(views)} feature views", param="test_features")
    idx = {c: i for i, c in enumerate(ds.class_names)}
    try:
        yte = np.asarray([idx[v.item() if hasattr(v, "item") else v] for v in io.load_labels(cfg.test_labels)],
                         dtype=np.int64)
    except KeyError as e:
        raise BadInputError(f"{cfg.test_labels}: label {e.args[0]!r} does not occur in the training labels") from None
    tviews = [np.asarray(io.load_features(f)) for f in cfg.test_features]
    for f, v, tv in zip(cfg.test_features, views, tviews):
        if tv.shape[0] != len(yte) or tv.shape[1] != v.shape[1]:
            raise BadInputError(f"{f}: shape {tv.shape} does not match {len(yte)} test labels x {v.shape[1]} dims")
    return np.arange(len(ds.labels)), yte, tviews


def _holdout_split(cfg: Config, ds: Dataset, views: list):
    """A stratified hold-out of the user's rows (`derive(seed, "subset", "holdout")`)."""
    from sklearn.model_selection import train_test_split

    tr, te = train_test_split(np.arange(len(ds.labels)), test_size=cfg.holdout, stratify=ds.labels,
                              random_state=derive(cfg.seed, "subset", "holdout").int(32))
    tr, te = np.sort(tr), np.sort(te)
    return tr, te, ds.labels[te], [np.asarray(v[te]) for v in views]


def _raw_inputs(cfg: Config, n: int, tr, te, n_test: int):
    """The user's raw target-model inputs for eval_input raw (rows as the features)."""
    if not cfg.raw:
        raise BadInputError("raw needs the raw inputs file (raw, and raw_test with a test split)", param="eval_input")
    R = np.load(cfg.raw, allow_pickle=False) if str(cfg.raw).endswith(".npy") else np.asarray(io.load_features(cfg.raw))
    if R.shape[0] != n:
        raise BadInputError(f"{cfg.raw}: {R.shape[0]} rows but the labels have {n}")
    if te is not None:
        return R[tr], R[te]
    if not cfg.raw_test:
        raise BadInputError("required with raw inputs and a test split", param="raw_test")
    Rt = np.load(cfg.raw_test, allow_pickle=False)
    if Rt.shape[0] != n_test:
        raise BadInputError(f"{cfg.raw_test}: {Rt.shape[0]} rows but the test labels have {n_test}")
    return R, Rt


def eval_inputs(cfg: Config, ds: Dataset):
    """Target-model train/test inputs and the train/test split for evaluation mode: (dataset, train, test)."""
    if ds.name in EMBEDDED:
        return _embedded_inputs(cfg, ds)
    views = [v() if callable(v) else v for v in ds.views]
    if cfg.test_features or cfg.test_labels:
        tr, yte, tviews = _test_split(cfg, ds, views)
        te = None
    else:
        tr, te, yte, tviews = _holdout_split(cfg, ds, views)
    new = Dataset(name="user", views=[np.asarray(v[tr]) for v in views], view_names=ds.view_names,
                  labels=ds.labels[tr], n_classes=ds.n_classes, test_labels=yte, test_views=tviews,
                  class_names=ds.class_names, info={"train_rows": tr if te is not None else None})
    if cfg.eval_input == "raw":
        return (new,) + _raw_inputs(cfg, len(ds.labels), tr, te, len(yte))
    k = _view_index(cfg.eval_input, new)
    return new, new.views[k], new.test_views[k]


# ------------------------------------------------------------------------------------------ the two modes
def _select_mode(cfg: Config, ds: Dataset, engine: Engine) -> tuple[dict, dict]:
    noisy = None
    if cfg.noise > 0:
        ds.labels, noisy = inject_noise(ds.labels, ds.n_classes, cfg.noise,
                                        derive(cfg.seed, "subset", "noise").numpy())
        if np.any(Context(ds.labels, ds.n_classes).counts < 2):
            raise BadInputError("a class has fewer than two samples after label noise; lower it", param="noise")
    res, art = run_select(cfg, ds, engine)
    res["dataset"] = ds.name
    picked = art.pop("_indices")
    if noisy is not None:
        res["noise"] = cfg.noise
        for row, sel_idx in zip(res["selections"], picked):
            row["noisy_fraction"] = float(noisy[sel_idx].mean()) if len(sel_idx) else 0.0
    return res, art


def _evaluate_mode(cfg: Config, ds: Dataset, engine: Engine, stream=None) -> tuple[dict, dict]:
    if cfg.eval_input is None:
        cfg = replace(cfg, eval_input="raw" if ds.name in EMBEDDED or cfg.raw else "view:0")
    ds2, tr_in, te_in = eval_inputs(cfg, ds)
    repeats = list(range(cfg.seeds))
    res = evaluate(cfg.methods, ds2.views, ds2.labels, ds2.n_classes, cfg.rates, tr_in, te_in, ds2.test_labels,
                   engine=engine, seed=cfg.seed, repeats=repeats, target=cfg.target, noise=cfg.noise, view=cfg.view,
                   names=ds2.view_names, progress=engine.progress, stream=stream)
    head = {"mode": "evaluate", "dataset": ds.name, "n_train": int(len(ds2.labels)),
            "n_test": int(len(ds2.test_labels)), "n_classes": int(ds2.n_classes),
            "extractors": [{"name": n, "dim": int(np.shape(v)[1])} for n, v in zip(ds2.view_names, ds2.views)],
            "baseline_view": ds2.view_names[cfg.view], "target": cfg.target, "eval_input": cfg.eval_input,
            "seeds": repeats, "noise": cfg.noise}
    head.update(res)
    return head, {}


def run(cfg: Config, progress=None, stream=None) -> tuple[dict, dict]:
    """The whole command: embedded or user data; selection or evaluation mode. `progress(desc, done, total)`
    and `stream(record)` (one record per repeat, method and rate while evaluating) are optional callbacks."""
    cfg = resolve(cfg)
    validate(cfg)
    engine = Engine(cfg.device, chunk_rows=cfg.chunk_rows, progress=progress)
    ds = load(cfg)
    if not 0 <= cfg.view < len(ds.views):
        raise BadInputError(f"{cfg.view}: there are only {len(ds.views)} feature views", param="view")
    if cfg.evaluate:
        return _evaluate_mode(cfg, ds, engine, stream)
    return _select_mode(cfg, ds, engine)
