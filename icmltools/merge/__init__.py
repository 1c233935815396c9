"""The merge engine: task-vector merges streamed tensor by tensor over checkpoints, one small class per method.

Methods and papers: task arithmetic (Ilharco et al., "Editing Models with Task Arithmetic", ICLR 2023,
arXiv 2212.04089), TIES-merging (Yadav et al., NeurIPS 2023, arXiv 2306.01708), DARE (Yu et al., "Language
Models are Super Mario", ICML 2024, arXiv 2311.03099), Model Breadcrumbs (Davari & Belilovsky, ECCV 2024,
arXiv 2312.06795), magnitude pruning of task vectors, NegMerge, uniform and MagMax (see
:mod:`icmltools.negmerge`); the registry of method classes follows mergekit's ``MergeMethod`` (Goddard et al.,
"Arcee's MergeKit", EMNLP 2024 industry track, arXiv 2403.13257).

Modules: ``options`` (method names, defaults; standard library only), ``engine`` (the method interface, the
registry, the streamed and chunked merge over :mod:`icmltools.taskvec` readers and writers), ``methods`` (the
general methods), ``search`` (the lambda search and the user's evaluation command). Importing the package
loads none of them (no torch); ``docs/merge-engine.md`` describes the interface.
"""
