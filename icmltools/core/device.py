"""Device resolution and thread control, shared by every torch command."""
from __future__ import annotations

import contextlib
import re

from .errors import BadInputError, DeviceUnavailableError

_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


_EXIT = {"without_finalizing": False}


def exit_without_finalizing() -> None:
    """Ask the console entry point to end this process by os._exit once the command is done (exit handlers run
    and stdout/stderr are flushed first), skipping the interpreter's finalization. For a process that joined a
    torch process group: gloo's worker threads outlive destroy_process_group, and one still releasing the last
    collective's work takes the GIL for a Python object in it; during finalization that thread is made to exit
    inside a noexcept destructor and the process aborts ("terminate called without an active exception"; a core
    dump of a torchrun rank, 2026-12-03: main thread in Py_FinalizeEx's collection, a gloo runLoop thread in
    ~AsyncBarrierWork -> ~ThreadLocalState -> gil_scoped_acquire -> pthread_exit; 5 aborts in 216 runs of
    three torchrun jobs at once on 2 cores before, none in 135 after)."""
    _EXIT["without_finalizing"] = True


def exits_without_finalizing() -> bool:
    """Whether :func:`exit_without_finalizing` was asked for in this process."""
    return _EXIT["without_finalizing"]


def validate_device_spec(spec: str) -> str:
    """Check the syntax of a device string without importing torch."""
    spec = (spec or "auto").strip().lower()
    if not _DEVICE_RE.match(spec):
        raise BadInputError(f"unknown device {spec!r}; use auto, cpu, cuda, cuda:N or mps")
    return spec


def resolve_device(spec: str = "auto") -> str:
    """Resolve `auto|cpu|cuda|cuda:N|mps` to a concrete torch device string.

    `auto` prefers CUDA, then MPS, then CPU. An explicitly requested device that is absent raises
    `DeviceUnavailableError` instead of silently falling back.
    """
    spec = validate_device_spec(spec)
    import torch

    if spec == "auto":
        if torch.cuda.is_available():
            return "cuda:0"
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
        return "cpu"
    if spec == "cpu":
        return "cpu"
    if spec == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceUnavailableError("--device mps requested but MPS is not available on this machine")
        return "mps"
    # cuda or cuda:N
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(f"--device {spec} requested but CUDA is not available on this machine")
    index = int(spec.split(":")[1]) if ":" in spec else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailableError(f"--device {spec} requested but only {count} CUDA device(s) are visible")
    return f"cuda:{index}"


def device_info(device: str) -> dict:
    """A JSON-able description of a resolved device (name, memory for CUDA)."""
    info: dict = {"resolved": device}
    if device.startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(name=props.name, total_memory_gb=round(props.total_memory / 2**30, 2))
    return info


_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")
_requested: dict = {"threads": None}


def set_threads(n: int | None) -> int | None:
    """The one place thread pools are sized: torch, every BLAS/OpenMP pool already loaded (threadpoolctl),
    and, through the environment, those loaded later and those of child processes.

    Call it once, after the heavy imports (`CommandRun` does). On small models and 2 shared cores one
    thread was measured 25-50x faster than two. None leaves everything alone; returns the count applied.
    """
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInputError(f"threads must be an integer >= 1, got {n!r}", param="threads")
    import os

    for var in _THREAD_ENV:
        os.environ[var] = str(n)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n)
    except ImportError:  # pragma: no cover - threadpoolctl is a declared dependency
        pass
    import sys

    torch = sys.modules.get("torch")  # a command that never loads torch does not pay its 3 s import; one that
    if torch is not None and torch.get_num_threads() != n:  # loads it later reads OMP_NUM_THREADS set above
        torch.set_num_threads(n)
    _requested["threads"] = n
    numba_threads()
    return n


