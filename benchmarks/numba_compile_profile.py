"""Where the test suite spends numba compile time: runs pytest on a cold numba cache with this file as a plugin,
records every `numba:compile` event (function, signature, seconds, the test that triggered it) and prints one JSON
document: compile seconds per worker, the slowest compiles, and the seconds per (function, dtype x model count).

    python benchmarks/numba_compile_profile.py                       # the merge test files, 2 xdist workers
    python benchmarks/numba_compile_profile.py tests/test_cabs.py --workers 1 --top 40

The one-pass merge loops compile once per model count x dtype x variant (11-20 s each on the 2-core CI machine,
session 21): a test that picks a model count no other test uses pays all of them again.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MERGE_TESTS = ["tests/test_merge_engine.py", "tests/test_cabs.py", "tests/test_negmerge.py", "tests/test_taskvec.py"]
_OUT = "NUMBA_COMPILE_PROFILE_DIR"

# ------------------------------------------------------------------------------ the plugin (inside pytest's workers)

_current = {"test": None}
_records: list = []
_open: list = []


def pytest_configure(config):
    if not os.environ.get(_OUT):
        return
    from numba.core import event

    class _Listener(event.Listener):
        def on_start(self, ev):
            _open.append(time.perf_counter())

        def on_end(self, ev):
            t0 = _open.pop()
            data = ev.data or {}
            disp = data.get("dispatcher")
            fn = getattr(getattr(disp, "py_func", None), "__qualname__", "?")
            _records.append({"fn": fn, "sig": str(data.get("args")), "seconds": time.perf_counter() - t0,
                             "test": _current["test"], "nested": bool(_open)})

    event.register("numba:compile", _Listener())


def pytest_runtest_setup(item):
    _current["test"] = item.nodeid


def pytest_sessionfinish(session):
    out = os.environ.get(_OUT)
    if out and _current["test"] is not None:  # not xdist's controller: it runs no test
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(out, f"{worker}.json").write_text(json.dumps(_records))


# ------------------------------------------------------------------------------------------------ the driver

def _shape(sig: str) -> str:
    """`float32 x 3` for a signature holding a tuple of 3 float32 arrays (the one-pass loops), else ''."""
    m = re.search(r"UniTuple\(Array\((\w+), 1, '\w', \w+, aligned=\w+\), (\d+)\)", sig)
    return f"{m.group(1)} x {m.group(2)}" if m else ""


def summarize(folder: Path, top: int) -> dict:
    per_worker, rows = {}, []
    for f in sorted(folder.glob("*.json")):
        recs = [r for r in json.loads(f.read_text()) if not r["nested"]]  # nested compiles are inside their caller's
        per_worker[f.stem] = round(sum(r["seconds"] for r in recs), 2)
        rows += [dict(r, worker=f.stem) for r in recs]
    groups = defaultdict(lambda: [0.0, 0])
    for r in rows:
        g = groups[(r["fn"], _shape(r["sig"]))]
        g[0] += r["seconds"]
        g[1] += 1
    rows.sort(key=lambda r: -r["seconds"])
    return {"compile_seconds_per_worker": per_worker,
            "compile_seconds_total": round(sum(per_worker.values()), 2),
            "slowest": [{"fn": r["fn"], "shape": _shape(r["sig"]), "seconds": round(r["seconds"], 2),
                         "test": r["test"], "worker": r["worker"]} for r in rows[:top]],
            "by_function_and_shape": [{"fn": fn, "shape": shape, "seconds": round(s, 2), "compiles": n}
                                      for (fn, shape), (s, n) in sorted(groups.items(), key=lambda t: -t[1][0])[:top]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tests", nargs="*", default=MERGE_TESTS, help="test files or node ids (default: the merge tests)")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test: 2); 1 runs serially")
    ap.add_argument("--top", type=int, default=25, help="rows in each list")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out, cache = Path(tmp, "events"), Path(tmp, "numba_cache")  # a cold cache: what a clean clone compiles
        out.mkdir()
        path = [str(Path(__file__).parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = dict(os.environ, **{_OUT: str(out), "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(path)})
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "numba_compile_profile", "-p", "no:cacheprovider", *a.tests]
        if a.workers > 1:
            cmd += ["-n", str(a.workers), "--dist", "worksteal"]
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=sys.stderr).returncode
        doc = {"command": cmd[1:], "pytest_exit_code": rc, "wall_seconds": round(time.perf_counter() - t0, 2),
               **summarize(out, a.top)}
    print(json.dumps(doc, indent=2))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
