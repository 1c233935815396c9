"""The one entry point of `icml subset-select`: resolve the defaults, load inputs, select or evaluate, write
index files. `run(cfg)` returns (result, artifacts); `resolve(cfg)` shows the defaults it would pick."""
from __future__ import annotations

import logging
import os
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from . import io, options
from .data import Dataset, digits, inject_noise, synthetic
from .engine import Engine
from .evalinputs import eval_inputs
from .evaluate import evaluate
from .options import Config
from .select import CITATIONS, METHODS, Context, check_budgets, check_rate, select_many

log = logging.getLogger(__name__)

__all__ = ["Config", "resolve", "validate", "run", "load_user", "run_select", "eval_inputs", "output_paths",
           "shown_params"]

EMBEDDED = options.DATASETS
SINGLE_VIEW = ("min", "moderate", "kcenter", "herding", "graphcut")  # the baselines that read view `view` only


def resolve(cfg: Config) -> Config:
    """Fill what the user left open: evaluation is on for the embedded data and off for feature files;
    methods and rates default to `options.EVALUATE_*` when evaluating, `options.SELECT_*` when selecting; the
    target model reads the raw inputs (embedded data, or the user's raw file) or else feature view 0."""
    do_eval = bool(cfg.evaluate if cfg.evaluate is not None else not cfg.features)
    methods = cfg.methods or (options.EVALUATE_METHODS if do_eval else options.SELECT_METHODS)
    rates = cfg.rates or (options.EVALUATE_RATES if do_eval else options.SELECT_RATES)
    eval_input = cfg.eval_input
    if do_eval and eval_input is None:
        eval_input = "raw" if (not cfg.features or cfg.raw) else "view:0"
    return replace(cfg, evaluate=do_eval, methods=tuple(dict.fromkeys(methods)), eval_input=eval_input,
                   rates=tuple(dict.fromkeys(float(p) for p in rates)))


def shown_params(cfg: Config) -> dict:
    """What a resolved run uses, for the envelope: the resolved methods, rates, mode and target inputs; the
    options that do not apply (`options.unused_options`) are to be left out."""
    return {"methods": list(cfg.methods), "rates": list(cfg.rates), "evaluate": cfg.evaluate,
            "eval_input": cfg.eval_input}


def _check_unused(cfg: Config) -> None:
    """An option that does not apply to this run is refused, not silently ignored."""
    defaults = {f.name: f.default for f in fields(Config)}
    for name, why in options.unused_options(cfg).items():
        if name in defaults and getattr(cfg, name) not in (defaults[name], ()):
            raise BadInputError(why, param=name)


def _check_eval_split(cfg: Config) -> None:
    """A test split is test labels plus the target model's test inputs (raw test file, or one test feature
    file per feature file); without test labels the test set is held out of the user's rows."""
    if not (cfg.evaluate and cfg.features):
        return
    if cfg.eval_input == "raw" and not cfg.raw:
        raise BadInputError("raw needs the raw inputs file (one row per feature row)", param="eval_input")
    if cfg.target == "cnn" and cfg.eval_input != "raw":
        raise BadInputError("cnn needs image inputs (N, C, H, W): give them as raw inputs", param="target")
    if not cfg.test_labels:
        if cfg.test_features or cfg.raw_test:
            raise BadInputError("a test split needs its labels (without them the test set is held out of your rows)",
                                param="test_features" if cfg.test_features else "raw_test")
        return
    if cfg.eval_input == "raw" and not cfg.raw_test:
        raise BadInputError("a test split for raw inputs needs the raw test file", param="raw_test")
    if cfg.eval_input != "raw" and not cfg.test_features:
        raise BadInputError("a test split for a feature view needs one test feature file per feature file",
                            param="test_features")


