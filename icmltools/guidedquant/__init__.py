"""Kim, El Halabi, Park, Schaefer, Lee, Park, Lee and Song, "GuidedQuant: Large Language Model Quantization
via Exploiting End Loss Guidance", ICML 2025 (arXiv 2505.07004; official code github.com/snu-mllab/GuidedQuant,
`any_precision/quantization/{gradients,activations,layerwise_quantize,quantize}.py`).

Layer-wise weight quantization guided by the end loss: the squared output gradients, averaged over G groups
of contiguous output channels, weight each token's input outer product, giving one Hessian H_g per group
(Eq. 6-7 of the paper); LNQ fits a per-row non-uniform codebook by alternating an exact coordinate-descent
P-step and a closed-form C-step (Alg. 1). Baselines on the same statistics: RTN, GPTQ (plain and guided)
and the SqueezeLLM weighted k-means.

* `options`: choice lists, defaults, `REFERENCE` (stdlib only: the command imports it).
* `quant`: the per-layer numerics (objective, damping, P-step, C-step, LNQ, k-means, GPTQ, RTN).
* `stats`: the calibration statistics of an `icmltools.nn.DecoderStack` (saliencies, Fisher, H_g).
* `models`: the models (an `icml fope-train` checkpoint, the embedded demo) and the end loss.
* `api`: what the command calls.

Importing the package loads no torch.
"""
