"""Process-wide memory settings for the streamed loops (standard library only)."""
from __future__ import annotations

import os
import sys

# glibc's malloc.h: mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its moving threshold (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc sets with it
_USER_KEYS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_STATE: dict = {}


def settle_malloc() -> bool:
    """Set glibc malloc's thresholds once per process to the values its own moving rule reaches after the
    process has freed a block of 32 MB or more: blocks below 32 MB from the heap (not a map of their own), and
    the heap's free top kept up to 64 MB instead of handed back. A merge allocates, per tensor, transient
    arrays of 0.1-12 MB (histograms, counts, sample rows: numpy's and the compiled loops'); while the moving
    threshold is still low, each is a fresh map whose pages fault in again on every use. Measured on the engine
    benchmark's files (base + 4 x 0.98 GB bf16, 2 threads): a fresh process's Breadcrumbs merge took 64-66K page
    faults (a second merge in the same process 28.8K), 30.8K with these values; benchmark children alternated,
    1.16-1.18 -> 1.12-1.14 s. Returns whether they were set: not on other C libraries, nor where the user set
    malloc's own variables (MALLOC_*_ or GLIBC_TUNABLES with glibc.malloc), whose choice stands."""
    if "done" in _STATE:
        return _STATE["done"]
    _STATE["done"] = False
    if not sys.platform.startswith("linux") or any(k in os.environ for k in _USER_KEYS) \
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the process's own C library
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl has a mallopt that ignores these)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _STATE["done"] = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _STATE["done"]
