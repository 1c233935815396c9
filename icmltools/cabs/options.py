"""Choice lists, defaults and the paper of `icml cabs-merge`, kept once (standard library only).

The command imports this module at load time (no numpy/torch), the library takes its lists from here too.
"""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper("CABS: Conflict-Aware and Balanced Sparsification for Enhancing Model Merging",
                  "Zongzhen Yang et al.",
                  arxiv="2503.01874", code="https://github.com/zongzhenyang/CABS")

# the method first, then its baselines on the same task vectors (the engine's names where it has them)
METHODS = ("cabs", "task_arithmetic", "ties", "dare", "magnitude", "ca_magnitude", "bs", "breadcrumbs", "dare_ties",
           "breadcrumbs_ties")
# the methods this package defines (the others come from the shared merge engine)
OWN_METHODS = ("cabs", "ca_magnitude", "bs")
# what happens to the last partial block of a tensor whose size is not a multiple of m:
# pad = zero-pad to m and keep its top min(n, r) (mergekit); drop = prune it all (RoBERTa script)
TAILS = ("pad", "drop")
DEFAULT_TAIL = "pad"
# the n:m pattern: "auto" = m 32, n = max(1, 16 // K) (total density <= 50 %, as all official settings)
AUTO_NM = "auto"
AUTO_M = 32
AUTO_TOTAL = 16
DEFAULT_LAM = "1.0"

# the demo (spec: four generated tasks, a shared trunk, merges of the trunk, per-task accuracy)
DEMO_METHODS = ("task_arithmetic", "ties", "dare", "magnitude", "ca_magnitude", "bs", "breadcrumbs", "cabs")
DEMO_N_SEEDS = 5          # seeds --seed .. --seed+4: the gaps between merges are about one standard error


@dataclass(frozen=True)
class DemoConfig:
    """The embedded demo's settings (spec: make_classification tasks, 64-128-128-128 trunk, 4 heads)."""

    n_tasks: int = 4
    n_samples: int = 2000
    n_features: int = 64
    n_informative: int = 6
    n_classes: int = 4
    n_clusters_per_class: int = 2
    class_sep: float = 2.0
    flip_y: float = 0.01
    n_train: int = 1000
    n_val: int = 500
    hidden: tuple = (128, 128, 128)
    batch: int = 128
    base_lr: float = 2e-3
    base_epochs: int = 6
    ft_lr: float = 5e-4
    ft_epochs: int = 5
    nm: str = "4:32"                       # density 0.125 for every pruning method (d = n / m)
    lam_grid: tuple = tuple(round(0.1 * i, 1) for i in range(1, 31))   # 0.1 .. 3.0
    methods: tuple = DEMO_METHODS
