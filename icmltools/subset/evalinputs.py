"""Evaluation mode's inputs: the target model's train/test inputs and the test split (the embedded data's
own, the user's test files, or a stratified hold-out of the user's rows). Every array the target model reads
is checked finite with its file named."""
from __future__ import annotations

import math

import numpy as np

from icmltools.core.errors import BadInputError
from icmltools.core.seed import derive

from . import io, options
from .data import Dataset
from .options import Config

EMBEDDED = options.DATASETS


def view_index(spec: str, ds: Dataset) -> int:
    """`view:K` (or a view's name) -> K."""
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
        k = view_index(cfg.eval_input, ds)
        return ds, ds.views[k], ds.test_views[k]
    if cfg.target != "cnn":
        return ds, ds.raw, ds.raw_test
    if ds.name != "digits":
        raise BadInputError("cnn needs image inputs; the synthetic data has none (use mlp or logreg)",
                            param="target")
    a, b = ds.info["raw_images"]
    return ds, a, b


def _test_labels(cfg: Config, ds: Dataset) -> np.ndarray:
    """The user's test labels, coded as the training labels (a class unseen in training is refused)."""
    idx = {c: i for i, c in enumerate(ds.class_names)}
    raw = io.load_labels(cfg.test_labels)
    if np.issubdtype(raw.dtype, np.floating):
        io.encode_labels(raw, name=str(cfg.test_labels))  # refuses NaN/inf and non-integer values
        raw = raw.astype(np.int64)
    try:
        return np.asarray([idx[v.item() if hasattr(v, "item") else v] for v in raw], dtype=np.int64)
    except KeyError as e:
        raise BadInputError(f"{cfg.test_labels}: label {e.args[0]!r} does not occur in the training labels") from None


def _test_views(cfg: Config, views: list, n_test: int) -> list:
    """The user's test features, one per feature file, in memory and finite."""
    if len(cfg.test_features) != len(views):
        raise BadInputError(f"{len(cfg.test_features)} file(s) for {len(views)} feature file(s); give one test "
                            "file per feature file, in the same order", param="test_features")
    tviews = []
    for f, v in zip(cfg.test_features, views):
        tv = np.asarray(io.load_features(f))
        if tv.shape[0] != n_test or tv.shape[1] != v.shape[1]:
            raise BadInputError(f"{f}: shape {tv.shape} does not match {n_test} test labels x {v.shape[1]} dims")
        io.check_finite(tv, str(f))
        tviews.append(tv)
    return tviews


def _holdout_split(cfg: Config, ds: Dataset):
    """A stratified hold-out of the user's rows (`derive(seed, "subset", "holdout")`): (train rows, test rows).
    Every class must keep two training rows and the test part must hold every class."""
    from sklearn.model_selection import train_test_split

    n, C = len(ds.labels), ds.n_classes
    n_test = math.ceil(cfg.holdout * n)
    if n_test < C or n - n_test < 2 * C:
        raise BadInputError(f"{cfg.holdout} of {n} rows is {n_test} test rows for {C} classes and leaves {n - n_test} "
                            f"for selection; a stratified hold-out needs at least {C} test rows and two training "
                            "rows per class (give a test split, or change it)", param="holdout")
    tr, te = train_test_split(np.arange(n), test_size=cfg.holdout, stratify=ds.labels,
                              random_state=derive(cfg.seed, "subset", "holdout").int(32))
    tr, te = np.sort(tr), np.sort(te)
    counts = np.bincount(ds.labels[tr], minlength=C)
    if np.any(counts < 2):
        c = int(np.argmin(counts))
        raise BadInputError(f"class {ds.class_names[c]!r} has {int(np.bincount(ds.labels, minlength=C)[c])} rows and "
                            f"the hold-out leaves {int(counts[c])} for selection (every class needs two); give a test "
                            "split, or hold out less", param="holdout")
    return tr, te


def _raw_inputs(cfg: Config, n: int, tr, te, n_test: int):
    """The user's raw target-model inputs for eval_input raw (rows as the features): (train, test)."""
    R = io.load_inputs(cfg.raw, "raw inputs")
    if cfg.target == "cnn" and R.ndim not in (3, 4):
        raise BadInputError(f"{cfg.raw}: cnn needs images (N, H, W) or (N, C, H, W), got shape {R.shape}",
                            param="target")
    if R.shape[0] != n:
        raise BadInputError(f"{cfg.raw}: {R.shape[0]} rows but the labels have {n}")
    if te is not None:
        return R[tr], R[te]
    if not cfg.raw_test:
        raise BadInputError("required with raw inputs and a test split", param="raw_test")
    Rt = io.load_inputs(cfg.raw_test, "raw test inputs")
    if Rt.shape[0] != n_test or Rt.shape[1:] != R.shape[1:]:
        raise BadInputError(f"{cfg.raw_test}: shape {Rt.shape} does not match {n_test} test labels x "
                            f"{R.shape[1:]} (the raw inputs' shape)")
    return R, Rt


def eval_inputs(cfg: Config, ds: Dataset):
    """Target-model train/test inputs and the train/test split for evaluation mode: (dataset, train, test)."""
    if ds.name in EMBEDDED:
        return _embedded_inputs(cfg, ds)
    views = [np.asarray(v() if callable(v) else v) for v in ds.views]
    for v, name in zip(views, ds.view_names):
        io.check_finite(v, name)
    raw = cfg.eval_input == "raw"
    if cfg.test_labels:
        yte = _test_labels(cfg, ds)
        tr, te = np.arange(len(ds.labels)), None
        tviews = None if raw else _test_views(cfg, views, len(yte))
    else:
        tr, te = _holdout_split(cfg, ds)
        yte, tviews = ds.labels[te], [v[te] for v in views]
    new = Dataset(name="user", views=[v[tr] for v in views], view_names=ds.view_names,
                  labels=ds.labels[tr], n_classes=ds.n_classes, test_labels=yte, test_views=tviews,
                  class_names=ds.class_names, info={"train_rows": tr if te is not None else None})
    if raw:
        return (new,) + _raw_inputs(cfg, len(ds.labels), tr, te, len(yte))
    k = view_index(cfg.eval_input, new)
    return new, new.views[k], new.test_views[k]
