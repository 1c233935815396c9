"""fope-train's choice lists, presets, run configuration and paper reference, kept once (stdlib only).

The command imports this module at start-up (no torch), the library imports its lists from here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional

from icmltools.core.errors import BadInputError
from icmltools.core.reference import paper

REFERENCE = paper(
    "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length Generalization",
    "Ermo Hua, Che Jiang, Xingtai Lv, Kaiyan Zhang, Youbang Sun, Yuchen Fan, Xuekai Zhu, Biqing Qi, Ning Ding, "
    "Bowen Zhou",
    arxiv="2412.17739", code="https://github.com/TsinghuaC3I/Fourier-Position-Embedding")

# Position embeddings: rope, FoPE (clip-floor + Fourier series), its two ablations, no PE, ALiBi.
PES = ("rope", "fope", "fope-cf", "fope-fs", "nope", "alibi")
DEFAULT_PES = ("rope", "fope")
# Training-free RoPE context extensions (icmltools.nn.RotaryEmbedding.set_scaling types).
EXTENSIONS = ("pi", "yarn")
TASKS = ("text", "passkey")
# FoPE padding of the hd/2 - d unrotated dims: (cos pad, sin pad). Official code: 1.0 and 1.0; vLLM: sin 0.0.
PADS = {"official": (1.0, 1.0), "vllm": (1.0, 0.0)}

DEFAULT_PRESET = "quick"
# Text evaluation windows (the same windows at every length). On the quick preset the per-window loss at N
# has a standard deviation of about 0.5 nats/byte, so 2048 windows give a standard error of about 0.011 at
# N (about 0.005 for the paired growth N -> 2N); one forward pass over the 8N windows costs about 6 ms of
# one CPU thread per window, about 13 CPU-seconds per model (training: about 15).
TEXT_WINDOWS = 2048
PRESETS: dict[str, dict] = {
    # bare `icml fope-train`: byte-level stdlib corpus, N = 64, about 30 CPU-seconds per model (one thread)
    "quick": dict(task="text", train_length=64, d_model=64, n_layers=2, n_heads=2, steps=600, batch_size=16,
                  lr=2e-3, warmup=30, eval_factors=(1, 2, 4, 8), eval_samples=TEXT_WINDOWS, sigma=0.3),
    # passkey at N = 128 as the spec's suggested quick preset (about 3 min per model on one core)
    "passkey": dict(task="passkey", train_length=128, d_model=64, n_layers=2, n_heads=2, steps=1500,
                    batch_size=32, lr=1e-3, warmup=50, eval_factors=(1, 2, 4, 8), eval_samples=100, sigma=0.3),
    # the spec's CPU prototype scale on text: d 128, 4 heads, 2 layers, 1000 steps
    "cpu": dict(task="text", train_length=64, d_model=128, n_layers=2, n_heads=4, steps=1000, batch_size=32,
                lr=1e-3, warmup=50, eval_factors=(1, 2, 4, 8), eval_samples=TEXT_WINDOWS, sigma=0.3),
    # the paper's 60M shape (OLMo-60M: d 512, 8 heads, 8 layers, SwiGLU hidden 2048, N = 512, sigma 0.3,
    # lr 6e-4 cosine to 0.1x); byte-level vocabulary instead of the 50k GPT-NeoX tokenizer. For GPUs.
    "60m": dict(task="text", train_length=512, d_model=512, n_layers=8, n_heads=8, mlp_hidden=2048, steps=20000,
                batch_size=64, lr=6e-4, warmup=2000, eval_factors=(1, 2, 4, 8, 16), eval_samples=512, eval_batch=8,
                sigma=0.3, ckpt_every=1000),
}

_POSITIVE_INTS = ("train_length", "d_model", "n_layers", "n_heads", "steps", "batch_size", "eval_samples",
                  "eval_batch", "passkey_digits")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run (a preset fills it; command-line options override fields)."""
    task: str = "text"                 # one of TASKS
    train_length: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_hidden: Optional[int] = None   # default 4 * d_model
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    sigma: float = 0.3
    theta: float = 10000.0
    pad: str = "official"
    eval_factors: tuple = (1, 2, 4, 8)
    eval_samples: int = TEXT_WINDOWS  # text windows (the same at every length) / passkey samples per length
    eval_batch: int = 16
    passkey_digits: int = 5
    ckpt_every: int = 0               # 0: only at the end
    compile: bool = False

    def model_config(self, vocab_size: int):
        """The `icmltools.nn.TransformerConfig` of this run's model (imports torch)."""
        from icmltools.nn import TransformerConfig

        return TransformerConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                                 mlp_hidden=self.mlp_hidden, vocab_size=vocab_size)

    def eval_lengths(self) -> list[int]:
        return [int(round(f * self.train_length)) for f in self.eval_factors]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eval_factors"] = list(self.eval_factors)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "eval_factors" in kw:
            kw["eval_factors"] = tuple(kw["eval_factors"])
        return cls(**kw)

    def validate(self) -> None:
        """Bad values raise BadInputError naming the field."""
        if self.task not in TASKS:
            raise BadInputError(f"must be one of {', '.join(TASKS)}, got {self.task!r}", param="task")
        if self.pad not in PADS:
            raise BadInputError(f"must be one of {', '.join(PADS)}, got {self.pad!r}", param="pad")
        for name in _POSITIVE_INTS:
            if int(getattr(self, name)) < 1:
                raise BadInputError(f"must be >= 1, got {getattr(self, name)}", param=name)
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise BadInputError(f"{self.d_model} must split into {self.n_heads} heads (n_heads) of even width",
                                param="d_model")
        if not self.eval_factors or any(f <= 0 for f in self.eval_factors):
            raise BadInputError("must be positive numbers, e.g. 1,2,4,8", param="eval_factors")
        if self.lr <= 0:
            raise BadInputError(f"must be > 0, got {self.lr}", param="lr")
        if self.sigma < 0:
            raise BadInputError(f"must be >= 0, got {self.sigma}", param="sigma")
