"""One-shot subset selection with several foundation-model feature extractors: RAM-APL.

Zhijing Wan, Zhixiang Wang, Zheng Wang, Xin Xu, Shin'ichi Satoh, "Foundation Model Insights and a
Multi-Model Approach for Superior Fine-Grained One-shot Subset Selection", ICML 2025 (PMLR 267),
arXiv 2506.14473. Official code: github.com/ZhijingWan/RAM-APL (built on DeepCore); this package follows
the official code where it and the paper's prose differ.

RAM-APL scores sample j, of class y_j, from K extractors' features f_k (class means mu_{k,c} over all
samples of class c, plain Euclidean distances):

    APL_j   = (1/K) sum_k [ argmin_c ||f_k(x_j) - mu_{k,c}|| != y_j ]      (pseudo-class label errors)
    RAM_j   = (1/K) sum_k rank_k(j) / n_{y_j}                              (ranking mean; rank 0 = closest)
    Score_j = W1(p) RAM_j + W2(p) APL_j,  W1(p) = a + (1 - a) / (1 + exp(k (p - 0.5))),  W2 = 1 - W1

with a = 0.2, k = 1 (official `weight_functions`), and keeps per class the round(n_c p) lowest scores.

Modules: `options` (choice lists, defaults, the reference; standard library only), `select` (RAM-APL and
the baselines, a registry of small functions), `engine` (chunked torch distance passes), `evaluate` (target
classifiers on each subset), `data` (embedded digits / synthetic data), `io` (feature and label files),
`api` (the command's one entry point). Importing the package imports nothing heavy.
"""