def validate(cfg: Config) -> None:
    """Checks that need no data (run after `resolve`)."""
    for p in cfg.rates:
        check_rate(p)
    bad = [m for m in cfg.methods if m not in METHODS]
    if bad:
        raise BadInputError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}", param="methods")
    if not 0.0 <= cfg.noise < 1.0:
        raise BadInputError(f"{cfg.noise}: must lie in [0, 1)", param="noise")
    if not cfg.features and cfg.dataset not in EMBEDDED:
        raise BadInputError(f"unknown dataset {cfg.dataset!r}; use {' or '.join(EMBEDDED)}", param="dataset")
    if cfg.features and not cfg.labels:
        raise BadInputError("required with feature files", param="labels")
    _check_unused(cfg)
    _check_eval_split(cfg)
    n_views = len(cfg.features) if cfg.features else cfg.n_views
    if not 0 <= cfg.view < n_views:
        raise BadInputError(f"{cfg.view}: out of range (feature views: 0 to {n_views - 1}, "
                            f"{'one per feature file' if cfg.features else 'of the embedded data'})", param="view")
    if cfg.scores_out and not set(cfg.methods) & set(options.STATS_METHODS):
        raise BadInputError(f"needs one of {', '.join(options.STATS_METHODS)} among the methods", param="scores_out")
    output_paths(cfg)


# ------------------------------------------------------------------------------------------ outputs
def _index_path(base: str, method: str, rate: float, many: bool) -> Path:
    p = Path(base)
    if not many:
        return p
    return p.with_name(f"{p.stem}.{method}.p{rate:g}{p.suffix or '.txt'}")


def output_paths(cfg: Config) -> dict:
    """{("indices", method, rate) or "scores": path} of a resolved selection run; two outputs on one path, or
    an output on an input file, are refused."""
    out = {}
    if cfg.indices_out:
        many = len(cfg.methods) * len(cfg.rates) > 1
        for m in cfg.methods:
            for p in cfg.rates:
                out[("indices", m, p)] = _index_path(cfg.indices_out, m, p, many)
    if cfg.scores_out:
        out["scores"] = Path(cfg.scores_out)
    seen: dict = {}
    for key, path in out.items():
        name = "scores_out" if key == "scores" else "indices_out"
        resolved = os.path.realpath(path)
        if resolved in seen:
            raise BadInputError(f"{path}: two outputs would share this file ({seen[resolved]} and {key})", param=name)
        seen[resolved] = key
    inputs = [io.split_key(s)[0] for s in (*cfg.features, cfg.labels) if s]
    for key, path in out.items():
        if any(os.path.realpath(path) == os.path.realpath(i) for i in inputs):
            raise BadInputError(f"{path} is one of the input files; it would be overwritten",
                                param="scores_out" if key == "scores" else "indices_out")
    return out


def _write_outputs(staged, paths: dict, sels, stats) -> dict:
    """Fill the staged files (renamed onto their paths when the run ends without error)."""
    for s in sels:
        key = ("indices", s.method, s.rate)
        if key in paths:
            with staged.open(paths[key]) as fh:
                np.savetxt(fh, s.indices, fmt="%d")
    art = {}
    idx = [str(p) for k, p in paths.items() if k != "scores"]
    if idx:
        art["indices"] = idx if len(idx) > 1 else idx[0]
    if "scores" in paths:
        with staged.open(paths["scores"]) as fh:
            np.save(fh, np.stack([stats.ram, stats.apl], axis=1))
        art["scores"] = str(paths["scores"])
    return art


# ------------------------------------------------------------------------------------------ inputs
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


def check_noise(noise: float, n_classes: int) -> None:
    """Symmetric noise at rate r leaves a label right with probability 1 - r and each other class with
    r / (K - 1): from r = (K - 1) / K on, labels carry no information about the class (0.9 on two classes
    swaps them). Refused."""
    top = (n_classes - 1) / n_classes
    if noise >= top:
        raise BadInputError(f"{noise:g}: with {n_classes} classes, symmetric label noise at or above "
                            f"{top:.4g} = (K-1)/K leaves labels that say nothing about the class (or invert "
                            "them); use a smaller fraction", param="noise")


def _scan_unread(cfg: Config, ds: Dataset) -> None:
    """NaN/inf in a feature file that no selected method reads would pass unseen: scan those files once (the
    views a method reads are checked by its own pass)."""
    if set(cfg.methods) & set(options.STATS_METHODS):
        return
    read = {cfg.view} if set(cfg.methods) & set(SINGLE_VIEW) else set()
    for k, (v, name) in enumerate(zip(ds.views, ds.view_names)):
        if k not in read:
            io.check_finite(v() if callable(v) else v, name)


