"""The bad-input catalogue: what a user gets wrong, and what every command must answer.

Each row: exit code, exactly one line on stderr (no traceback), and no file left behind. Generic rows
cover every command at once (every float option refuses NaN/inf; unknown options; outputs that cannot be
written; Ctrl-C). Command-specific rows live in the `BAD_INPUTS` table of each command's test file.
"""
import json
import os
import signal
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner

from icmltools.commands.cli import cli
from icmltools.commands.registry import COMMANDS


def _leaves(cmd: click.Command, path: tuple):
    """Every runnable (sub)command with its argv prefix."""
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            yield from _leaves(cmd.get_command(ctx, name), path + (name,))
    else:
        yield path, cmd


def _all_commands():
    ctx = click.Context(cli)
    for name in sorted(COMMANDS):
        yield from _leaves(cli.get_command(ctx, name), (name,))


def _args(cmd: click.Command) -> list[str]:
    """Placeholders for required positional arguments (the option check comes before any file is read)."""
    return ["missing-input.file" for p in cmd.params if isinstance(p, click.Argument) and p.required]


FLOAT_OPTIONS = [pytest.param(path, opt.opts[-1], _args(cmd), id=" ".join(path) + " " + opt.opts[-1])
                 for path, cmd in _all_commands() for opt in cmd.params
                 if isinstance(opt, click.Option) and isinstance(opt.type, click.types.FloatParamType)]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("path,flag,args", FLOAT_OPTIONS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_option_refuses_non_finite(path, flag, args, value, in_tmp, check_bad_input):
    res = CliRunner().invoke(cli, [*path, *args, flag, value])
    line = check_bad_input(res, 2, flag, root=in_tmp)
    assert "finite" in line or "range" in line, line  # a range check may answer first (inf > max)


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p)) for p, _ in _all_commands()])
def test_unknown_option_is_a_usage_error(path, in_tmp, check_bad_input):
    res = CliRunner().invoke(cli, [*path, "--no-such-option"])
    check_bad_input(res, 2, "--no-such-option", root=in_tmp)


OUT_INTO_A_FILE = {  # a command that makes a run folder, pointed under a regular file
    "negmerge": ["--preset", "tiny", "--methods", "negmerge"],
    "cabs-merge": ["--n-seeds", "1", "--methods", "cabs"],
    "fope-train": ["--steps", "2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--batch-size", "2",
                   "--train-length", "16", "--eval-factors", "1", "--eval-samples", "2"],
}


@pytest.mark.parametrize("name", sorted(OUT_INTO_A_FILE))
def test_unwritable_run_folder_names_the_users_path(name, in_tmp, check_bad_input):
    (in_tmp / "afile").write_text("x")
    before = check_bad_input.snapshot(in_tmp)
    res = CliRunner().invoke(cli, [name, "-q", "--threads", "1", *OUT_INTO_A_FILE[name], "--out", "afile/run"])
    check_bad_input(res, 1, "cannot write afile/run: not a directory", root=in_tmp, before=before)


def test_unwritable_output_file_names_the_users_path(in_tmp, check_bad_input):
    (in_tmp / "afile").write_text("x")
    before = check_bad_input.snapshot(in_tmp)
    res = CliRunner().invoke(cli, ["onemax-sim", "--mode", "worst-case", "--plot", "afile/p.png"])
    line = check_bad_input(res, 1, "cannot write afile/p.png", root=in_tmp, before=before)
    assert ".tmp" not in line


