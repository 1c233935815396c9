"""Seeding: one derivation for every random stream (STYLE 18, 24).

`CommandRun` calls `seed_everything(seed)` once, so third-party code that reads global state is
reproducible too. Library code never seeds or reads global RNG state: each stage asks for its own
stream with `derive(seed, *keys)` (numpy's `SeedSequence`, the documented way to get independent
streams) and takes a `numpy.random.Generator` or `torch.Generator` from it. The same keys give the same
stream wherever the stage runs (alone or inside a pipeline); different keys give independent streams.

    s = derive(seed, "negmerge", "split")
    rng = s.numpy()                      # numpy Generator
    gen = s.torch()                      # torch.Generator on the CPU (s.torch("cuda:0") on a GPU)
    with s.torch_init():                 # torch modules built here (nn.Linear's default init reads
        model = build()                  #   the global generator) get their weights from this stream
"""
from __future__ import annotations

import contextlib
import random
import zlib


def _key_int(key) -> int:
    """A stable non-negative integer for a key: ints as they are, strings by CRC-32 of their UTF-8."""
    if isinstance(key, bool):
        return int(key)
    if isinstance(key, int):
        if key < 0:
            raise ValueError(f"seed keys must be >= 0, got {key}")
        return key
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8"))
    raise TypeError(f"seed keys are ints or strings, got {type(key).__name__}")


class Stream:
    """One derived random stream: `numpy()`, `torch(device)`, `int()`, `child(*keys)`, `torch_init()`."""

    __slots__ = ("entropy", "keys")

    def __init__(self, entropy: tuple[int, ...], keys: tuple = ()):
        self.entropy = entropy
        self.keys = keys

    def __repr__(self) -> str:
        return f"Stream{self.keys!r}"

    def seed_sequence(self):
        import numpy as np

        return np.random.SeedSequence(list(self.entropy))

    def numpy(self):
        """A fresh `numpy.random.Generator` (PCG64) at the start of this stream."""
        import numpy as np

        return np.random.Generator(np.random.PCG64(self.seed_sequence()))

    def int(self, bits: int = 63) -> int:
        """A non-negative integer seed below 2**bits, for APIs that take an int: bits=32 for scikit-learn and
        numpy's legacy RandomState, 31 for SCIP."""
        import numpy as np

        word = int(self.seed_sequence().generate_state(1, dtype=np.uint64)[0])
        return word % (2**bits)

    def torch(self, device: str = "cpu"):
        """A fresh `torch.Generator` on `device` seeded from this stream."""
        import torch

        g = torch.Generator(device=device)
        g.manual_seed(self.int(63))
        return g

    def child(self, *keys) -> "Stream":
        """The stream of a sub-stage: `derive(seed, *self.keys, *keys)`."""
        return Stream(self.entropy + tuple(_key_int(k) for k in keys), self.keys + keys)

    @contextlib.contextmanager
    def torch_init(self, devices=()):
        """Build torch modules inside: the global torch generator is seeded from this stream and restored
        on exit, so the caller's global state is untouched (torch's default initialisers take no generator)."""
        import torch

        with torch.random.fork_rng(devices=list(devices)):
            torch.random.manual_seed(self.int(63))
            yield


def derive(seed: int, *keys) -> Stream:
    """The stream for `(seed, *keys)`; keys are non-negative ints or strings (hashed with CRC-32)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return Stream((seed,) + tuple(_key_int(k) for k in keys), tuple(keys))


def as_stream(seed_or_stream, *keys) -> Stream:
    """Accept an int seed or a `Stream` (then `keys` name a child stream)."""
    if isinstance(seed_or_stream, Stream):
        return seed_or_stream.child(*keys) if keys else seed_or_stream
    return derive(int(seed_or_stream), *keys)


def seed_everything(seed: int, torch_too: bool = True):
    """Seed python's `random`, numpy's legacy global state and torch once per command (CommandRun only).

    Returns `derive(seed).numpy()` for the command's own use.
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
    return derive(seed).numpy()
