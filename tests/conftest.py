import os
import signal

import pytest

# The docs quote figures of small trainings (fope-train, guidedquant, cabs-merge's demo, ...). torch's CPU math
# picks its code paths by CPU (MKL's GEMM kernels, ATen's vector width, oneDNN's ISA), which moves those figures'
# last digits from one x86 CPU to another (seen: the docs' figures of 2026-12-01 differ in the third digit on an
# AMD EPYC the next day). The suite pins the paths meant to give the same bits on every x86-64 CPU (MKL's
# conditional numerical reproducibility, COMPATIBLE branch; AVX2 for ATen and oneDNN), set before torch loads
# them; the docs' figures are printed under the same pins (README "Reproducible figures"). They do not pin
# everything (an Intel Xeon with AVX-512 still differed, 2026-12-02): the examples that moved carry a
# `cpu-drift` tolerance (tests/test_readme.py).
for _k, _v in (("MKL_CBWR", "COMPATIBLE"), ("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2")):
    os.environ.setdefault(_k, _v)


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_reaches_python():
    """The Ctrl-C tests need SIGINT to raise KeyboardInterrupt here and in the commands they start. A shell
    that runs the suite in the background (`make test &`, nohup) hands it SIGINT ignored, which children
    inherit and Python then leaves ignored; restore Python's handler (children then start with the default)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True)
def _clean_icml_env(monkeypatch, tmp_path):
    """No ICML_* variable from the caller leaks in; run folders land in tmp_path."""
    for k in list(os.environ):
        if k.startswith("ICML_"):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ICML_RUNS_DIR", str(tmp_path / "runs"))
    yield


def invoke_cli(args, input=None, expect_code=0):
    """Invoke `icml ARGS` through CliRunner; returns (result, parsed JSON or None)."""
    import json

    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    res = CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)
    assert res.exit_code == expect_code, (list(args), res.exit_code, res.stdout[-2000:], res.stderr[-2000:])
    doc = json.loads(res.stdout) if expect_code == 0 else None
    return res, doc


@pytest.fixture
def run_cli():
    """:func:`invoke_cli` as a fixture."""
    return invoke_cli


@pytest.fixture(scope="session")
def icml_json_once(tmp_path_factory):
    """`icml ARGS` through CliRunner, its stdout parsed as JSON, run once per test session: a later call with the
    same arguments, in this worker or another xdist worker, reads the document the first one stored. For the
    slow, seeded examples that several tests read (the same command under different jq filters in the README and
    the docs; guidedquant's seed-0 demo in its docs and in its orderings test). One lock file per argument list:
    a second caller waits while the first runs. A run that fails stores nothing (each caller sees it fail)."""
    import fcntl
    import hashlib
    import json

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the session's workers (pytest-xdist's documented pattern)
    store = root / "icml-json-once"
    store.mkdir(exist_ok=True)

    def _run(args):
        args = [str(a) for a in args]
        key = hashlib.sha1("\0".join(args).encode()).hexdigest()
        doc_path = store / f"{key}.json"
        with open(store / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if doc_path.exists():
                return json.loads(doc_path.read_text())
            res, doc = invoke_cli(args)
            tmp = doc_path.with_suffix(".tmp")
            tmp.write_text(res.stdout)
            tmp.replace(doc_path)
            return doc

    return _run


def snapshot(root) -> set:
    """Every path (files and folders) under `root`."""
    from pathlib import Path

    return {p.resolve() for p in Path(root).rglob("*")}


@pytest.fixture
def check_bad_input():
    """The bad-input contract (tests/test_bad_inputs.py and each command's BAD_INPUTS table): the exit code,
    exactly one non-empty stderr line `Error: ...` (containing `needle`), no traceback, nothing on stdout,
    and nothing left under `root` that was not there before (`before`: a `snapshot(root)` taken first)."""

    def check(res, code: int, needle: str | None = None, root=None, before=frozenset()):
        assert res.exit_code == code, (res.exit_code, res.stdout[-500:], res.stderr[-1000:])
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
        assert "Traceback" not in res.stderr and res.stdout == ""
        if needle is not None:
            assert needle in lines[0], (needle, lines[0])
        if root is not None:
            left = sorted(str(p) for p in snapshot(root) - set(before))
            assert not left, f"left behind: {left}"
        return lines[0]

    check.snapshot = snapshot
    return check
