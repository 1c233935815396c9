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


_BALLOON_REPORTING = 5  # VIRTIO_BALLOON_F_REPORTING: the feature bit of virtio-balloon's free page reporting


def free_page_reporting(root: str = "/sys") -> int | None:
    """The order (log2 of 4 KB pages) from which this guest's kernel reports free blocks to its hypervisor, which
    discards their memory (virtio-balloon's free page reporting: the kernel's page_reporting is set up and a
    balloon device whose features include reporting is bound); None where it does not (not a VM, no balloon or
    no reporting, not Linux). A block reported is backed anew by the hypervisor when next touched: on such a host
    an allocation that takes one, a 2 MB huge page of order 9 always, writes its first bytes far slower than
    memory freed a moment ago (the merge engine's pool, docs/merge-engine.md)."""
    import os

    try:
        with open(os.path.join(root, "module/page_reporting/parameters/page_reporting_order")) as f:
            order = int(f.read().strip())
        drivers = os.path.join(root, "bus/virtio/drivers/virtio_balloon")
        for dev in os.listdir(drivers):
            try:
                with open(os.path.join(drivers, dev, "features")) as f:
                    bits = f.read().strip()
            except OSError:  # not a device (bind, unbind, uevent, module)
                continue
            if len(bits) > _BALLOON_REPORTING and bits[_BALLOON_REPORTING] == "1":
                return order
    except (OSError, ValueError):
        pass
    return None


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
        "free_page_reporting_order": free_page_reporting(),
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