def load_numba():
    """Import numba for a module of compiled loops, without its BLAS probe's import of scipy.linalg, and with
    its cached loops loaded without the registries (:func:`_cache_loads_without_refresh`).

    numba's first compile (its own first load from its cache too) imports its NumPy registries; one of them
    probes for BLAS by importing scipy.linalg, 0.1-0.3 s of a merge's 1-2 s here, for np.correlate/np.convolve,
    which our loops do not call. The probe runs once, here, with scipy.linalg hidden (it finds no BLAS: those
    two would use numba's own loop); np.dot and np.linalg check for BLAS again when a loop using them is
    compiled, and scipy.linalg imports as usual afterwards. Nothing is hidden when scipy.linalg is already loaded
    (the probe is then free). :func:`load_numba_module` calls it in the compiling thread while the main thread
    waits, before any other thread may import scipy.linalg (the commands' worker threads import nothing). Raises
    ImportError when numba does not import."""
    import sys

    import numba

    _wide_vectors(numba)
    if "numba.np.arraymath" not in sys.modules and "scipy.linalg" not in sys.modules:
        sys.modules["scipy.linalg"] = None  # an import of it raises ImportError while the probe runs
        try:
            import numba.np.arraymath  # noqa: F401  (the probe runs at its import)
        finally:
            if sys.modules.get("scipy.linalg", 0) is None:
                del sys.modules["scipy.linalg"]
    _cache_loads_without_refresh()
    _cache_files_locked()
    _linking_modules_on_demand()
    _runtime_from_cache()
    return numba


def _wide_vectors(numba) -> bool:
    """Let LLVM vectorise numba's loops 512 bits wide on a CPU with AVX-512 from Ice Lake on, before numba's
    first compile in the process; True where that is (or was already) set (:func:`numba_wide_vectors`).

    LLVM tunes Intel's AVX-512 CPUs to prefer 256-bit vectors (`prefer-256-bit`: older ones lower their clock under
    512-bit code), so our loops used half the width of the registers. They are element-wise streams, and 512-bit
    vectors ran them faster on the two AVX-512 hosts measured (a Rocket Lake and an Emerald Rapids:
    docs/merge-engine.md), e.g. the in-memory TIES merge of 2^24 elements x 4 bf16 models 3.80-4.12 ns per element
    against 4.51-5.91 (one thread, alternated). The gate is AVX512-VBMI2, new with Ice Lake's cores: the Emerald
    Rapids host reports it, and so does a host LLVM names Rocket Lake (session 47: a Xeon VM whose CPUID model is
    Rocket Lake's, with AMX), and the Skylake / Cascade Lake Xeons (the clock drops; not measured here) lack it.
    AMD's Zen 4 has it too; on the Zen 4 host measured, LLVM's own tuning ran the merges no differently within the
    noise. Only LLVM's tuning changes: the loops have no fastmath and no float reductions, so the results are
    bitwise the same. The setting is numba's, for the whole process (numba code compiled later in it follows it); it
    is left alone where the user chose a CPU or its features (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES: NUMBA_CPU_FEATURES
    set to the host's keeps LLVM's tuning) and once numba's code generator exists (other numba code compiled first).
    numba keys its cache by the features, so the two settings never load each other's code."""
    global _WIDE_FEATURES
    config = numba.config
    if _wide_in(config):
        return True
    if config.CPU_NAME is not None or config.CPU_FEATURES is not None:
        return False
    try:
        from numba.core.registry import cpu_target

        if "_toplevel_target_context" in vars(cpu_target):  # the code generator exists: too late
            return False
        features = _host_features()
    except Exception:  # an unknown numba layout or a host whose features LLVM cannot read: LLVM's default
        return False
    if not {"+avx512f", "+avx512vbmi2"} <= set(features.split(",")):
        return False
    config.CPU_FEATURES = _WIDE_FEATURES = features + ",-prefer-256-bit"
    return True


def _host_features() -> str:
    """The host CPU's features as LLVM names them ("+avx512f,-amx-tile,..."; raises where LLVM cannot read them)."""
    import llvmlite.binding as ll

    return ll.get_host_cpu_features().flatten()


def numba_target_has(*features) -> bool:
    """Whether the CPU numba compiles for has every one of `features` (LLVM's names, without the sign): its
    CPU_FEATURES where set (the user's, or :func:`_wide_vectors`'), else the host's; False where a CPU is named
    without features, or the host's cannot be read. For a compiled loop choosing its code when compiled (numba
    keys its cache by the target, so another CPU compiles its own)."""
    import numba

    config = numba.config
    if config.CPU_FEATURES is not None:
        have = config.CPU_FEATURES
    elif config.CPU_NAME is not None:
        return False
    else:
        try:
            have = _host_features()
        except Exception:  # noqa: BLE001 (LLVM cannot read them: assume none)
            return False
    have = set(have.split(","))
    return all("+" + f in have for f in features)


def numba_wide_vectors() -> bool:
    """Whether this process compiles numba's loops with 512-bit vectors preferred (:func:`_wide_vectors`)."""
    import sys

    numba = sys.modules.get("numba")
    return numba is not None and _wide_in(numba.config)


