"""M^Shap: reciprocally fair payments for federated learning.

Paper: Aniket Murhekar, Jiaxin Song, Parnian Shahkar, Bhaskar Ray Chaudhury, Ruta Mehta, "You Get What You
Give: Reciprocally Fair Federated Learning", ICML 2025 (OpenReview ZdmMDz33Io; no arXiv id, no official code).

Agents choose data contributions s_i; each gets accuracy a_i(s) from the jointly trained model and pays a
cost c_i(s_i). M^Shap pays p_i(s) = phi_i(s) - a_i(s), phi the Shapley value of the coalition game
v(X) = A(s[X]), so every agent's payoff is its Shapley share (reciprocal fairness) and payments sum to zero.

Modules: `options` (lists, defaults, paper; stdlib only), `game` (accuracy curves, value functions, input
checks), `shapley` (exact and permutation Monte Carlo, with d phi_i / d s_i), `mechanisms` (M0, M^Shap,
proportional; best responses), `dynamics` (best-response dynamics, the planner, metrics), `digits` (a real
value function on sklearn's digits), `api` (what the command calls). This file imports nothing heavy.
"""
