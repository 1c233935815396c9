"""Learning-augmented one-max search.

Ziyad Benomar, Lorenzo Croissant, Vianney Perchet, Spyros Angelopoulos, "Pareto-Optimality, Smoothness, and
Stochasticity in Learning-Augmented One-Max-Search", ICML 2025, arXiv 2502.05720 (no official code is
published; `rules.smooth` is derived from first principles and intended to match the paper's A_r^1).

Threshold rules with a prediction `y` of the maximum price (`rules`), their exact adversarial worst case,
the Pareto front c * r = 1/theta and the smoothness bound max(r, c E^{s*}) (`worstcase`), and a vectorised
simulator for price series and random markets (`simulate`, `data`). `options` holds the lists, defaults
and reference (standard library only); `api.run` is the command's one entry point. Importing the package
imports nothing heavy.
"""
