"""The one JSON envelope every command prints.

Keys: schema_version, command, icml_version, reference (the method's paper), params, device, seed, result,
artifacts, timing, env.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from icmltools import SCHEMA_VERSION, __version__

from .envinfo import versions

ENVELOPE_KEYS = ("schema_version", "command", "icml_version", "reference", "params", "device", "seed", "result",
                 "artifacts", "timing", "env")


class Timer:
    """Named wall-clock phases: `with timer.phase("train"): ...`; `timer.as_dict()` gives seconds."""

    def __init__(self):
        self.start = time.perf_counter()
        self.phases: dict[str, float] = {}

    def phase(self, name: str):
        timer = self

        class _Phase:
            def __enter__(self):
                self.t0 = time.perf_counter()
                return self

            def __exit__(self, *exc):
                timer.phases[name] = timer.phases.get(name, 0.0) + time.perf_counter() - self.t0
                return False

        return _Phase()

    def as_dict(self) -> dict:
        d = {k: round(v, 6) for k, v in self.phases.items()}
        d["total_s"] = round(time.perf_counter() - self.start, 6)
        return d


@dataclass
class Envelope:
    command: str
    params: dict = field(default_factory=dict)
    device: Any = None
    seed: int | None = None
    result: Any = None
    artifacts: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    packages: tuple = ("numpy", "torch")
    reference: dict | None = None

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": self.command,
            "icml_version": __version__,
            "reference": self.reference,
            "params": self.params,
            "device": self.device,
            "seed": self.seed,
            "result": self.result,
            "artifacts": self.artifacts,
            "timing": self.timing,
            "env": versions(self.packages),
        }
