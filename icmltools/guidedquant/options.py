"""guidedquant's choice lists, defaults and paper reference, kept once (stdlib only: the command imports it)."""
from __future__ import annotations

from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper(
    "GuidedQuant: Large Language Model Quantization via Exploiting End Loss Guidance",
    "Jinuk Kim, Marwa El Halabi, Wonpyo Park, Clemens JS Schaefer, Deokjae Lee, Yeonhong Park, Jae W. Lee, "
    "Hyun Oh Song",
    arxiv="2505.07004", code="https://github.com/snu-mllab/GuidedQuant")

# The method first, then its baselines, all on the same calibration statistics.
METHODS = ("lnq_guided", "lnq", "gptq_guided", "gptq", "sqllm", "rtn")
NON_UNIFORM = ("lnq_guided", "lnq", "sqllm")      # per-row codebook of 2^b values + u8 indices
GUIDED = ("lnq_guided", "gptq_guided")            # use the per-group saliency-weighted Hessians H_g
BITS_RANGE = (1, 8)
# The Linear layers quantized in every decoder block of an icmltools.nn.DecoderStack (embeddings, norms and
# the head stay in full precision, as in the official code).
DEFAULT_BITS = (3,)
LAYER_NAMES = ("attn.qkv", "attn.out", "mlp.gate_up", "mlp.down")


@dataclass(frozen=True)
class QuantConfig:
    """Quantization settings (spec defaults: b = 3, G = 4, T = 3, cd = 4)."""

    methods: tuple = METHODS
    bits: tuple | None = None      # None: DEFAULT_BITS for a user's model, DemoConfig.bits for the demo
    groups: int = 4                # G: saliency groups of contiguous output channels (one Hessian per group)
    iters: int = 3                 # T: LNQ alternations (iteration 1 = C-step only)
    cd_cycles: int = 4             # coordinate-descent sweeps per P-step
    kmeans_iters: int = 50         # Lloyd iterations of the SqueezeLLM init
    block: int = 128               # lazy column block of the P-step and of GPTQ
    gptq_damp: float = 0.01        # GPTQ: damping = 0.01 * mean diag(H)
    lnq_damp0: float = 1e-5        # LNQ: first damping factor (x10 until Cholesky succeeds, fail above 1)
    c_reg: float = 1e-7            # C-step ridge (official lambda_reg)
    grad_scale: float = 1e3        # saliency = mean over the group of (1e3 * dl/dz)^2 (official)


@dataclass(frozen=True)
class CalibConfig:
    """Calibration and evaluation windows (the demo's: 128 train windows of 64, 128 validation windows)."""

    calib_seqs: int = 128
    seq_len: int = 64
    eval_seqs: int = 128
    chunk: int = 16                # sequences per forward/backward chunk (memory)


@dataclass(frozen=True)
class DemoConfig:
    """The embedded demo model and its training (spec: d 128, 2 layers, 4 heads, SwiGLU 512, RoPE, bytes;
    AdamW 3e-3, weight decay 0.01, OneCycle with 10 % warm-up, 600 steps of batch 16 x 64)."""

    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_hidden: int = 512
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    bits: tuple = (2,)
