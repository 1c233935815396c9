"""High-level entry points used by `icml subset-select`: load inputs, select, evaluate, write index files."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import atomic_path

from . import io
from .data import Dataset, digits, inject_noise, synthetic
from .engine import Engine
from .evaluate import evaluate
from .select import CITATIONS, METHODS, Context, check_rate, select_many

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    features: tuple = ()
    labels: str | None = None
    dataset: str = "digits"
    n_views: int = 3
    methods: tuple = ("ram-apl",)
    rates: tuple = (0.1,)
    view: int = 0
    evaluate: bool | None = None
    target: str = "logreg"
    eval_input: str | None = None
    test_features: tuple = ()
    test_labels: str | None = None
    raw: str | None = None
    raw_test: str | None = None
    holdout: float = 0.25
    noise: float = 0.0
    seeds: int = 3
    seed: int = 0
    indices_out: str | None = None
    scores_out: str | None = None
    include_indices: bool = True
    chunk_rows: int = 0
    device: str = "cpu"
    extra: dict = field(default_factory=dict)


def _lazy(spec: str):
    """A view opener: the file is memory-mapped when used and released when the caller drops it."""
    def open_view():
        return io.load_features(spec)
    open_view.spec = spec
    return open_view


def load_user(cfg: Config) -> tuple[Dataset, list]:
    """Validate the user's feature files and labels (shapes first, values streamed later)."""
    if not cfg.labels:
        raise BadInputError("--labels is required with --features")
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
            raise BadInputError(f"--indices-out {base}: folder {path.parent} does not exist")
        with atomic_path(path) as tmp:
            np.savetxt(tmp, s.indices, fmt="%d")
        paths.append(str(path))
    return paths


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
        if stats is None:
            raise BadInputError("--scores-out needs ram-apl, ram or concat among the methods")
        with atomic_path(cfg.scores_out, suffix=".tmp.npy") as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, np.stack([stats.ram, stats.apl], axis=1))
        artifacts["scores"] = str(cfg.scores_out)
    res = {"mode": "select", "n": int(len(ds.labels)), "n_classes": int(ds.n_classes),
           "extractors": [{"name": n, "dim": int(_shape_only(v).shape[1])} for n, v in zip(ds.view_names, ds.views)],
           "baseline_view": ds.view_names[cfg.view], "selections": out,
           "citations": {m: CITATIONS[m] for m in cfg.methods}}
    return res, artifacts


def eval_inputs(cfg: Config, ds: Dataset):
    """Target-model train/test inputs and the train/test split for evaluation mode."""
    if ds.name in ("digits", "synthetic"):
        if cfg.eval_input == "raw":
            if cfg.target == "cnn":
                if ds.name != "digits":
                    raise BadInputError("--target cnn needs image inputs; the synthetic data has none (use mlp/logreg)")
                a, b = ds.info["raw_images"]
                return ds, a, b
            return ds, ds.raw, ds.raw_test
        k = _view_index(cfg.eval_input, ds)
        return ds, ds.views[k], ds.test_views[k]
    # user data: a given test split, or a stratified hold-out of the given rows
    views = [v() if callable(v) else v for v in ds.views]
    if cfg.test_features or cfg.test_labels:
        if not (cfg.test_features and cfg.test_labels):
            raise BadInputError("--test-features and --test-labels go together")
        if len(cfg.test_features) != len(views):
            raise BadInputError(f"--test-features: {len(cfg.test_features)} files for {len(views)} feature views")
        lab_raw = io.load_labels(cfg.test_labels)
        idx = {c: i for i, c in enumerate(ds.class_names)}
        try:
            yte = np.asarray([idx[v.item() if hasattr(v, "item") else v] for v in lab_raw], dtype=np.int64)
        except KeyError as e:
            raise BadInputError(f"{cfg.test_labels}: label {e.args[0]!r} does not occur in the training labels") from None
        tviews = [np.asarray(io.load_features(f)) for f in cfg.test_features]
        for f, v, tv in zip(cfg.test_features, views, tviews):
            if tv.shape[0] != len(yte) or tv.shape[1] != v.shape[1]:
                raise BadInputError(f"{f}: shape {tv.shape} does not match {len(yte)} test labels x {v.shape[1]} dims")
        tr = np.arange(len(ds.labels))
        te = None
    else:
        from sklearn.model_selection import train_test_split

        tr, te = train_test_split(np.arange(len(ds.labels)), test_size=cfg.holdout, stratify=ds.labels,
                                  random_state=cfg.seed)
        tr, te = np.sort(tr), np.sort(te)
        yte = ds.labels[te]
        tviews = [np.asarray(v[te]) for v in views]
    new = Dataset(name="user", views=[np.asarray(v[tr]) for v in views], view_names=ds.view_names,
                  labels=ds.labels[tr], n_classes=ds.n_classes, test_labels=yte, test_views=tviews,
                  class_names=ds.class_names, info={"train_rows": tr if te is not None else None})
    if cfg.eval_input == "raw":
        if not cfg.raw:
            raise BadInputError("--eval-input raw needs --raw (and --raw-test with --test-features)")
        R = np.load(cfg.raw, allow_pickle=False) if str(cfg.raw).endswith(".npy") else np.asarray(io.load_features(cfg.raw))
        if R.shape[0] != len(ds.labels):
            raise BadInputError(f"{cfg.raw}: {R.shape[0]} rows but the labels have {len(ds.labels)}")
        if te is not None:
            return new, R[tr], R[te]
        if not cfg.raw_test:
            raise BadInputError("--raw-test is required with --raw and --test-features")
        Rt = np.load(cfg.raw_test, allow_pickle=False)
        if Rt.shape[0] != len(yte):
            raise BadInputError(f"{cfg.raw_test}: {Rt.shape[0]} rows but the test labels have {len(yte)}")
        return new, R, Rt
    k = _view_index(cfg.eval_input, new)
    return new, new.views[k], new.test_views[k]


