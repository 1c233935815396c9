"""Choice lists, defaults and the paper of `icml negmerge`, kept once (standard library only).

The command imports this module at load time (no numpy, torch, scikit-learn or safetensors, so `--help`
stays fast); the library takes its lists, defaults and configs from here too.
"""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.errors import BadInputError
from icmltools.core.reference import paper
from icmltools.taskvec.formats import OUTPUT_FORMATS

REFERENCE = paper("NegMerge: Sign-Consensual Weight Merging for Machine Unlearning",
                  "Hyo Seo Kim, Dongyoon Han, Junsuk Choe", arxiv="2410.05583",
                  code="https://github.com/naver-ai/negmerge")

# merges of the task vectors (file mode); the registry in merge.py holds one class per name
METHODS = ("negmerge", "task_arithmetic", "uniform", "ties", "magmax")
# merges the demo shows next to task arithmetic (best and median candidate)
DEMO_METHODS = ("negmerge", "uniform", "ties", "magmax")
# output checkpoint format; "same" keeps the base's
FORMATS = ("same",) + OUTPUT_FORMATS
# demo presets: `quick` is the spec's demo; `tiny` a seconds-long smoke run (smaller task, 8 candidates,
# coarse grid); the overrides apply to DemoConfig's defaults
PRESET_OVERRIDES = {
    "quick": {},
    "tiny": dict(n_samples=1500, n_test=400, hidden=128, epochs=30, ft_epochs=(5, 10), ft_weight_decay=(0.0, 5e-3),
                 ft_label_smoothing=(0.0, 0.1), lam_grid=tuple(0.5 * i for i in range(9))),
}
PRESETS = tuple(PRESET_OVERRIDES)
DEFAULT_PRESET = "quick"

# lambda rule (official find_optimal_coef): lowest forget accuracy with retain >= RETAIN_RATIO x the original's
RETAIN_RATIO = 0.95
FILE_PATIENCE = 0       # files: the whole grid, as the official code
DEMO_PATIENCE = 3       # demo: stop after 3 consecutive grid points below the retain threshold
DEMO_N_SEEDS = 1
# 0 .. 10 step 0.05: the selection rule needs a grid fine enough to resolve where each method's retain
# accuracy crosses 0.95 x the original's (0.25-0.3 for MagMax) and wide enough for the weak candidates
# (one of the 27 still selects 10, the end, on seeds 0-2); the coarse grid 0 .. 6 step 0.25 picked MagMax
# at its first non-zero point and stopped 4-6 of the 27 candidates at its end (seeds 0-2, docs/negmerge.md).
DEMO_LAM_GRID_SPEC = "0:10:0.05"
DEMO_LAM_GRID = tuple(round(0.05 * i, 2) for i in range(201))


@dataclass(frozen=True)
class MergeConfig:
    """How to merge the task vectors (the same for a file merge and for the demo)."""

    method: str = "negmerge"
    ties_k: float = 0.2          # TIES: fraction of each task vector kept (top-k by magnitude)
    dare_p: float = 0.0          # DARE drop probability; 0 = off
    index: int = 0               # task_arithmetic: which candidate
    seed: int = 0                # DARE masks: derive(seed, "dare", tensor name, candidate index)

    def validate(self, n_candidates: int) -> None:
        """Method, candidate count and option ranges, before anything is read or written."""
        if self.method not in METHODS:
            raise BadInputError(f"unknown merge method {self.method!r}; choose one of {', '.join(METHODS)}",
                                param="method")
        if self.method == "task_arithmetic":
            if n_candidates < 1:
                raise BadInputError("task_arithmetic needs at least one candidate", param="candidates")
            if not 0 <= self.index < n_candidates:
                raise BadInputError(f"{self.index} is out of range for {n_candidates} candidate(s)", param="index")
        elif n_candidates < 2:
            raise BadInputError(f"{self.method} merges at least 2 candidates, got {n_candidates}", param="candidates",
                                hint="pass more candidates, or use the task_arithmetic method for one")
        if not 0.0 < self.ties_k <= 1.0:
            raise BadInputError(f"must be in (0, 1], got {self.ties_k}", param="ties_k")
        if not 0.0 <= self.dare_p < 1.0:
            raise BadInputError(f"must be in [0, 1), got {self.dare_p}", param="dare_p")


@dataclass(frozen=True)
class DemoConfig:
    """The embedded demo (spec: make_classification, memorising MLP, retrain, 27 forget-set fine-tunes)."""

    # data (spec: make_classification, standardised, 1000 test, forget 10 % of train)
    n_samples: int = 4000
    n_features: int = 64
    n_informative: int = 24
    n_redundant: int = 8
    n_classes: int = 10
    n_clusters_per_class: int = 2
    class_sep: float = 1.2
    flip_y: float = 0.02
    n_test: int = 1000
    forget_frac: float = 0.10
    # original / retrain: MLP 64-256-256-10, Adam 1e-3, 40 epochs
    hidden: int = 256
    epochs: int = 40
    lr: float = 1e-3
    batch: int = 128
    # candidates: SGD momentum 0.9, cosine, lr 0.05, batch 32, epochs x weight decay x label smoothing
    ft_epochs: tuple = (5, 10, 20)
    ft_weight_decay: tuple = (0.0, 5e-4, 5e-3)
    ft_label_smoothing: tuple = (0.0, 0.05, 0.1)
    ft_lr: float = 0.05
    ft_batch: int = 32
    ft_momentum: float = 0.9
    # lambda search and merges
    lam_grid: tuple = DEMO_LAM_GRID
    retain_ratio: float = RETAIN_RATIO
    patience: int = DEMO_PATIENCE
    methods: tuple = DEMO_METHODS
    ties_k: float = MergeConfig.ties_k
    dare_p: float = MergeConfig.dare_p

    @classmethod
    def preset(cls, name: str, **overrides) -> "DemoConfig":
        """`quick` (the spec's demo, the default) or `tiny` (a seconds-long smoke run); `overrides` win."""
        if name not in PRESET_OVERRIDES:
            raise BadInputError(f"unknown demo preset {name!r}; choose {' or '.join(PRESETS)}", param="preset")
        return cls(**{**PRESET_OVERRIDES[name], **overrides})

    @property
    def n_candidates(self) -> int:
        return len(self.ft_epochs) * len(self.ft_weight_decay) * len(self.ft_label_smoothing)


def pool_spec(cfg: DemoConfig) -> str:
    """The candidates' fine-tuning grid of `cfg` as the `EPOCHS;WD;LS` text the command takes."""
    return ";".join(",".join(f"{v:g}" for v in vals)
                    for vals in (cfg.ft_epochs, cfg.ft_weight_decay, cfg.ft_label_smoothing))
