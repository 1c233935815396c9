"""The cross-cutting pieces: seed derivation, comma lists, parameter -> flag errors, run folders, threads."""
import json
import os

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from icmltools.commands import common
from icmltools.core.errors import BadInputError
from icmltools.core.seed import as_stream, derive

# ------------------------------------------------------------------------------------------------ seeds


def test_same_keys_same_stream_and_stages_differ():
    a = derive(3, "extract").numpy().random(5)
    assert np.array_equal(a, derive(3, "extract").numpy().random(5))
    assert not np.array_equal(a, derive(3, "policy").numpy().random(5))
    assert not np.array_equal(a, derive(4, "extract").numpy().random(5))
    # ints and strings are different keys; order matters
    assert not np.array_equal(derive(3, 1, 2).numpy().random(3), derive(3, 2, 1).numpy().random(3))
    t1 = torch.rand(4, generator=derive(3, "x").torch())
    assert torch.equal(t1, torch.rand(4, generator=derive(3, "x").torch()))
    assert not torch.equal(t1, torch.rand(4, generator=derive(3, "y").torch()))


def test_derive_matches_numpy_seed_sequence_lists():
    """derive(seed, a, b) is numpy's default_rng([seed, a, b]): existing SeedSequence streams keep their numbers."""
    assert np.array_equal(derive(7, 3, 17).numpy().random(4), np.random.default_rng([7, 3, 17]).random(4))
    assert derive(7).numpy().random() == np.random.default_rng(7).random()


def test_child_equals_longer_derivation_and_as_stream():
    assert derive(1, "a").child("b", 2).int() == derive(1, "a", "b", 2).int()
    assert as_stream(1, "a").int() == derive(1, "a").int()
    assert as_stream(derive(1, "a"), "b").int() == derive(1, "a", "b").int()


def test_torch_init_is_reproducible_and_leaves_global_state_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    with derive(0, "init").torch_init():
        w1 = torch.nn.Linear(4, 3).weight.detach().clone()
    assert torch.equal(torch.random.get_rng_state(), before)
    with derive(0, "init").torch_init():
        w2 = torch.nn.Linear(4, 3).weight.detach().clone()
    assert torch.equal(w1, w2)
    # a stage run alone gives the numbers it gives after other stages consumed the global generator
    torch.rand(1000)
    with derive(0, "init").torch_init():
        w3 = torch.nn.Linear(4, 3).weight.detach().clone()
    assert torch.equal(w1, w3)


def test_derive_refuses_bad_keys():
    with pytest.raises(ValueError):
        derive(-1)
    with pytest.raises(ValueError):
        derive(0, -2)
    with pytest.raises(TypeError):
        derive(0, 1.5)


def test_library_never_seeds_global_state():
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "icmltools"
    pat = re.compile(r"torch\.manual_seed|np\.random\.seed\(|torch\.cuda\.manual_seed|default_rng\(")
    bad = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "seed.py"
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if pat.search(line) and not line.lstrip().startswith("#")]
    assert not bad, bad


class _Group(click.Group):
    """A group with the root's error boundary (library errors -> one `Error:` line, exit 2/1)."""

    def invoke(self, ctx):
        return common.run_guarded(lambda: super(_Group, self).invoke(ctx))


def _invoke(cmd, args):
    g = _Group("g")
    g.add_command(cmd)
    return CliRunner().invoke(g, [cmd.name, *args])


# ------------------------------------------------------------------------------------------------ comma lists


def _cmd(ptype):
    @common.command("t")
    @click.option("--x", type=ptype, default=None)
    def t(x):
        click.echo(json.dumps(list(x) if x is not None else None))
    return t


