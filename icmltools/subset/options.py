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


# options that apply to one situation only (Config field names; `jsonl` is the command's): `unused_options`
# names those a resolved run does not use, so the command refuses them when given and leaves them out of the
# envelope's params (which then show what ran)
EVALUATE_ONLY = ("target", "eval_input", "test_features", "test_labels", "raw", "raw_test", "holdout", "seeds",
                 "jsonl")
SELECT_ONLY = ("indices_out", "scores_out", "include_indices")
EMBEDDED_ONLY = ("dataset", "n_views")
FEATURES_ONLY = ("labels", "test_features", "test_labels", "raw", "raw_test", "holdout")


def unused_options(cfg: Config) -> dict:
    """{option: why it does not apply} for a resolved `cfg` (evaluate and eval_input decided)."""
    out: dict = {}

    def add(names, why):
        for n in names:
            out.setdefault(n, why)

    if cfg.features:
        add(EMBEDDED_ONLY, "only used with the embedded data, not with feature files")
    else:
        add(FEATURES_ONLY, "only used with feature files (the embedded data brings its own)")
    if not cfg.evaluate:
        add(EVALUATE_ONLY, "only used when evaluating")
        return out
    add(SELECT_ONLY, "only used in selection mode (evaluation writes no subsets)")
    if cfg.features:
        if cfg.eval_input == "raw":
            add(("test_features",), "not used when the target model reads raw inputs (their test rows are "
                                    "the raw test file)")
        else:
            add(("raw", "raw_test"), f"not used when the target model reads a feature view ({cfg.eval_input})")
        if cfg.test_labels:
            add(("holdout",), "not used with a given test split")
    return out
