"""The lambda search (official rule) and the user evaluation command: the merge engine's
(:mod:`icmltools.merge.search`), re-exported under the names negmerge has always used.

Rule (official ``find_optimal_coef`` with ``minimize=True``): over the grid in order, skip a lambda whose
retain (control) accuracy is below ``ratio x`` the original model's, and pick the lowest forget
accuracy; the first lambda wins ties.
"""
from icmltools.merge.search import (  # noqa: F401
    CommandEvaluator,
    Selection,
    _last_json_object,
    _scores,
    parse_grid,
    search,
    select_lambda,
)

__all__ = ["CommandEvaluator", "Selection", "parse_grid", "search", "select_lambda"]
