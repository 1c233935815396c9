"""Measurement helpers shared by the benchmarks: resident-set figures of this process from /proc, and one
measurement in a fresh Python subprocess (one thread) that prints its result as the last line of JSON.

tracemalloc does not see torch's, LAPACK's or safetensors' allocations; the kernel's VmHWM (peak resident set)
does, so every memory figure is taken in a fresh process: peak over a baseline read after that process's imports.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def vm(key: str) -> int:
    """VmHWM (peak) / VmRSS (current) / ... of this process in bytes, from /proc/self/status (-1 if absent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def mem_available() -> int:
    """MemAvailable of the machine in bytes (-1 if absent)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return -1


def one_thread_env(threads: int = 1) -> dict:
    """The environment of a measuring child: BLAS/OpenMP pools of `threads`, the repository on the path."""
    n = str(threads)
    return dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, PYTHONPATH=str(ROOT))


def run_child(script, args: list, timeout: float | None = None, threads: int = 1) -> dict:
    """Run `python script *args` in a fresh process; its last stdout line parsed as JSON, or {"error", "returncode"}
    (the last stderr line) when it fails or runs past `timeout` seconds."""
    try:
        p = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, env=one_thread_env(threads))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "returncode": None}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300], "returncode": p.returncode}
    return json.loads(p.stdout.strip().splitlines()[-1])


def reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0: '5' into /proc/self/clear_refs), so that a
    peak read later belongs to the work after this call and not to an import's transient; False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def best_of(fn, repeat: int) -> float:
    """Seconds of fn()'s fastest of `repeat` timed calls, after one untimed call (compiled, caches warm)."""
    import time

    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