def test_comma_list_choices_all_case_and_dedup():
    t = _cmd(common.CommaList(("rope", "fope", "nope"), allow_all=True))
    r = CliRunner().invoke(t, ["--x", "FoPE, rope,fope"])
    assert r.exit_code == 0 and json.loads(r.stdout) == ["fope", "rope"]
    r = CliRunner().invoke(t, ["--x", "nope,all"])
    assert json.loads(r.stdout) == ["nope", "rope", "fope"]
    r = CliRunner().invoke(t, ["--x", "rope,alibi"])
    assert r.exit_code == 2 and "alibi" in r.output and "choose from rope, fope, nope" in r.output
    r = CliRunner().invoke(t, ["--x", " , "])
    assert r.exit_code == 2


def test_comma_list_numbers_are_finite():
    t = _cmd(common.CommaList(kind=float, positive=True))
    assert json.loads(CliRunner().invoke(t, ["--x", "1,2.5,8"]).stdout) == [1.0, 2.5, 8.0]
    for bad in ("1,nan", "inf", "1,-2", "1,x"):
        r = CliRunner().invoke(t, ["--x", bad])
        assert r.exit_code == 2, bad


# ------------------------------------------------------------------------------------------------ errors


def test_library_parameter_errors_are_shown_with_the_flag():
    err = BadInputError("must be finite", param="lam")
    assert str(err) == "lam: must be finite"

    @common.command("t")
    @click.option("--lam", "lam", type=float)
    @click.option("--m", "lower", type=float)
    def t(lam, lower):
        raise BadInputError("must be finite", param="lower" if lower else "lam")

    r = _invoke(t, ["--lam", "1"])
    assert r.exit_code == 2 and r.stderr.strip() == "Error: --lam: must be finite"
    r = _invoke(t, ["--m", "1"])
    assert r.stderr.strip() == "Error: --m: must be finite"


# ------------------------------------------------------------------------------------------------ run folders


def _runner_cmd(fail: str | None):
    @common.command("rf")
    @click.option("--out", default=None)
    @common.standard_options(seed=True)
    @click.pass_context
    def rf(ctx, out, seed, quiet, verbose):
        with common.CommandRun(ctx, "rf", seed=seed, packages=("numpy",), reference={"title": "T"}) as run:
            d = run.make_dir(out, config={"k": 1})
            if fail == "early":
                raise BadInputError("bad", param="out")
            if fail == "late":
                (d / "weights.bin").write_bytes(b"x")
                raise BadInputError("bad")
            run.result = {"answer": 42}
    return rf


