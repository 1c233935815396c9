"""`icml kpass` choice lists, defaults and the paper (stdlib only: the command imports it for --help)."""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper("Optimizing Language Models for Inference Time Objectives using Reinforcement Learning",
                  "Yunhao Tang, Kunhao Zheng, Gabriel Synnaeve, Remi Munos", arxiv="2503.19595")

OBJECTIVES = ("pass", "maj", "mean")                      # pass@k, maj@k, mean reward (RLOO)
ESTIMATORS = ("loo", "centered", "pkpo", "pkpo-loo", "pkpo-loo1")  # the paper's first, then PKPO baselines
PKPO_ESTIMATORS = ("pkpo", "pkpo-loo", "pkpo-loo1")       # defined for the pass objective only
SCALES = ("none", "std")
ON_ERROR = ("stop", "skip")
ANSWER_REWARD = ("error", "mean")
TASKS = ("teacher", "modadd")
DEMO_RUNS = ("mean:loo", "pass:loo", "pass:centered", "pass:pkpo-loo1", "maj:loo", "maj:centered")

ENUM_LIMIT = 100_000      # exact U-statistic over all k-subsets while C(n, k) <= this (maj@k with n > k)
SAMPLED_SUBSETS = 2000    # else this many uniformly drawn k-subsets (still unbiased)
STD_EPS = 1e-6


@dataclass(frozen=True)
class TransformConfig:
    """`icml kpass transform`: defaults live here once."""

    objective: str = "pass"
    k: int | None = None              # None: k = the group's size
    estimator: str = "loo"
    reward_key: str = "reward"
    answer_key: str = "answer"
    scale: str = "none"
    answer_reward: str = "error"
    on_error: str = "stop"
    seed: int = 0                     # only the sampled-subset U-statistic draws random numbers


@dataclass(frozen=True)
class DemoConfig:
    """`icml kpass demo`: the capacity-limited policy of the spec."""

    task: str = "teacher"
    steps: int = 800
    k: int = 8
    batch: int = 64
    lr: float = 0.05
    eval_every: int = 100
    maj_votes: int = 400
    reps: int = 1
    runs: tuple = DEMO_RUNS