def _wide_in(config) -> bool:
    """Whether numba's `config` holds the features :func:`_wide_vectors` set."""
    return _WIDE_FEATURES is not None and config.CPU_FEATURES == _WIDE_FEATURES


_WIDE_FEATURES: str | None = None  # the features _wide_vectors gave numba (None: not set)


def _cache_loads_without_refresh() -> None:
    """Let numba load a cached compiled function without first refreshing its whole target context.

    numba 0.68's `Cache.load_overload` refreshes the context before every load: the first time in a process it
    imports its typing and lowering registries (some 40 modules: 0.12-0.14 s of a merge's first compiled call
    here, 0.16 -> 0.03 s), which only compiling uses; a compile refreshes the context itself (CompilerBase), and
    a lowering lookup that misses does too. Loading machine code needs only numba's runtime (NRT: the loops
    allocate), so a load here initialises that alone; if such a load raises, numba's own load (refresh first)
    runs instead. A numba without the two methods this calls keeps its own load."""
    from numba.core import caching
    from numba.core.runtime import rtsys

    cls = caching.Cache
    own = cls.load_overload
    if getattr(own, "_lean", False) or not all(hasattr(cls, a) for a in ("_load_overload",
                                                                        "_guard_against_spurious_io_errors")):
        return

    def load_overload(self, sig, target_context):
        try:
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:  # numba's own way: the context refreshed, then the load (its errors are its own)
            return own(self, sig, target_context)

    load_overload._lean = True
    cls.load_overload = load_overload


def _cache_files_locked() -> None:
    """Let several processes save and load numba's cache of one function at once (pytest-xdist's workers, two
    commands run side by side), each save and load of its index and data under a lock of the index's file
    (`flock` of `<index>.lock`: exclusive to save, shared to load).

    numba 0.68 saves a new entry by reading the index, taking the first data file name it does not list, writing
    the index, then the data: two processes that save different signatures of one function at once take the same
    name, and the index kept (the last written) can name the other's data. Four processes saving 40 signatures
    each into one index, unlocked: 57-63 of the 160 found again, 30-34 of those with another signature's data (a
    lookup then gets another signature's compiled code; our reading of a typing error in the merge tests' first run
    after their loops changed, session 50). Where the lock file cannot be opened (a cache folder we cannot write,
    where numba does not save either), or on a platform without `fcntl`, numba's own."""
    try:
        import fcntl
        import os
    except ImportError:  # pragma: no cover - not POSIX
        return
    from numba.core import caching

    cls = caching.IndexDataCacheFile
    own_save, own_load = getattr(cls, "save", None), getattr(cls, "load", None)
    if own_save is None or own_load is None or getattr(own_save, "_locked", False):
        return

    @contextlib.contextmanager
    def locked(self, kind):
        fd = None
        try:
            fd = os.open(self._index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, kind)
        except (AttributeError, OSError):  # no lock to be had (a file system without flock): numba's own
            pass
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # closing it releases the lock

    def save(self, key, data):
        with locked(self, fcntl.LOCK_EX):
            return own_save(self, key, data)

    def load(self, key):
        with locked(self, fcntl.LOCK_SH):
            return own_load(self, key)

    save._locked = True
    cls.save, cls.load = save, load


def numba_jit(fn, interleave: int | None = None, **opts):
    """`numba.njit(cache=True, nogil=True, **opts)(fn)` whose compiles run in the compiling thread
    (:func:`compiles_off_main`); where numba finds no writable cache folder, compiled in every process instead.
    With `interleave`, LLVM's vectorised loops of its compiles (those it compiles inside too) are interleaved that
    many times (:func:`llvm_interleave`). Returns (the function, whether it is cached)."""
    import numba

    try:
        return compiles_off_main(numba.njit(cache=True, nogil=True, **opts)(fn), interleave), True
    except RuntimeError:  # no writable cache location
        return compiles_off_main(numba.njit(nogil=True, **opts)(fn), interleave), False


_INTERLEAVE: list = []  # the interleave counts of the compiles running inside each other, innermost last


