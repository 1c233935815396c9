"""VP-OR-style reoptimization of modified MILPs on SCIP (PySCIPOpt): Stage-1 solution-space prediction
from history, Thompson-sampling variable fixing with group-wise relaxation, baselines (plain SCIP,
warm-started SCIP, SCIP's reoptimization), instance-series generators, series and bench modes."""
