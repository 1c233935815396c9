"""Named configurations, from the CPU quick preset to the paper's 60M model for GPUs."""
from __future__ import annotations

PRESETS: dict[str, dict] = {
    # bare `icml fope-train`: byte-level stdlib corpus, N = 64, about a minute per model on one core
    "quick": dict(task="text", train_length=64, d_model=64, n_layers=2, n_heads=2, steps=600, batch_size=16,
                  lr=2e-3, warmup=30, eval_factors=(1, 2, 4, 8), eval_samples=32, sigma=0.3),
    # passkey at N = 128 as the spec's suggested quick preset (about 3 min per model on one core)
    "passkey": dict(task="passkey", train_length=128, d_model=64, n_layers=2, n_heads=2, steps=1500,
                    batch_size=32, lr=1e-3, warmup=50, eval_factors=(1, 2, 4, 8), eval_samples=100, sigma=0.3),
    # the spec's CPU prototype scale on text: d 128, 4 heads, 2 layers, 1000 steps
    "cpu": dict(task="text", train_length=64, d_model=128, n_layers=2, n_heads=4, steps=1000, batch_size=32,
                lr=1e-3, warmup=50, eval_factors=(1, 2, 4, 8), eval_samples=64, sigma=0.3),
    # the paper's 60M shape (OLMo-60M: d 512, 8 heads, 8 layers, SwiGLU hidden 2048, N = 512, sigma 0.3,
    # lr 6e-4 cosine to 0.1x); byte-level vocabulary instead of the 50k GPT-NeoX tokenizer. For GPUs.
    "60m": dict(task="text", train_length=512, d_model=512, n_layers=8, n_heads=8, mlp_hidden=2048, steps=20000,
                batch_size=64, lr=6e-4, warmup=2000, eval_factors=(1, 2, 4, 8, 16), eval_samples=64, eval_batch=8,
                sigma=0.3, ckpt_every=1000),
}
