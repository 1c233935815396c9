"""Hua, Jiang, Lv, Zhang, Sun, Fan, Zhu, Qi, Ding and Zhou, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", ICML 2025 (arXiv 2412.17739; official code
github.com/TsinghuaC3I/Fourier-Position-Embedding, `olmo/model.py`).

FoPE and the fope-train comparison against RoPE, NoPE, ALiBi and RoPE + PI / YaRN on small LMs:

* `options`: choice lists, presets, `RunConfig`, `REFERENCE` (stdlib only: the command imports it).
* `embedding`: `FourierEmbedding`, the reusable part, a drop-in for a RoPE module (`q, k = pe(q, k)`).
* `model`, `data`, `train`: the model per position embedding, the corpora and the passkey task,
  training / evaluation / checkpoints. `api`: what the command calls. `dist`: torchrun (DDP) roles.

The names below are loaded on first use, so `import icmltools.fope.options` does not import torch.
"""
from __future__ import annotations

import importlib

_LAZY = {"FourierEmbedding": "embedding", "kept_frequencies": "embedding", "kept_count_formula": "embedding",
         "step_eye": "embedding"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