# ------------------------------------------------------------------------------------------ the two modes
def run_select(cfg: Config, ds: Dataset, engine: Engine, staged=None) -> tuple[dict, dict]:
    """Selection mode: per (method, rate) sorted indices, per-class counts, weights. Returns (result, artifacts);
    index and score files go to `staged` (an `io.StagedOutputs` over `output_paths(cfg)`)."""
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
    if staged is not None:
        artifacts.update(_write_outputs(staged, output_paths(cfg), sels, stats))
    res = {"mode": "select", "n": int(len(ds.labels)), "n_classes": int(ds.n_classes),
           "extractors": [{"name": n, "dim": int(_shape_only(v).shape[1])} for n, v in zip(ds.view_names, ds.views)],
           "baseline_view": ds.view_names[cfg.view], "selections": out,
           "citations": {m: CITATIONS[m] for m in cfg.methods}}
    return res, artifacts


def _select_mode(cfg: Config, ds: Dataset, engine: Engine, staged=None) -> tuple[dict, dict]:
    noisy = None
    after = ""
    if cfg.noise > 0:
        ds.labels, noisy = inject_noise(ds.labels, ds.n_classes, cfg.noise,
                                        derive(cfg.seed, "subset", "noise").numpy())
        if np.any(Context(ds.labels, ds.n_classes).counts < 2):
            raise BadInputError("a class has fewer than two samples after label noise; lower it", param="noise")
        after = " after label noise"
    check_budgets(np.bincount(ds.labels, minlength=ds.n_classes), cfg.rates, cfg.methods, ds.class_names, after)
    _scan_unread(cfg, ds)
    res, art = run_select(cfg, ds, engine, staged)
    res["dataset"] = ds.name
    picked = art.pop("_indices")
    if noisy is not None:
        res["noise"] = cfg.noise
        for row, sel_idx in zip(res["selections"], picked):
            row["noisy_fraction"] = float(noisy[sel_idx].mean()) if len(sel_idx) else 0.0
    return res, art


def _evaluate_mode(cfg: Config, ds: Dataset, engine: Engine, stream=None) -> tuple[dict, dict]:
    ds2, tr_in, te_in = eval_inputs(cfg, ds)
    repeats = list(range(cfg.seeds))
    res = evaluate(cfg.methods, ds2.views, ds2.labels, ds2.n_classes, cfg.rates, tr_in, te_in, ds2.test_labels,
                   engine=engine, seed=cfg.seed, repeats=repeats, target=cfg.target, noise=cfg.noise, view=cfg.view,
                   names=ds2.view_names, progress=engine.progress, stream=stream, class_names=ds2.class_names)
    head = {"mode": "evaluate", "dataset": ds.name, "n_train": int(len(ds2.labels)),
            "n_test": int(len(ds2.test_labels)), "n_classes": int(ds2.n_classes),
            "extractors": [{"name": n, "dim": int(np.shape(v)[1])} for n, v in zip(ds2.view_names, ds2.views)],
            "baseline_view": ds2.view_names[cfg.view], "target": cfg.target, "eval_input": cfg.eval_input,
            "seeds": repeats, "noise": cfg.noise}
    head.update(res)
    return head, {}


def run(cfg: Config, progress=None, stream=None) -> tuple[dict, dict]:
    """The whole command: embedded or user data; selection or evaluation mode. `progress(desc, done, total)`
    and `stream(record)` (one record per repeat, method and rate while evaluating) are optional callbacks.
    Output files are all written or none: their temporary files are made before any work and renamed at the
    end (`io.StagedOutputs`)."""
    cfg = resolve(cfg)
    validate(cfg)
    with io.StagedOutputs(output_paths(cfg).values()) as staged:
        engine = Engine(cfg.device, chunk_rows=cfg.chunk_rows, progress=progress)
        ds = load(cfg)
        check_noise(cfg.noise, ds.n_classes)
        if cfg.evaluate:
            return _evaluate_mode(cfg, ds, engine, stream)
        return _select_mode(cfg, ds, engine, staged)
