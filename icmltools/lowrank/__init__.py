"""Low-rank Swish networks: the approximation study and SVD compression of checkpoints.

Paper: Zimeng Li, Hongjun Li, Jingyuan Wang, Ke Tang, "Approximation to Smooth Functions by Low-Rank Swish
Networks", ICML 2025 (PMLR 267:35259-35291; OpenReview ZWTb5UBdpG; no arXiv id). Official code:
github.com/DannisLi/LowRankUAT (`utils.Net`, `gs_*.py`, `cv_*.py`).

Theorem (constructive): every f in the Hölder ball C^{beta,R}([0,1]^d) is approximated to any eps by a
Swish network of fixed depth whose hidden-to-hidden maps are factored through a bias-free linear layer of
width r <= W/3, so each such layer costs 2Wr <= 2W^2/3 multiply-adds instead of W^2.

Modules: `options` (lists, defaults, paper; stdlib only), `nets` (the paper's Net, params/MACs, training,
module swap and strict loading of factored checkpoints), `targets` (Hölder targets, ours), `approx` (error vs
compute sweep, Pareto front), `uci` (the paper's cross-validated protocol and paired t-test), `svd`
(truncated/randomized SVD factors, Eckart-Young errors), `compress` (streamed checkpoint compression through
`icmltools.taskvec`), `demo` (train, compress, fine-tune), `api` (what the command calls). This file imports
nothing heavy.
"""
