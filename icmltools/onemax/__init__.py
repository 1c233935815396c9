"""Learning-augmented one-max search (Benomar, Croissant, Perchet, Angelopoulos, ICML 2025, arXiv 2502.05720).

Threshold rules with a prediction `y` of the maximum price, their exact adversarial worst case, the Pareto
front, the smoothness bound, and a vectorised simulator for price series and random markets.
"""