def test_run_folder_written_once_by_the_run(tmp_path):
    r = _invoke(_runner_cmd(None), ["--out", str(tmp_path / "o"), "--seed", "5"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["command"] == "rf" and cfg["seed"] == 5 and cfg["config"] == {"k": 1} and cfg["params"]["seed"] == 5
    assert json.loads((tmp_path / "o" / "result.json").read_text()) == {"answer": 42}
    assert doc["artifacts"]["result"].endswith("result.json") and doc["reference"] == {"title": "T"}
    # a second run into the same non-empty folder is refused
    r = _invoke(_runner_cmd(None), ["--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--out:" in r.stderr and "not empty" in r.stderr


def test_failed_run_leaves_no_empty_folder_but_keeps_partial_work(tmp_path):
    r = _invoke(_runner_cmd("early"), ["--out", str(tmp_path / "e")])
    assert r.exit_code == 2 and not (tmp_path / "e").exists()
    r = _invoke(_runner_cmd("early"), ["--out", str(tmp_path / "p" / "q" / "e")])
    assert r.exit_code == 2 and not (tmp_path / "p").exists()  # parents it made go too
    r = _invoke(_runner_cmd("early"), [])  # the default $ICML_RUNS_DIR/<command>/<time>/
    assert r.exit_code == 2 and not (tmp_path / "runs").exists()
    r = _invoke(_runner_cmd("late"), ["--out", str(tmp_path / "l")])
    assert r.exit_code == 2 and (tmp_path / "l" / "weights.bin").exists()
    assert not (tmp_path / "l" / "result.json").exists()


# ------------------------------------------------------------------------------------------------ threads


def test_set_threads_sizes_torch_and_child_processes(monkeypatch):
    from icmltools.core.device import set_threads

    old = torch.get_num_threads()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "7")
    try:
        assert set_threads(1) == 1
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        from icmltools.merge import kernels

        if kernels.available():  # loading the compiled loops starts numba's pool: torch's count must stay
            import numba

            assert numba.get_num_threads() == 1 and torch.get_num_threads() == 1
        with pytest.raises(BadInputError):
            set_threads(0)
    finally:
        torch.set_num_threads(old)


# ------------------------------------------------------------------------------------------------ summary table


def test_summary_table_on_a_terminal_only_and_json_unchanged(monkeypatch):
    import io

    from rich.console import Console

    buf = io.StringIO()
    term = Console(file=buf, force_terminal=True, width=100)

    @common.command("tb")
    @common.standard_options(seed=False)
    @click.pass_context
    def tb(ctx, quiet, verbose):
        with common.CommandRun(ctx, "tb", packages=()) as run:
            run.result = {"x": 1}
            run.table("Demo", ["method", "ratio"], [["smooth", 0.3084339586], ["sun", 0.19309]])

    monkeypatch.setattr(common, "stderr_console", lambda quiet=False: term)
    r = _invoke(tb, [])
    assert r.exit_code == 0 and json.loads(r.stdout)["result"] == {"x": 1}
    out = buf.getvalue()
    assert "Demo" in out and "smooth" in out and "0.3084" in out
    buf.truncate(0)
    r = _invoke(tb, ["-q"])
    assert r.exit_code == 0 and "smooth" not in buf.getvalue()


def test_a_compile_notice_shows_where_progress_bars_do(monkeypatch):
    """core.device.off_main's notice (a long numba compile) is information on NOTICE_LOGGER: a command shows it on a
    terminal unless -q, as its progress bars, and elsewhere only with -v; one run's terminal does not carry over
    to the next run in the same process (so a bad input's one Error line stays alone in a pipe)."""
    import io
    import logging

    from rich.console import Console

    from icmltools.core.device import NOTICE_LOGGER

    @common.command("nt")
    @common.standard_options(seed=False)
    @click.pass_context
    def nt(ctx, quiet, verbose):
        with common.CommandRun(ctx, "nt", packages=()) as run:
            logging.getLogger(NOTICE_LOGGER).info("compiling the test loops")
            run.result = {"x": 1}

    def shown(args, terminal):
        buf = io.StringIO()
        con = Console(file=buf, force_terminal=terminal, width=100)
        monkeypatch.setattr(common, "stderr_console", lambda quiet=False: con)
        r = _invoke(nt, args)
        assert r.exit_code == 0 and json.loads(r.stdout)["result"] == {"x": 1}
        return "compiling the test loops" in buf.getvalue()

    assert shown([], terminal=True)
    assert not shown([], terminal=False)  # after a terminal run in this process
    assert not shown(["-q"], terminal=True)
    assert shown(["-v"], terminal=False)


def test_set_threads_does_not_import_torch_and_torch_loaded_later_follows():
    code = ("import os, sys; os.environ.pop('OMP_NUM_THREADS', None)\n"
            "from icmltools.core.device import set_threads; set_threads(1)\n"
            "print('torch' in sys.modules)\n"
            "import torch; print(torch.get_num_threads())")
    assert _python(code) == ["False", "1"]


def test_the_collector_paused_runs_no_collection_and_leaves_the_block_s_objects_old_and_collectable():
    """numba's load runs with the cyclic collector paused (core.device._collector_paused): no collection starts in
    the block however much it allocates, nor at its end; its objects end in the oldest generation, unscanned, and a
    cycle made there is still collected later; the collector's state (on or off) is restored, after an error too."""
    import gc
    import weakref

    from icmltools.core.device import _collector_paused

    class Node:
        pass

    runs = []

    def seen(phase, info):
        runs.append(phase)

    gc.callbacks.append(seen)
    try:
        with _collector_paused():
            made = [[i] for i in range(50_000)]  # far past the young generation's threshold (700)
            cyc = Node()
            cyc.me = cyc
            ref = weakref.ref(cyc)
            del cyc
            assert not gc.isenabled()
        assert runs == [] and gc.isenabled()
        assert any(o is made[0] for o in gc.get_objects(generation=2))
        gc.collect()
        assert ref() is None
        gc.disable()
        with _collector_paused():
            pass
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(ValueError), _collector_paused():
            raise ValueError
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
        gc.enable()


def test_numba_loads_the_merge_loops_without_a_full_garbage_collection():
    """A fresh process loading the merge loops (numba's import, our module, its thread pool) runs no collection of
    the older generations and few young ones (two here, after the pause): 120-odd ran there before, one a full
    collection of 25-31 ms with torch loaded."""
    pytest.importorskip("numba")
    code = ("import gc, torch\n"
            "runs = []\n"
            "gc.callbacks.append(lambda phase, info: runs.append(info['generation']) if phase == 'start' else None)\n"
            "from icmltools.merge import kernels as K\n"
            "assert K.available()\n"
            "print(len(runs) <= 4, max(runs, default=0), gc.isenabled())")
    assert _python(code) == ["True", "0", "True"]


def test_settled_malloc_serves_growing_transient_arrays_from_the_heap():
    """core.memory.settle_malloc: where glibc's moving threshold would map each new, larger block afresh (every
    page faulted in again), the settled thresholds serve them from the heap, whose pages are reused: arrays of
    128 KB to 4 MB (below numpy's huge-page advice) made and dropped in turn, as a merge's per-tensor histograms
    and counts are. Refused (False, nothing set) where the user set malloc's own variables."""
    if not _python("from icmltools.core.memory import settle_malloc; print(settle_malloc())") == ["True"]:
        pytest.skip("not glibc")
    code = ("import sys, resource, numpy as np\n"
            "from icmltools.core.memory import settle_malloc\n"
            "ok = settle_malloc() if sys.argv[-1] == '1' else None\n"
            "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for k in range(2, 64):\n"
            "    a = np.ones(k << 14, np.float32); del a\n"
            "print(ok, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)")
    import subprocess
    import sys

    def run(flag, **env):
        out = subprocess.run([sys.executable, "-c", code, flag], capture_output=True, text=True,
                             env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        ok, faults = out.stdout.split()
        return ok, int(faults)

    (ok0, moving), (ok1, settled) = run("0"), run("1")
    assert ok0 == "None" and ok1 == "True"
    assert moving > 25_000  # 126 MB mapped afresh in all: 4 KB pages, each faulted in (32.2K here)
    assert settled < moving / 8  # the heap grown to 4 MB once (1.0K here)
    assert run("1", MALLOC_TRIM_THRESHOLD_="131072") == ("False", run("1", MALLOC_TRIM_THRESHOLD_="131072")[1])


def test_load_numba_skips_the_scipy_blas_probe_and_leaves_scipy_and_numba_whole():
    """The merge and P-step kernels load numba without its probe's import of scipy.linalg: after a compiled
    merge loop has run and the P-step's module loaded, through their own seams, scipy.linalg is not loaded (fails
    with a plain `import numba`); it imports as usual afterwards, and a loop calling np.dot (BLAS) still compiles
    and runs (numba checks for BLAS again then)."""
    pytest.importorskip("numba")
    code = ("import sys, torch\n"
            "from icmltools.merge import kernels as K; print(K.count_nonzero(torch.ones(3)))\n"
            "from icmltools.guidedquant.quant import numba_available; print(numba_available())\n"
            "print('scipy.linalg' in sys.modules, sys.modules.get('scipy.linalg', 0) is None)\n"
            "import numba, numpy as np, scipy.linalg; print(scipy.linalg.norm([3.0, 4.0]))\n"
            "f = numba.njit(lambda a, b: np.dot(a, b)); print(f(np.ones(3), np.full(3, 2.0)))")
    assert _python(code) == ["3", "True", "False", "False", "5.0", "6.0"]


def test_wide_vectors_are_asked_for_only_on_avx512_and_only_where_nothing_was_chosen(monkeypatch):
    """_wide_vectors sets numba's CPU features to the host's with `-prefer-256-bit` on a host with AVX-512 and
    VBMI2 (Ice Lake on), once (a second call keeps them), and leaves them alone without those, where the user chose
    a CPU name or features, and once numba's code generator exists."""
    import types

    pytest.importorskip("numba")
    import llvmlite.binding as ll
    import numba.core.registry as registry

    from icmltools.core import device

    def attempt(host, name=None, features=None, generated=False):
        monkeypatch.setattr(device, "_WIDE_FEATURES", None)
        monkeypatch.setattr(ll, "get_host_cpu_features", lambda: types.SimpleNamespace(flatten=lambda: host))
        target = types.SimpleNamespace(**({"_toplevel_target_context": object()} if generated else {}))
        monkeypatch.setattr(registry, "cpu_target", target)
        fake = types.SimpleNamespace(config=types.SimpleNamespace(CPU_NAME=name, CPU_FEATURES=features))
        first = device._wide_vectors(fake)
        return first, device._wide_vectors(fake), fake.config.CPU_FEATURES

    wide = "+64bit,+avx2,+avx512f,+avx512vbmi2,+fma"
    assert attempt(wide) == (True, True, wide + ",-prefer-256-bit")
    assert attempt("+64bit,+avx2,-avx512f,-avx512vbmi2,+fma") == (False, False, None)
    assert attempt("+64bit,+avx2,+avx512f,-avx512vbmi2,+fma") == (False, False, None)  # Skylake / Cascade Lake
    assert attempt(wide, name="generic") == (False, False, None)
    assert attempt(wide, features="+avx2") == (False, False, "+avx2")
    assert attempt(wide, generated=True) == (False, False, None)


def test_numba_compiles_with_wide_vectors_where_the_host_has_avx512(tmp_path):
    """Through the kernels' own seam, numba's code generator gets `-prefer-256-bit` exactly on a host with AVX-512
    and VBMI2, and numba_wide_vectors says so; NUMBA_CPU_FEATURES set by the user is kept as given."""
    import os
    import subprocess
    import sys

    pytest.importorskip("numba")
    code = ("import torch\n"
            "from icmltools.merge import kernels as K; K.count_nonzero(torch.ones(3))\n"
            "import llvmlite.binding as ll; from numba.core.registry import cpu_target\n"
            "from icmltools.core.device import numba_wide_vectors as w\n"
            "f = cpu_target.target_context.codegen()._tm_features.split(',')\n"
            "h = ll.get_host_cpu_features().flatten().split(',')\n"
            "print('+avx512f' in h and '+avx512vbmi2' in h, '-prefer-256-bit' in f, w(), len(f))")

    def run(**env):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    avx512, wide, said, _ = run()
    assert wide == said == avx512
    assert run(NUMBA_CPU_FEATURES="+64bit,+sse2", NUMBA_CACHE_DIR=str(tmp_path))[1:] == ["False", "False", "2"]


def _python(code: str, **env) -> list:
    """The words a fresh Python prints running `code` (with `env` added to the environment); it must succeed."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def _cached_run(probe: str, later: str) -> list:
    """`probe` run once (it compiles and caches its loop if this checkout has not yet), then `probe` + `later` in a
    fresh process, whose words are returned; skipped where the probe's second word says no loop came from the
    cache."""
    _python(probe)
    got = _python(probe + later)
    if got[1] == "0":
        pytest.skip("numba could not cache the loop here (no cache hit to load)")
    return got


def test_numba_loads_cached_loops_without_its_registries_and_compiles_as_before():
    """A cached compiled loop loads without numba's registry refresh (numba.np.npyimpl, one of the modules it
    imports, stays unloaded), a later compile in the same process still works (it refreshes itself), and a lean
    load that raises falls back to numba's own load (the refresh runs, the result is the same)."""
    pytest.importorskip("numba")
    probe = ("import sys, torch\n"
             "from icmltools.merge import kernels as K; print(K.count_nonzero(torch.tensor([0.0, 2.0, -1.0])))\n"
             "print(sum(K._mod().count_nonzero.stats.cache_hits.values()), 'numba.np.npyimpl' in sys.modules)\n")
    later = ("import numba, numpy as np\n"
             "f = numba.njit(lambda a: np.sqrt(a * a).sum()); print(f(np.full(4, -2.0)), 'numba.np.npyimpl' in sys.modules)")
    raising = ("from numba.core.runtime import rtsys\n"
               "own, calls = rtsys.initialize, []\n"
               "def once(ctx):\n"
               "    calls.append(1)\n"
               "    if len(calls) == 1:\n"
               "        raise RuntimeError('lean load refused')\n"
               "    return own(ctx)\n"
               "rtsys.initialize = once\n")

    got = _cached_run(probe, later)
    assert got == ["2", "1", "False", "8.0", "True"]
    assert _python("import numba.core.runtime\n" + raising + probe) == ["2", "1", "True"]


def test_numba_loads_cached_loops_without_parsing_their_bitcode_and_links_them_when_asked():
    """A cached loop loads and runs with its module's bitcode kept as bytes (unparsed); a compile in the same process
    of a new function calling it parses it then (the link) and the new function's result is right; the engine
    still answers for the loaded loop's symbols, and for none it lacks."""
    pytest.importorskip("numba")
    probe = ("import numba, numpy as np, torch\n"
             "from icmltools.merge import kernels as K\n"
             "M = K._mod()\n"
             "print(M._round_bf16(np.float32(1.0)))\n"
             "ov = M._round_bf16.overloads[M._round_bf16.signatures[0]]\n"
             "print(sum(M._round_bf16.stats.cache_hits.values()), '_icml_bitcode' in ov.library.__dict__)\n")
    later = ("g = numba.njit(lambda x: M._round_bf16(x) + np.uint16(1))\n"
             "print(g(np.float32(-2.5)), '_icml_bitcode' in ov.library.__dict__)\n"
             "ee = ov.library._codegen._engine\n"
             "print(ee.is_symbol_defined(ov.fndesc.llvm_func_name), ee.is_symbol_defined('no_such_symbol'))\n")

    got = _cached_run(probe, later)
    assert got == ["16256", "1", "True", str(0xC020 + 1), "False", "True", "False"]


def test_numba_runtime_loads_from_its_cache_file_and_recompiles_a_corrupt_one(tmp_path):
    """numba's runtime is compiled once and written to a cache file (NUMBA_CACHE_DIR); the next process loads it
    from there (its bitcode unparsed, as a cached loop's) and the loops and a new compile work; a file whose
    bytes no longer match its SHA-256 is compiled again (and rewritten), with the same results."""
    pytest.importorskip("numba")
    code = ("import numba, numpy as np, torch\n"
            "from icmltools.merge import kernels as K\n"
            "print(K.count_nonzero(torch.tensor([0.0, 2.0, -1.0])))\n"
            "from numba.core.runtime import rtsys\n"
            "print('_icml_bitcode' in rtsys.library.__dict__)\n"
            "g = numba.njit(lambda n: np.arange(n).sum())\n"
            "print(g(5))\n")

    def run():
        return _python(code, NUMBA_CACHE_DIR=str(tmp_path))

    assert run() == ["2", "False", "10"]  # compiled (the loops too, in this new cache folder), then written
    files = list(tmp_path.glob("icml-nrt-*.bin"))
    assert len(files) == 1
    assert run() == ["2", "True", "10"]  # loaded from the file
    raw = bytearray(files[0].read_bytes())
    raw[-1] ^= 1
    files[0].write_bytes(bytes(raw))
    assert run() == ["2", "False", "10"]  # the damaged file refused: compiled, and written again
    assert run() == ["2", "True", "10"]


def test_numba_cache_saved_by_processes_at_once_keeps_every_signature_with_its_own_code(tmp_path):
    """Processes that save numba cache entries of one function at once (pytest-xdist's workers compiling a cold
    cache) keep every entry, each with its own data: four processes, 40 signatures each, into one index, with
    numba loaded as the commands load it (core.device.load_numba: the saves under a lock). numba's own save took
    one data file name in two processes and kept 57-63 of the 160, 30-34 of those with another's data."""
    pytest.importorskip("numba")
    import subprocess
    import sys
    import time

    go = tmp_path / "go"
    code = ("import os, sys, time\n"
            "from icmltools.core import device\n"
            "device.load_numba()\n"
            "from numba.core import caching\n"
            "f = caching.IndexDataCacheFile(sys.argv[1], 'fn-1.py311', ('stamp', 1))\n"
            "open(sys.argv[3] + sys.argv[2], 'w').close()\n"
            "while not os.path.exists(sys.argv[3]):\n"
            "    time.sleep(0.001)\n"
            "for i in range(40):\n"
            "    f.save((f'sig{sys.argv[2]}-{i}', 'cpu'), f'data {sys.argv[2]} {i}')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(w), str(go)]) for w in range(4)]
    while not all((tmp_path / f"go{w}").exists() for w in range(4)) and all(p.poll() is None for p in procs):
        time.sleep(0.01)  # each has loaded numba and waits for `go`
    go.write_text("")
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    from numba.core import caching

    f = caching.IndexDataCacheFile(str(tmp_path), "fn-1.py311", ("stamp", 1))
    got = {(w, i): f.load((f"sig{w}-{i}", "cpu")) for w in range(4) for i in range(40)}
    assert got == {(w, i): f"data {w} {i}" for w in range(4) for i in range(40)}


def test_a_swallowed_ctrl_c_still_ends_the_command_as_interrupted(tmp_path):
    """A library that catches the KeyboardInterrupt of a Ctrl-C and goes on (a callback from C does: PySCIPOpt's
    printed it and SCIP's teardown went on, seen 2026-12-02) must not let the command finish as if none had
    come: no JSON, no result.json, the run folder removed, exit 130 (through CommandRun and through a bare
    function under run_guarded)."""
    import signal

    @common.command("sw")
    @click.option("--out", default=None)
    @common.standard_options(seed=False)
    @click.pass_context
    def sw(ctx, out, quiet, verbose):
        with common.CommandRun(ctx, "sw", packages=()) as run:
            run.make_dir(out)
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass  # swallowed
            run.result = {"x": 1}

    r = _invoke(sw, ["-q", "--out", str(tmp_path / "k")])
    assert r.exit_code == 130 and r.stdout == "" and not (tmp_path / "k").exists()
    assert r.stderr.strip() == "Error: interrupted (nothing was written)"

    def bare():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return 7

    with pytest.raises(click.ClickException) as ei:
        common.run_guarded(bare)
    assert ei.value.exit_code == 130
    assert common.run_guarded(lambda: 7) == 7 and not common.ctrl_c_seen()  # no Ctrl-C: as before


def test_interrupted_resumable_run_keeps_its_work_and_says_where(tmp_path):
    @common.command("ir")
    @click.option("--out", default=None)
    @click.option("--work/--no-work", default=True)
    @common.standard_options(seed=False)
    @click.pass_context
    def ir(ctx, out, work, quiet, verbose):
        with common.CommandRun(ctx, "ir", packages=()) as run:
            d = run.make_dir(out, resumable=True)
            if work:
                (d / "ckpt.bin").write_bytes(b"x")
            raise KeyboardInterrupt

    r = _invoke(ir, ["-q", "--out", str(tmp_path / "k")])
    assert r.exit_code == 130 and (tmp_path / "k" / "ckpt.bin").exists()
    assert r.stderr.strip() == f"Error: interrupted: the partial run is kept in {tmp_path / 'k'} (resume from it)"
    r = _invoke(ir, ["-q", "--no-work", "--out", str(tmp_path / "n")])
    assert r.exit_code == 130 and not (tmp_path / "n").exists()
    assert r.stderr.strip() == "Error: interrupted (nothing was written)"


def test_llvm_interleave_nests_and_then_leaves_the_choice_to_llvm(monkeypatch):
    """llvm_interleave sets LLVM's `-force-vector-interleave` for its block, the enclosing block's count after an
    inner one, and 0 (LLVM's own choice) after the outermost."""
    pytest.importorskip("numba")
    import llvmlite.binding as ll

    from icmltools.core import device

    seen = []
    monkeypatch.setattr(ll, "set_option", lambda name, opt: seen.append((name, opt)))
    with device.llvm_interleave(1):
        with device.llvm_interleave(2):
            assert device._INTERLEAVE == [1, 2]
    assert [o for _, o in seen] == [f"-force-vector-interleave={n}" for n in (1, 2, 1, 0)]
    assert device._INTERLEAVE == []


def test_numba_jit_interleave_changes_only_its_own_compiles():
    """A loop compiled through numba_jit(..., interleave=1) gets other vector code than LLVM's choice (x86-64),
    and a loop compiled after it gets the same code as one compiled before (the option does not stay set)."""
    import platform

    pytest.importorskip("numba")
    code = ("import hashlib, numpy as np\n"
            "from icmltools.core.device import numba_jit\n"
            "def mk(il):\n"
            "    def f(a, b, c):\n"
            "        for i in range(a.shape[0]):\n"
            "            c[i] = a[i] * np.float32(2.0) + b[i]\n"
            "    return numba_jit(f, interleave=il)[0]\n"
            "def code(d):\n"
            "    x = np.ones(10, np.float32); d(x, x, x)\n"
            "    asm = next(iter(d.inspect_asm().values()))\n"
            "    return hashlib.sha1(''.join(s for s in asm.splitlines() if s.startswith('\\tv')).encode()).hexdigest()\n"
            "a, b, c = code(mk(None)), code(mk(1)), code(mk(None))\n"
            "print(a == c, a != b)")
    same_after, other = _python(code)
    assert same_after == "True"
    if platform.machine() in ("x86_64", "AMD64"):
        assert other == "True"


def test_free_page_reporting_reads_the_order_where_a_balloon_reports(tmp_path):
    """envinfo.free_page_reporting: the kernel's page_reporting_order where a bound virtio-balloon device has the
    reporting feature (bit 5 of its features), None without the module, the driver, the bit, or with bad text."""
    from icmltools.core.envinfo import free_page_reporting

    def tree(order, devices):
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        params = root / "module/page_reporting/parameters"
        drivers = root / "bus/virtio/drivers/virtio_balloon"
        drivers.mkdir(parents=True)
        (drivers / "uevent").write_text("DRIVER=virtio_balloon\n")
        if order is not None:
            params.mkdir(parents=True)
            (params / "page_reporting_order").write_text(f"{order}\n")
        for name, bits in devices.items():
            (drivers / name).mkdir()
            (drivers / name / "features").write_text(bits + "\n")
        return str(root)

    on, off = "0110010100000000", "0110000100000000"
    assert free_page_reporting(tree(9, {"virtio0": on})) == 9
    assert free_page_reporting(tree(10, {"virtio3": off, "virtio0": on})) == 10
    assert free_page_reporting(tree(9, {"virtio0": off})) is None
    assert free_page_reporting(tree(9, {"virtio0": "01100"})) is None  # too short to hold the bit
    assert free_page_reporting(tree(9, {})) is None
    assert free_page_reporting(tree(None, {"virtio0": on})) is None
    assert free_page_reporting(tree("nine", {"virtio0": on})) is None
    assert free_page_reporting(str(tmp_path / "absent")) is None
