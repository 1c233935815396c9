"""The subcommand registry: name -> (module, short help), so `icml --help` imports no command module.

Add one line per subcommand; the module (under `icmltools.commands`) must define `cli`.
"""

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module in icmltools.commands, short help shown by `icml --help`)
    "env": ("env", "Versions, devices and threads of this installation, as JSON."),
    "onemax-sim": ("onemax_sim", "Learning-augmented one-max search: Pareto-optimal smooth rules vs baselines."),
    "fope-train": ("fope_train", "FoPE vs RoPE/NoPE/ALiBi: train small LMs, compare loss and passkey beyond the training length."),
    "negmerge": ("negmerge", "NegMerge unlearning: sign-consensual task-vector merging of checkpoints, with baselines."),
    "subset-select": ("subset_select", "RAM-APL one-shot subset selection with several feature extractors, plus baselines."),
    "reopt": ("reopt", "VP-OR-style reoptimization of modified MILPs on SCIP, with baselines, generators, bench."),
    "dsgda": ("dsgda", "Decoupled SGDA: local steps against stale opponents in games, vs GDA/EG/OGDA/Local SGDA."),
    "goskill": ("goskill", "GO-Skill offline multi-task RL on MetaWorld: collect, skills, policy, evaluate."),
    "lowrank": ("lowrank", "Low-rank Swish networks: error vs compute on smooth targets, tabular CV, SVD compression of checkpoints."),
    "shap-pay": ("shap_pay", "M^Shap reciprocally fair federated-learning payments: Shapley payments and equilibria vs M0."),
    "guidedquant": ("guidedquant", "GuidedQuant end-loss-guided quantization with LNQ vs RTN, GPTQ and SqueezeLLM k-means, 2-4 bits."),
    "cabs-merge": ("cabs_merge", "CABS model merging: conflict-aware balanced n:m sparsified task vectors, with baselines, on files or a demo."),
    "kpass": ("kpass", "Advantages for pass@k / majority-vote RL training (leave-one-out), as a JSONL transform, checks, demo."),
}
