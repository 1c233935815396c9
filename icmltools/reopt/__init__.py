"""VP-OR (ICML 2025): reoptimizing modified MILPs from their solving history. An earlier version of the
paper was submitted to ICLR 2025 as "A Reoptimization Framework for Mixed Integer Linear Programming with
Dynamic Parameters" (OpenReview scdGzuwC9u); authors and an arXiv id are not recorded in our sources, and
no official code is published. `options.REFERENCE` is the record the JSON envelope carries.

This package is a VP-OR-*style* reimplementation on SCIP (PySCIPOpt); where the paper leaves gaps the
choices are ours and say so:

- Stage 1 (`predict`): a high-confidence solution space for the new instance, P(x_j = 1) for binaries and
  an interval for general integers; history marginals by default (ours), or a bipartite GNN (as the paper).
- Stage 2 (`ts`, `solve.solve_vpor`): Thompson sampling over which variables to fix (Beta(1 + K p,
  1 + K (1 - p)), fix the fraction P with the smallest min(mu, 1 - mu) to round(mu)), sub-MIPs with a short
  limit, the fixings released one of 10 groups at a time when a sub-MIP is infeasible, and the posterior
  moved toward each improved incumbent (reward 1 only).
- Baselines (`solve`): plain SCIP, SCIP warm-started with the previous solution, SCIP's reoptimization.
- Instance series (`generators`, `series`): set cover, combinatorial auction, facility location and
  independent set series with obj / rhs / bnd / mat / mixed changes, MIPcc23-style `.test` files, a bench.

`options` (choice lists, configs, defaults) imports only the standard library; `api` is what the command calls.
"""
