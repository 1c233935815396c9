"""Template `options` module: choice lists, defaults and the paper, stdlib only (the command imports it for --help).

Copy to `icmltools/<pkg>/options.py`. Nothing here may import numpy/torch/scipy, directly or through the
package's `__init__.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper("Problem Complexity and Method Efficiency in Optimization", "Nemirovski, Yudin",
                  venue="Wiley 1983", url="https://www.wiley.com/")  # the real commands cite their ICML 2025 paper

METHODS = ("median-of-means", "mean")          # the method first, then its baselines
DISTRIBUTIONS = ("pareto", "gaussian")


@dataclass(frozen=True)
class Config:
    """Every default lives here once; the command reads them (`default=Config.n`)."""

    n: int = 1000
    blocks: int = 10
    trials: int = 200
    distribution: str = "pareto"
    methods: tuple = METHODS
