"""Versions and devices of the running environment, without importing heavy packages needlessly."""
from __future__ import annotations

import platform
import sys
from importlib import metadata

_PACKAGES = ("numpy", "torch", "scipy", "networkx", "pyscipopt", "gymnasium", "metaworld", "safetensors",
             "scikit-learn", "click", "rich")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions(packages: tuple[str, ...] = ("numpy", "torch")) -> dict:
    """python + selected package versions (read from metadata, no import)."""
    from icmltools import __version__

    out = {"python": platform.python_version(), "icml": __version__}
    for p in packages:
        out[p] = package_version(p)
    return out


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise" or "never"; None where there is none, e.g. not
    Linux): the merge engine's large buffers ask for huge pages, which "madvise" and "always" serve."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


def full_report() -> dict:
    """Everything `icml env` prints: platform, every dependency's version, torch devices, threads."""
    import os

    info: dict = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "transparent_hugepage": thp_mode(),
        "packages": {p: package_version(p) for p in _PACKAGES},
    }
    devices: dict = {"cpu": True, "cuda": [], "mps": False}
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices["cuda"].append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 2**30, 2)})
        info["cuda_build"] = torch.version.cuda
        mps = getattr(torch.backends, "mps", None)
        devices["mps"] = bool(mps is not None and mps.is_available())
    except ImportError:
        info["torch_threads"] = None
    info["devices"] = devices
    return info
