"""Choice lists, defaults and the paper of `icml subset-select`, kept once (standard library only).

The command imports this module at load time (no numpy, torch or scikit-learn, so `--help` stays fast);
the library takes its lists and defaults from here too.
"""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper(
    "Foundation Model Insights and a Multi-Model Approach for Superior Fine-Grained One-shot Subset Selection",
    "Zhijing Wan, Zhixiang Wang, Zheng Wang, Xin Xu, Shin'ichi Satoh",
    arxiv="2506.14473", code="https://github.com/ZhijingWan/RAM-APL")

# selection methods, in the order they are run and reported (the registry in select.py follows it)
METHODS = ("ram-apl", "ram", "min", "concat", "moderate", "kcenter", "herding", "graphcut", "random")
# methods whose scores come from the one streaming RAM/APL pass (min reuses its distances when it is there)
STATS_METHODS = ("ram-apl", "ram", "concat")
TARGETS = ("logreg", "mlp", "cnn")
DATASETS = ("digits", "synthetic")
MAX_VIEWS = 3  # extractor views of the embedded data

# what the api picks when no methods / rates are given: selection mode, or evaluation mode
SELECT_METHODS = ("ram-apl",)
SELECT_RATES = (0.1,)
EVALUATE_METHODS = METHODS
EVALUATE_RATES = (0.01, 0.05, 0.1, 0.3, 0.5, 0.7)

# RAM-APL weights (official `weight_functions`): W1 = a + (1 - a) / (1 + exp(k (p - sr))), W2 = 1 - W1
WEIGHT_A = 0.2
WEIGHT_K = 1.0
WEIGHT_SR = 0.5

# the embedded digits data (train/test split, random features) is one fixed dataset, whatever --seed is
DIGITS_SEED = 0


@dataclass(frozen=True)
class Config:
    """Everything `api.run` needs. `methods`, `rates` and `evaluate` left as None are chosen by
    `api.resolve`: evaluation (every method, EVALUATE_RATES) for the embedded data, selection
    (SELECT_METHODS at SELECT_RATES) for feature files."""

    features: tuple = ()
    labels: str | None = None
    dataset: str = "digits"
    n_views: int = 3
    methods: tuple | None = None
    rates: tuple | None = None
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
