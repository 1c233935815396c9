"""NegMerge: Hyo Seo Kim, Dongyoon Han, Junsuk Choe, "NegMerge: Sign-Consensual Weight Merging for Machine
Unlearning", ICML 2025 (arXiv 2410.05583); official code: https://github.com/naver-ai/negmerge (the CLIP
experiments; none is published for the CIFAR-10 ones).

Task vectors tau_i = theta_i - theta_pre of N models fine-tuned on the forget set are merged keeping only
the elements whose sign all N share, tau = where(|sum_i sign(tau_i)| == N, sum_i tau_i / N, 0) (Sec. 3), and
the unlearned model is theta_pre - lambda * tau, lambda picked by the official rule (lowest forget accuracy
with retain accuracy >= 0.95 x the original's).

Modules: ``options`` (choice lists, defaults, configs, the reference; standard library only), ``merge`` (the
registry of merges, streamed tensor by tensor over checkpoints), ``search`` (the lambda rule, the user's
evaluation command), ``demo`` (the embedded demo), ``api`` (what the command calls). Importing the package
loads none of them.
"""
