"""CABS: Zongzhen Yang et al., "CABS: Conflict-Aware and Balanced Sparsification for Enhancing Model Merging",
ICML 2025 (arXiv 2503.01874); official code:
https://github.com/zongzhenyang/CABS (RoBERTa/GLUE and Mistral-7B experiments) and the authors' mergekit
method ``cabs`` (arcee-ai/mergekit pull request).

Each task vector tau_k = theta_k - theta_0 is pruned with balanced n:m sparsity (BS: n largest magnitudes
kept in every block of m consecutive elements) and, in a given order, only on the positions no earlier
model kept (CA: conflict-aware), so the pruned vectors are disjoint; the merge is
theta = theta_0 + sum_k lambda_k * prune_k(tau_k) (the paper's method section: CA and BS; the official
``n_m_block_pruning`` / ``block_random_pruning`` and mergekit's ``prune_n_m_structural`` + CABSTask loop).

Modules: ``options`` (choice lists, defaults, the reference; standard library only), ``prune`` (the
algorithm as pure torch functions on tensors), ``stats`` (overlap matrix and densities), ``demo`` (the
embedded demo), ``methods`` (CABS, CA-magnitude and BS as method classes of the shared merge engine),
``mkconfig`` (mergekit YAML configs), ``api`` (what the command calls). Importing the package loads none
of them.
"""
