"""Choice lists, defaults and the paper for `icml lowrank` (stdlib only: the command imports it for --help)."""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper("Approximation to Smooth Functions by Low-Rank Swish Networks",
                  "Zimeng Li, Hongjun Li, Jingyuan Wang, Ke Tang",
                  url="https://openreview.net/forum?id=ZWTb5UBdpG", code="https://github.com/DannisLi/LowRankUAT")

FULL = "full"                                   # the classical net: Linear(W, W) between Swish layers
DATASETS = ("wine", "breast_cancer", "iris", "diabetes")   # sklearn's bundled tables (UCI sets are downloads)
TASKS = ("auto", "classification", "regression")
FORMATS = ("factored", "dense")                 # the paper's two-Linear layout, or U_r S_r V_r' in place
SVD_METHODS = ("exact", "randomized")
OUTPUT_FORMATS = ("same", "safetensors", "torch", "hf_safetensors", "hf_torch")
DEFAULT_INCLUDE = r"weight$"                    # keys compressed by default (then min side >= 16, not EXCLUDE)
DEFAULT_EXCLUDE = r"embed|norm"
MAP_NAME = "lowrank_map.json"                   # the factored layout's map (also in the checkpoint's record)


@dataclass(frozen=True)
class TrainConfig:
    """The approximation study's training [inf]: AdamW, linear warm-up over `warmup` of the steps, then cosine;
    MSE; per-step schedule."""

    epochs: int = 60
    lr: float = 1e-2
    batch: int = 128
    warmup: float = 0.2
    weight_decay: float = 0.01


@dataclass(frozen=True)
class ApproxConfig:
    """Classical vs low-rank Swish nets at equal depth on Hölder targets (spec (a), [inf])."""

    widths: tuple = (32, 64, 128)
    ratios: tuple = (FULL, "1/2", "1/3")        # 1/2: the parameter-matched control (2W(W/2) + W = W^2 + W)
    depth: int = 3
    betas: tuple = (1.5,)
    dim: int = 4
    seeds: int = 1
    n_train: int = 4000
    n_test: int = 4000
    train: TrainConfig = TrainConfig()


@dataclass(frozen=True)
class UciConfig:
    """The paper's protocol (cv_*.py, gs_*.py): grid depth x width multipliers (width = m * d) for the classical
    net by k-fold CV, then classical vs low-rank (r = int(W/3)) at the chosen size, paired one-sided t-test.
    AdamW lr 1e-3, 50 epochs (10 linear warm-up, then cosine; per epoch), batch min(n/10, 64)."""

    dataset: str = "wine"
    task: str = "auto"
    depths: tuple = (2, 3, 4)
    width_mults: tuple = (4, 5, 6)
    folds: int = 10
    epochs: int = 50
    warmup_epochs: int = 10
    lr: float = 1e-3
    max_batch: int = 64
    ratio: str = "1/3"


@dataclass(frozen=True)
class CompressConfig:
    """Truncated SVD of a checkpoint's Linear weights (spec (b), [inf] beyond the paper's layout)."""

    rank_ratio: float | None = None             # None with energy None: 1/3 (the paper's r = W/3)
    energy: float | None = None
    svd: str = "exact"
    fmt: str = "factored"
    out_format: str = "same"
    include: str = DEFAULT_INCLUDE
    exclude: str = DEFAULT_EXCLUDE
    min_dim: int = 16
    force: bool = False
    oversample: int = 10                         # randomized SVD: q = r + oversample
    niter: int = 2


DEFAULT_RANK_RATIO = 1 / 3


@dataclass(frozen=True)
class DemoConfig:
    """Bare `icml lowrank`: a small approximation sweep, then a classical net compressed and fine-tuned."""

    widths: tuple = (32, 64)
    ratios: tuple = (FULL, "1/2", "1/3")
    epochs: int = 30
    demo_width: int = 64
    compress_ratios: tuple = (1.0, 0.5, 1 / 3, 1 / 6)
    finetune_epochs: int = 5
    finetune_lr: float = 3e-3