@contextlib.contextmanager
def llvm_interleave(n: int):
    """LLVM's loop vectoriser interleaves each vectorised loop compiled in the block n times (its option
    `-force-vector-interleave`, process-wide: compiles_off_main holds numba's compiler lock around the block), then
    as before: the enclosing block's count, or 0, which leaves the choice to LLVM's cost model again (the same code
    as a process that never set it, checked on a small loop's assembly). LLVM chose 4 for the deferred pass's fused
    loop of Breadcrumbs (4 models, two windows each): 64 elements per iteration in 512-bit vectors, more live values
    than the 32 registers, spilled to the stack and read back in the loop (docs/merge-engine.md, Decisions)."""
    import llvmlite.binding as ll

    _INTERLEAVE.append(int(n))
    ll.set_option("", f"-force-vector-interleave={int(n)}")
    try:
        yield
    finally:
        _INTERLEAVE.pop()
        ll.set_option("", f"-force-vector-interleave={_INTERLEAVE[-1] if _INTERLEAVE else 0}")


def load_numba_module(name: str):
    """:func:`load_numba`, then import the module `name` of compiled loops, both in the compiling thread
    (:func:`off_main`), where numba's thread pool is started too: numba's import, the module's first function
    (LLVM and its JIT) and the pool's start (its library's symbols) call into llvmlite. Returns the module;
    raises ImportError when numba does not import."""
    import importlib

    def load():
        with _collector_paused():
            numba = load_numba()
            mod = importlib.import_module(name)
            numba.get_num_threads()  # starts the pool; the count is set per thread, on the main one (numba_threads)
        return mod

    return off_main(load)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the block (back on after it, where it was on), then every object
    of the process moved to the oldest generation without a scan. numba's import allocates enough objects to start
    a full collection, which walks every object of the process: with torch loaded, one collection of 25-31 ms,
    35-42 ms of collections in all, in a load of 0.17 s (a merge's fresh process). Only paused, the collections
    came after the block, inside the merge (one of 12 ms in TIES, a full one of 43 ms in CA-magnitude).
    The move costs the caller's objects too only their place: a cycle among them waits for the next full
    collection instead of a young one."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # every tracked object into the permanent generation, then back into the oldest: unscanned
        gc.unfreeze()
        if was:
            gc.enable()


def compiles_off_main(dispatcher, interleave: int | None = None):
    """Make a numba function compile, or load from numba's cache, in the compiling thread (:func:`off_main`); a
    compile still running after COMPILE_NOTICE_AFTER seconds is announced once (off_main's `notice`: a cached
    load takes milliseconds; a first 2-model TIES merge took 10.5 s, 1.55 s warm, its progress standing still in
    the compiles). With `interleave`, each compile runs inside :func:`llvm_interleave` under numba's (re-entrant)
    compiler lock, so that no compile in another thread sees the option."""
    own = dispatcher.compile
    if interleave is not None:
        from numba.core.compiler_lock import global_compiler_lock

        plain = own

        def own(sig):
            with global_compiler_lock, llvm_interleave(interleave):
                return plain(sig)

    parts = getattr(getattr(dispatcher, "py_func", None), "__module__", "").split(".")
    what = f"the {parts[1]} loops" if len(parts) > 2 and parts[0] == "icmltools" else "a loop"
    notice = f"compiling {what} for new argument types with numba (once: cached for later runs)"
    dispatcher.compile = lambda sig: off_main(own, sig, notice=notice)
    return dispatcher


_COMPILER: list = []
COMPILE_NOTICE_AFTER = 2.0  # seconds a compile runs before off_main's `notice` is logged


def off_main(fn, *args, notice: str | None = None):
    """fn(*args) in one helper thread (the compiling thread) while the main thread waits, so that Ctrl-C is
    raised in that wait, never inside numba or llvmlite; called from any other thread, or within a compile
    (numba's compiler lock held), it runs where it is.

    Raised inside them, a KeyboardInterrupt can crash the process: in the ctypes callback of llvmlite's object
    cache (`ExecutionEngine._raw_object_cache_getbuffer`, called while MCJIT links a compiled or a cached object)
    it is swallowed, the callback returns no object, and LLVM goes on to read an address it never linked
    (SIGSEGV in numba's `set_env`: `icml cabs-merge` interrupted while it loaded its cached loops, once in CI;
    reproduced by raising KeyboardInterrupt in that callback). After a Ctrl-C in the wait the helper finishes its
    work alone while the command unwinds (the console entry point then ends the process at once: `commands.cli`);
    llvmlite serialises every call into LLVM with its own lock, so an LLVM object the main thread frees meanwhile
    waits its turn. With `notice`, a call still running after COMPILE_NOTICE_AFTER seconds logs it as information
    on NOTICE_LOGGER, from the waiting main thread, once per process and text (a command shows it as it draws
    its progress bars, on a terminal only: `commands.common.CommandRun`; elsewhere with -v)."""
    import sys
    import threading

    lock = sys.modules.get("numba.core.compiler_lock")
    if threading.current_thread() is not threading.main_thread() or (
            lock is not None and lock.global_compiler_lock.is_locked()):
        return fn(*args)
    if not _COMPILER:
        from concurrent.futures import ThreadPoolExecutor

        _COMPILER.append(ThreadPoolExecutor(1, "numba-compile"))
    fut = _COMPILER[0].submit(fn, *args)
    if notice is not None:
        from concurrent.futures import TimeoutError as Pending

        try:
            return fut.result(timeout=COMPILE_NOTICE_AFTER)
        except Pending:
            if notice not in _NOTICED:  # once per process
                import logging

                _NOTICED.add(notice)
                logging.getLogger(NOTICE_LOGGER).info(notice)
    return fut.result()


_NOTICED: set = set()
NOTICE_LOGGER = __name__  # off_main's notices (progress, not a warning: a command decides where they show)


def numba_threads() -> None:
    """Size numba's parallel loops to the count set by :func:`set_threads` (capped by numba's pool), when numba
    is loaded; a module that loads numba later calls this after its import. (Not NUMBA_NUM_THREADS: numba
    refuses a change of that variable once its pool has started.)"""
    import sys

    numba, n = sys.modules.get("numba"), _requested["threads"]
    if numba is not None and n is not None:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        torch = sys.modules.get("torch")  # starting numba's OpenMP pool resets the OpenMP count torch reads
        if torch is not None and torch.get_num_threads() != n:
            torch.set_num_threads(n)


def _linking_modules_on_demand() -> None:
    """Let numba load a cached compiled function without parsing the LLVM bitcode it keeps beside the machine code.

    numba 0.68 caches a function as its object code and the bitcode of its module, for later compiles that call it
    to link (`serialize_using_object_code`); a load parses that bitcode at once (`CPUCodeLibrary._unserialize`), then
    walks its every function into the JIT engine's set of defined symbols. Running the loaded machine code needs
    neither: a first TIES merge of the benchmark's files loads 13 functions, 0.057 s, of which the parses took 0.028
    s and the walks 0.015. Here the bitcode is kept as bytes and parsed, its symbols added, when numba first asks
    for the module to link (`_get_module_for_linking`); a library loaded so takes its entry points' addresses from
    the JIT engine, which has linked its object; and the engine completes its set from every library not yet
    parsed before it answers no for a name (what a compile's finalisation asks). A numba without these methods,
    or a cache entry of another kind, loads as numba does."""
    import weakref

    import llvmlite.binding as ll
    from numba.core import codegen

    lib, jlib, eng = (getattr(codegen, n, None) for n in ("CPUCodeLibrary", "JITCodeLibrary", "JitEngine"))
    needed = [(lib, "_unserialize"), (lib, "_get_module_for_linking"), (lib, "_set_compiled_object"),
              (lib, "enable_object_caching"), (lib, "_finalize_final_module"), (jlib, "get_pointer_to_function"),
              (eng, "is_symbol_defined"), (eng, "_load_defined_symbols")]
    if None in (lib, jlib, eng) or not all(hasattr(c, a) for c, a in needed) or not issubclass(jlib, lib) \
            or getattr(lib._unserialize, "_lean", False):
        return
    pending = weakref.WeakSet()  # the libraries loaded here whose bitcode is not parsed yet
    own_unserialize = lib._unserialize.__func__
    own_link, own_pointer, own_defined = lib._get_module_for_linking, jlib.get_pointer_to_function, \
        eng.is_symbol_defined

    def parse(library) -> None:
        bitcode = library.__dict__.pop("_icml_bitcode", None)
        if bitcode is not None:
            pending.discard(library)
            library._shared_module = ll.parse_bitcode(bitcode)
            library._codegen._engine._load_defined_symbols(library._shared_module)

    def _unserialize(cls, codegen_, state):
        name, kind, data = state
        if kind != "object" or not isinstance(data, tuple) or len(data) != 2:
            return own_unserialize(cls, codegen_, state)
        library = codegen_.create_library(name)
        library.enable_object_caching()
        library._set_compiled_object(data[0])
        library._icml_bitcode = data[1]
        pending.add(library)
        library._finalize_final_module()
        return library

    def _get_module_for_linking(self):
        parse(self)
        return own_link(self)

    def get_pointer_to_function(self, name):
        if "_icml_bitcode" not in self.__dict__:
            return own_pointer(self, name)
        self._ensure_finalized()
        return self._codegen._engine.get_function_address(name)

    def is_symbol_defined(self, name):
        if own_defined(self, name):
            return True
        if not pending:
            return False
        for library in list(pending):
            parse(library)
        return own_defined(self, name)

    _unserialize._lean = True
    lib._unserialize = classmethod(_unserialize)
    lib._get_module_for_linking = _get_module_for_linking
    jlib.get_pointer_to_function = get_pointer_to_function
    eng.is_symbol_defined = is_symbol_defined


_NRT_MAGIC = b"ICMLNRT1"


def _runtime_from_cache() -> None:
    """Let numba's runtime (NRT: the reference counts our loops' arrays use) load its machine code from a file of
    ours instead of compiling it in every process.

    numba compiles the runtime's LLVM module once per process, at its first compile or cached load
    (`nrtdynmod.compile_nrt_functions`): 0.019 s of the 0.026 s a merge's first cached loop took here. Here the
    module is built as numba builds it and named by a hash of its IR text, numba's and llvmlite's versions and the
    target (CPU and features); a file of that name in numba's cache folder (NUMBA_CACHE_DIR) or else our own
    `__pycache__` holds its object code and bitcode, which load as numba loads a cached function
    (:func:`_linking_modules_on_demand`). The file is checked against the SHA-256 it carries: a missing, corrupt or
    unwritable one means compiling as numba does (and writing the file, atomically, where the folder allows). A
    numba without these functions compiles its own."""
    from numba.core.runtime import nrtdynmod

    own = nrtdynmod.compile_nrt_functions
    if getattr(own, "_lean", False) or not hasattr(nrtdynmod, "create_nrt_module"):
        return

    def compile_nrt_functions(ctx):
        ir_mod, library = nrtdynmod.create_nrt_module(ctx)
        path = _runtime_cache_path(ctx.codegen(), str(ir_mod))
        data = _read_runtime(path)
        if data is not None:
            try:
                return ctx.codegen().unserialize_library(("nrt", "object", data))
            except Exception:  # noqa: BLE001 (numba's own compile below)
                ir_mod, library = nrtdynmod.create_nrt_module(ctx)
        library.enable_object_caching()
        library.add_ir_module(ir_mod)
        library.finalize()
        if path is not None:
            try:
                _write_runtime(path, *library.serialize_using_object_code()[2])
            except Exception:  # noqa: BLE001 (the cache is an optimisation: a failure to write it changes nothing)
                pass
        return library

    compile_nrt_functions._lean = True
    nrtdynmod.compile_nrt_functions = compile_nrt_functions


def _runtime_cache_path(codegen, ir_text: str):
    """The runtime's cache file for this IR and target (see :func:`_runtime_from_cache`), or None without a
    writable folder."""
    import hashlib
    import os
    from pathlib import Path

    import llvmlite
    import numba

    key = hashlib.sha256(repr((ir_text, numba.__version__, llvmlite.__version__, codegen.magic_tuple())).encode())
    folder = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else Path(__file__).parent / "__pycache__"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder / f"icml-nrt-{key.hexdigest()[:24]}.bin" if os.access(folder, os.W_OK) else None


def _read_runtime(path):
    """(object code, bitcode) from a runtime cache file, or None (missing, or not matching its SHA-256)."""
    import hashlib

    if path is None:
        return None
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head = len(_NRT_MAGIC) + 40
    if len(raw) < head or not raw.startswith(_NRT_MAGIC):
        return None
    digest, n_obj, body = raw[len(_NRT_MAGIC):len(_NRT_MAGIC) + 32], raw[head - 8:head], raw[head:]
    n_obj = int.from_bytes(n_obj, "little")
    if hashlib.sha256(body).digest() != digest or n_obj > len(body):
        return None
    return body[:n_obj], body[n_obj:]


def _write_runtime(path, obj: bytes, bitcode: bytes) -> None:
    """Write a runtime cache file atomically (a temporary file in its folder, then renamed)."""
    import hashlib
    import os
    import tempfile

    body = bytes(obj) + bytes(bitcode)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".icml-nrt-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_NRT_MAGIC + hashlib.sha256(body).digest() + len(obj).to_bytes(8, "little") + body)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

