"""Seeding: one call seeds python, numpy and torch; implementations take explicit generators."""
from __future__ import annotations

import random


def seed_everything(seed: int, torch_too: bool = True):
    """Seed python's `random`, numpy's legacy global state and torch (if importable).

    Returns a fresh `numpy.random.Generator` seeded with `seed` for explicit use.
    """
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    if torch_too:
        try:
            import torch

            torch.manual_seed(seed)
        except ImportError:  # pragma: no cover
            pass
    return np.random.default_rng(seed)


def torch_generator(seed: int, device: str = "cpu"):
    """A `torch.Generator` on `device` seeded with `seed`."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
