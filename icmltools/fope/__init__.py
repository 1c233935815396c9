"""FoPE (Fourier Position Embedding, Hua et al., ICML 2025) and the fope-train comparison.

The reusable part: `FourierEmbedding`, a drop-in replacement for a RoPE module (`q, k = pe(q, k)`).
"""
from .embedding import FourierEmbedding, kept_count_formula, kept_frequencies, step_eye

__all__ = ["FourierEmbedding", "kept_frequencies", "kept_count_formula", "step_eye"]