def _view_index(spec: str, ds: Dataset) -> int:
    s = spec[5:] if spec.startswith("view:") else spec
    if s.isdigit() and int(s) < len(ds.views):
        return int(s)
    if s in ds.view_names:
        return ds.view_names.index(s)
    raise BadInputError(f"--eval-input {spec}: use raw, or view:K with K < {len(ds.views)} "
                        f"(views: {', '.join(ds.view_names)})")


def pinned_threads(sklearn: bool = True):
    """Pin BLAS/OpenMP pools *after* loading scikit-learn and scipy: threadpoolctl only limits libraries
    already loaded, and unpinned lbfgs fits were measured 25x slower on a loaded 2-core machine."""
    if sklearn:
        import scipy.optimize  # noqa: F401  (loads scipy's BLAS)
        import sklearn.linear_model  # noqa: F401  (loads sklearn's OpenMP runtime)
    import torch
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=max(1, torch.get_num_threads()))


def run(cfg: Config, engine: Engine, stream=None) -> tuple[dict, dict]:
    """The whole command: embedded or user data; selection or evaluation mode (BLAS threads pinned)."""
    needs_sklearn = bool(cfg.evaluate) or not cfg.features  # evaluation, or the embedded digits views
    with pinned_threads(sklearn=needs_sklearn):
        return _run(cfg, engine, stream)


def _run(cfg: Config, engine: Engine, stream=None) -> tuple[dict, dict]:
    for p in cfg.rates:
        check_rate(p)
    bad = [m for m in cfg.methods if m not in METHODS]
    if bad:
        raise BadInputError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}")
    if not 0.0 <= cfg.noise < 1.0:
        raise BadInputError(f"--noise {cfg.noise}: must lie in [0, 1)")
    if cfg.features:
        ds, _ = load_user(cfg)
    elif cfg.labels:
        raise BadInputError("--labels given without --features")
    elif cfg.dataset == "digits":
        ds = digits(cfg.n_views)
    elif cfg.dataset == "synthetic":
        ds = synthetic(cfg.n_views, seed=cfg.seed)
    else:
        raise BadInputError(f"unknown dataset {cfg.dataset!r}; use digits or synthetic")
    if not 0 <= cfg.view < len(ds.views):
        raise BadInputError(f"--view {cfg.view}: there are only {len(ds.views)} feature views")
    do_eval = cfg.evaluate if cfg.evaluate is not None else not cfg.features
    if not do_eval:
        if cfg.noise > 0:
            ds.labels, noisy = inject_noise(ds.labels, ds.n_classes, cfg.noise, np.random.default_rng(cfg.seed))
            if np.any(Context(ds.labels, ds.n_classes).counts < 2):
                raise BadInputError("a class has fewer than two samples after label noise; lower --noise")
        res, art = run_select(cfg, ds, engine)
        res["dataset"] = ds.name
        if cfg.noise > 0:
            res["noise"] = cfg.noise
            for row, sel_idx in zip(res["selections"], art.pop("_indices")):
                row["noisy_fraction"] = float(noisy[sel_idx].mean()) if len(sel_idx) else 0.0
        else:
            art.pop("_indices")
        return res, art
    if cfg.eval_input is None:
        cfg = replace(cfg, eval_input="raw" if ds.name in ("digits", "synthetic") or cfg.raw else "view:0")
    ds2, tr_in, te_in = eval_inputs(cfg, ds)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    res = evaluate(cfg.methods, ds2.views, ds2.labels, ds2.n_classes, cfg.rates, tr_in, te_in, ds2.test_labels,
                   engine=engine, seeds=seeds, target=cfg.target, noise=cfg.noise, view=cfg.view,
                   names=ds2.view_names, progress=engine.progress, stream=stream)
    head = {"mode": "evaluate", "dataset": ds.name, "n_train": int(len(ds2.labels)),
            "n_test": int(len(ds2.test_labels)), "n_classes": int(ds2.n_classes),
            "extractors": [{"name": n, "dim": int(np.shape(v)[1])} for n, v in zip(ds2.view_names, ds2.views)],
            "baseline_view": ds2.view_names[cfg.view], "target": cfg.target, "eval_input": cfg.eval_input,
            "seeds": seeds, "noise": cfg.noise}
    head.update(res)
    return head, {}