# Ctrl-C: a real SIGINT in a subprocess, once the command is well into its work.
INTERRUPT = {
    "fope-train": ["fope-train", "--threads", "1", "--no-save"],  # with checkpoints the folder is kept (resumable)
    "negmerge": ["negmerge", "--threads", "1"],
    "cabs-merge": ["cabs-merge", "--threads", "1", "--out", "runs/demo"],  # the folder is under the checked runs/
    # interrupted during collection (no stage finished: nothing kept; a finished stage keeps the folder, resumable)
    "goskill": ["goskill", "--threads", "1", "--tasks", "toy-a,toy-b", "--episodes", "100000"],
    "guidedquant": ["guidedquant", "--threads", "1"],  # numba's P-step (compiled off the main thread)
    "lowrank": ["lowrank", "--threads", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(INTERRUPT))
def test_ctrl_c_stops_at_once_and_writes_nothing(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICML_")}
    env["ICML_RUNS_DIR"] = str(tmp_path / "runs")
    env["PYTHONFAULTHANDLER"] = "1"  # a crash prints every thread's Python stack (a SIGSEGV in CI printed nothing)
    p = subprocess.Popen([sys.executable, "-m", "icmltools", *INTERRUPT[name]], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=tmp_path,  # a background job ignores SIGINT:
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # give the child the default
    time.sleep(6)
    assert p.poll() is None, "finished before the signal"
    t0 = time.perf_counter()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert time.perf_counter() - t0 < 15
    assert p.returncode == 130, "\n".join(x for x in err.decode().splitlines() if "Extension modules" not in x)[-4000:]
    assert out == b""
    assert err.decode().strip().splitlines()[-1] == "Error: interrupted (nothing was written)"
    assert "Traceback" not in err.decode()
    left = [f for f in (tmp_path / "runs").rglob("*") if f.is_file()] if (tmp_path / "runs").exists() else []
    assert not left, left


_LOOPS = '''
from icmltools.core.device import numba_jit


def total(x):
    s = 0.0
    for v in x:
        s += v * v
    return s


def peak(x):
    m = x[0]
    for v in x:
        m = max(m, v)
    return m


def count(x, t):
    c = 0
    for v in x:
        c += v > t
    return c


total, peak, count = (numba_jit(f)[0] for f in (total, peak, count))
'''

_LOAD = '''
import json, sys, threading
import numpy as np
import loops

main, other = [], []


def on_main(frame, event, arg):  # a Ctrl-C raises KeyboardInterrupt on the main thread, wherever it is then
    if event == "call" and frame.f_code.co_name == "_raw_object_cache_getbuffer":
        main.append(1)
        if len(main) == 3:
            raise KeyboardInterrupt


def elsewhere(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "_raw_object_cache_getbuffer":
        other.append(1)


if sys.argv[1] == "interrupt":
    sys.settrace(on_main)
    threading.settrace(elsewhere)
x = np.arange(10.0)
r = (loops.total(x), loops.peak(x), loops.count(x, 4.5))
sys.settrace(None)
print(json.dumps({"result": r, "on_main": len(main), "elsewhere": len(other)}))
'''


def test_a_ctrl_c_while_numba_loads_cached_loops_cannot_crash_the_process(tmp_path):
    """numba compiles, and loads from its cache, in the compiling thread (core.device.off_main): llvmlite's
    object-cache callback never runs on the main thread, where a KeyboardInterrupt raised in it was swallowed and
    LLVM then read an address it never linked (SIGSEGV: cabs-merge interrupted in CI). Here the interrupt is raised
    in that callback on the main thread (at its third call, where it crashed); it fails with numba loading on the
    main thread (rc -11)."""
    (tmp_path / "loops.py").write_text(_LOOPS)
    (tmp_path / "load.py").write_text(_LOAD)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    for mode in ("compile", "interrupt"):  # the second run loads the first's cache
        p = subprocess.run([sys.executable, "load.py", mode], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, (mode, p.returncode, p.stderr[-2000:])
        doc = json.loads(p.stdout)
        assert doc["result"] == [285.0, 9.0, 5]
    assert doc["on_main"] == 0 and doc["elsewhere"] >= 3  # loaded, all of it off the main thread


_CTRL_C_IN_WAIT = '''
import os, signal, threading
from icmltools.core.device import off_main

release, seen = threading.Event(), {}


def work():  # stands for a compile: Ctrl-C comes while it runs
    os.kill(os.getpid(), signal.SIGINT)
    release.wait(30)
    seen["finished"] = True


try:
    off_main(work, **KW)
except KeyboardInterrupt:
    seen["raised_while_running"] = "finished" not in seen
release.set()
'''  # KW: off_main's keywords, set before it

_WAIT = "KW = {}" + _CTRL_C_IN_WAIT + '''
print(seen["raised_while_running"], off_main(lambda: threading.current_thread().name), off_main(sum, (1, 2)))
'''


_NOTICE = '''
import logging, sys, time
import icmltools.core.device as D

h = logging.StreamHandler(sys.stderr)
h.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
logging.getLogger("icmltools").addHandler(h)
logging.getLogger("icmltools").setLevel(logging.INFO)
D.COMPILE_NOTICE_AFTER = 0.05
D.off_main(time.sleep, 0.3, notice="slow work")  # announced (information)
D.off_main(time.sleep, 0.3, notice="slow work")  # not again in this process
D.off_main(lambda: None, notice="fast work")  # done before the notice is due
KW = {"notice": "interrupted work"}
''' + _CTRL_C_IN_WAIT + '''
D.COMPILE_NOTICE_AFTER = 0.0  # a real compile, through numba_jit's dispatcher


def f(x):
    return x + 1


fn = D.numba_jit(f)[0]  # a script of -c: no cache folder for it, compiled in this process
print(seen["raised_while_running"], fn(2))
'''


def test_a_long_compile_is_announced_once_and_a_ctrl_c_still_stops_its_wait(tmp_path):
    """off_main with a notice (numba's compiles, through numba_jit): work still running after
    COMPILE_NOTICE_AFTER seconds logs the notice once per process as information on NOTICE_LOGGER, work done
    sooner logs nothing, and a Ctrl-C in the wait is raised at once as without it. (Where a command shows it:
    tests/test_core.py.)"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    p = subprocess.run([sys.executable, "-c", _NOTICE], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["True", "3"]
    assert p.stderr.splitlines() == [  # the interrupt came before its notice was due
        "INFO slow work",
        "INFO compiling a loop for new argument types with numba (once: cached for later runs)"]


def test_ctrl_c_during_a_compile_is_raised_on_the_main_thread_at_once():
    """off_main: the main thread's wait raises KeyboardInterrupt while the work still runs in the compiling
    thread (which then goes on: the next work runs there too)."""
    p = subprocess.run([sys.executable, "-c", _WAIT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["True", "numba-compile_0", "3"]
