"""Shared Click options, the stderr console, progress, the error boundary and JSON output.

Imports only click and the standard library at module level (rich is imported lazily), so that
`icml X --help` stays fast.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import traceback
from typing import Any, Callable

import click

from icmltools.core.envelope import Envelope, Timer
from icmltools.core.errors import IcmlError
from icmltools.core.jsonio import dumps, to_jsonable

# --------------------------------------------------------------------------------------------- errors


class IcmlClickError(click.ClickException):
    """An `IcmlError` rendered by click as one `Error: ...` line with the error's exit code."""

    def __init__(self, err: IcmlError):
        msg = err.render(getattr(err, "flag", None)) + (f" (hint: {err.hint})" if err.hint else "")
        super().__init__(msg)
        self.exit_code = err.exit_code


def flag_for(ctx: click.Context | None, param: str | None, aliases: dict | None = None) -> str | None:
    """The command-line flag that feeds library parameter `param` in this command (None if none does).

    Commands name their click parameters after the library's, so the lookup is by name; `aliases`
    maps the exceptions (library name -> flag)."""
    if not param:
        return None
    if aliases and param in aliases:
        return aliases[param]
    while ctx is not None:
        for p in getattr(ctx.command, "params", ()):
            if p.name == param and isinstance(p, click.Option):
                longs = [o for o in p.opts if o.startswith("--")]
                return max(longs or p.opts, key=len)
        ctx = ctx.parent
    return None


def _annotate(err: IcmlError, ctx: click.Context | None, aliases: dict | None = None) -> None:
    if getattr(err, "flag", None) is None:
        err.flag = flag_for(ctx, err.param, aliases)


def debug_enabled() -> bool:
    return os.environ.get("ICML_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


class _CtrlC:
    """Whether Ctrl-C came while a command ran. A C library's callback can swallow the KeyboardInterrupt raised in
    it (seen: llvmlite's object-cache callback while numba compiled on the main thread, which could then crash:
    numba compiles in a helper thread now, `core.device.off_main`): the swallowed interrupt prints no traceback,
    the signal is sent again from another thread (`_rearm`) so that it is raised in the code that called into C,
    and the command ends as interrupted whatever happens next."""

    REARM_S = 0.01  # after this long the swallowed signal is sent again (the callback has returned by then)

    def __init__(self):
        self.seen = False
        self._sig = self._hook = self._timer = None

    def __enter__(self):
        import signal
        import threading

        _CTRL_C.append(self)

        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._sig = signal.signal(signal.SIGINT, self._on_sigint)
        self._hook, sys.unraisablehook = sys.unraisablehook, self._on_unraisable
        return self

    def _on_sigint(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def _on_unraisable(self, u) -> None:
        if not (self.seen and isinstance(u.exc_value, KeyboardInterrupt)):
            self._hook(u)
        elif self._sig is not None:
            self._rearm()

    def _rearm(self) -> None:
        """Send SIGINT again shortly, from a timer thread: raising it here, in the hook, would only be swallowed
        again; a callback that swallows the new one re-arms it again."""
        import os
        import signal
        import threading

        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(self.REARM_S, os.kill, (os.getpid(), signal.SIGINT))
        self._timer.daemon = True
        self._timer.start()

    def __exit__(self, *exc) -> bool:
        import signal

        if self._timer is not None:
            self._timer.cancel()
        sys.unraisablehook = self._hook
        if self._sig is not None:
            signal.signal(signal.SIGINT, self._sig)
        _CTRL_C.remove(self)
        return False


_CTRL_C: list = []  # the _CtrlC of the command running (run_guarded)


def ctrl_c_seen() -> bool:
    """Whether Ctrl-C came during the command running now (even if something swallowed its KeyboardInterrupt)."""
    return bool(_CTRL_C) and _CTRL_C[-1].seen


def _interrupted(e: BaseException | None = None) -> click.ClickException:
    err = click.ClickException(getattr(e, "note", None) or "interrupted (nothing was written)")
    err.exit_code = 130
    return err


def run_guarded(fn: Callable[[], Any]) -> Any:
    """The one place library errors become CLI errors: exit 2 bad input, 1 runtime, 130 after Ctrl-C, no
    traceback unless ICML_DEBUG=1."""
    with _CtrlC() as ctrl_c:
        return _guarded(fn, ctrl_c)


def _guarded(fn: Callable[[], Any], ctrl_c: _CtrlC) -> Any:
    try:
        out = fn()
        if ctrl_c.seen:  # swallowed on its way up, and the command ran on: it still ends as interrupted
            raise KeyboardInterrupt
        return out
    except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
        raise
    except KeyboardInterrupt as e:
        raise _interrupted(e) from None
    except Exception as e:
        if ctrl_c.seen:  # the interrupt was swallowed on its way up; this error is its consequence
            raise _interrupted() from None
        if isinstance(e, MemoryError):
            raise click.ClickException("out of memory; try a smaller preset or input") from None
        if debug_enabled():
            traceback.print_exc(file=sys.stderr)
        if isinstance(e, IcmlError):
            raise IcmlClickError(e) from None
        msg = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__  # unexpected: one line
        raise click.ClickException(f"{msg} (set ICML_DEBUG=1 for a traceback)") from None


# --------------------------------------------------------------------------------------------- options


def _merge_flag(ctx: click.Context, key: str, value):
    root = ctx.find_root()
    root_val = (root.obj or {}).get(key) if root is not ctx else None
    if key == "verbose":
        return (value or 0) + (root_val or 0)
    return bool(value) or bool(root_val)


def quiet_options(f):
    f = click.option("-v", "--verbose", count=True, help="More logs on stderr (-vv for debug).")(f)
    f = click.option("-q", "--quiet", is_flag=True, help="No progress bars or logs on stderr.")(f)
    return f


def seed_option(f):
    return click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                        help="Root of every random stream (core.seed.derive); also seeds python, numpy and torch.")(f)


class CommaList(click.ParamType):
    """A comma-separated list option: `--pe rope,fope`, `--errors 0.9,0.5`.

    `choices` (kept once, in the method's stdlib-only `options` module) are matched case-insensitively;
    `all` expands to every choice when `allow_all`; duplicates are dropped in order unless `unique=False`
    (per-model values: `--lam 0.5,0.5,0.2`). `kind=float` parses numbers (finite only). Returns a tuple.
    """

    name = "list"

    def __init__(self, choices=None, kind=str, allow_all: bool = False, min_items: int = 1, positive: bool = False,
                 unique: bool = True):
        self.choices = tuple(choices) if choices is not None else None
        self.kind = kind
        self.allow_all = allow_all
        self.min_items = min_items
        self.positive = positive
        self.unique = unique

    def get_metavar(self, param, ctx=None):
        if self.choices:
            return "[" + ",".join(self.choices + (("all",) if self.allow_all else ())) + "]"
        return "X,Y,..." if self.kind is str else "N,N,..."

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        head, _, last = incomplete.rpartition(",")
        prefix = head + "," if head else ""
        return [CompletionItem(prefix + c) for c in (self.choices or ()) if c.startswith(last)]

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        out: list = []
        for item in items:
            if self.kind is float:
                import math

                try:
                    x = float(item)
                except ValueError:
                    self.fail(f"{item!r} is not a number (expected comma-separated numbers)", param, ctx)
                if not math.isfinite(x) or (self.positive and not x > 0):
                    self.fail(f"{item!r} is not a finite{' positive' * self.positive} number", param, ctx)
                out.append(x)
                continue
            if self.choices is None:
                out.append(item)
                continue
            low = item.lower()
            if self.allow_all and low == "all":
                out.extend(self.choices)
                continue
            match = [c for c in self.choices if c.lower() == low]
            if not match:
                extra = " or all" if self.allow_all else ""
                self.fail(f"unknown {item!r}; choose from {', '.join(self.choices)}{extra} (comma-separated)",
                          param, ctx)
            out.append(match[0])
        if self.unique:
            out = list(dict.fromkeys(out))
        if len(out) < self.min_items:
            self.fail(f"give at least {self.min_items} item(s)", param, ctx)
        return tuple(out)


def device_option(f):
    return click.option("--device", default="auto", show_default=True, envvar="ICML_DEVICE",
                        metavar="auto|cpu|cuda[:N]|mps",
                        help="Torch device; auto = cuda, then mps, then cpu. An absent explicit device is an error.")(f)


def threads_option(default: int | None = 1):
    def deco(f):
        return click.option("--threads", type=click.IntRange(min=1), default=default, show_default=True,
                            help="Torch/BLAS/numba threads (one thread is far faster for small models on shared cores; "
                                 "merges of large checkpoints use more).")(f)
    return deco


def out_option(help_text: str = "Output folder (default: $ICML_RUNS_DIR or runs/<command>/<timestamp>/)."):
    def deco(f):
        return click.option("--out", "out", type=click.Path(file_okay=False), default=None, help=help_text)(f)
    return deco


def standard_options(seed: bool = True, device: bool = False, threads: bool = False, threads_default: int | None = 1):
    """`-q/-v` plus, as asked, `--seed`, `--device`, `--threads` on a subcommand."""
    def deco(f):
        if threads:
            f = threads_option(threads_default)(f)
        if device:
            f = device_option(f)
        if seed:
            f = seed_option(f)
        return quiet_options(f)
    return deco


HOUSE_SETTINGS = {"help_option_names": ["-h", "--help"], "show_default": True}


def check_finite(ctx: click.Context | None) -> None:
    """Refuse NaN/inf in every float option (plain, ranged, repeated): click's FloatRange lets NaN through.
    A usage error naming the option, before any work."""
    import math

    if ctx is None:
        return
    for p in ctx.command.params:
        if not isinstance(p.type, click.types.FloatParamType):
            continue
        value = ctx.params.get(p.name)
        values = value if isinstance(value, (tuple, list)) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise click.BadParameter("must be a finite number", ctx=ctx, param=p)


def maps_params(aliases: dict | None = None):
    """Wrap a callback: float options are checked finite, and a library error naming a parameter is
    shown with its flag (`--lam: ...`)."""
    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            check_finite(click.get_current_context(silent=True))
            try:
                return f(*args, **kwargs)
            except IcmlError as e:
                _annotate(e, click.get_current_context(silent=True), aliases)
                raise
        return wrapper
    return deco


def command(name: str, param_flags: dict | None = None, **kwargs):
    """`click.command` with the house settings (-h, show_default; env vars come from the root's
    auto prefix) and library-parameter -> flag mapping of errors (`param_flags` for names that differ)."""
    settings = dict(HOUSE_SETTINGS)
    settings.update(kwargs.pop("context_settings", {}))

    def deco(f):
        return click.command(name, context_settings=settings, **kwargs)(maps_params(param_flags)(f))
    return deco


def group(name: str, **kwargs):
    """`click.group` with the house settings; add subcommands made with `command(...)`."""
    settings = dict(HOUSE_SETTINGS)
    settings.update(kwargs.pop("context_settings", {}))

    def deco(f):
        return click.group(name, context_settings=settings, **kwargs)(maps_params()(f))
    return deco


# --------------------------------------------------------------------------------------------- console


@functools.lru_cache(maxsize=None)
def _stderr_console_cached(quiet: bool):
    from rich.console import Console

    return Console(stderr=True, quiet=quiet)


def stderr_console(quiet: bool = False):
    return _stderr_console_cached(bool(quiet))


class _NullProgress:
    def __call__(self, desc: str, completed: int, total: int | None = None) -> None:
        return None


class _RichProgress:
    """A progress callback `(desc, completed, total)` backed by a transient rich Progress on stderr."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.tasks: dict[str, int] = {}

    def __call__(self, desc: str, completed: int, total: int | None = None) -> None:
        if desc not in self.tasks:
            self.tasks[desc] = self.progress.add_task(desc, total=total)
        self.progress.update(self.tasks[desc], completed=completed, total=total)


# --------------------------------------------------------------------------------------------- the run


class CommandRun:
    """One command invocation: logging, seeding, device, threads, timing, stdout guard, run folder, envelope.

    Use as a context manager around the work; set `run.result` (and `run.artifacts`); the envelope is
    printed on stdout when the block ends without error. Anything written to stdout inside the block
    (including C libraries writing to fd 1) is sent to stderr so stdout stays one JSON document.

    `packages` are imported on entry (their versions go in the envelope), then the thread pools are
    sized once (`core.device.set_threads`). `reference` is the method's paper (the method's `options`
    module holds it). `run.make_dir(out)` creates the run folder; the run writes its `config.json` then
    and its `result.json` on success, and removes a folder it created if the command fails before
    anything else was written into it.
    """

    def __init__(self, ctx: click.Context, command: str, *, seed: int | None = None, device: str | None = None,
                 threads: int | None = None, packages: tuple = ("numpy", "torch"), seed_torch: bool = True,
                 reference: dict | None = None, param_flags: dict | None = None, writes: bool = True):
        self.ctx = ctx
        self.writes = writes  # False on a non-writing process (DDP rank > 0): no envelope, no run-folder files
        self.command = command
        self.reference = reference
        self.param_flags = param_flags
        self.run_dir = None
        self._made_dir = False
        params = dict(ctx.params)
        self.quiet = _merge_flag(ctx, "quiet", params.get("quiet"))
        self.verbose = _merge_flag(ctx, "verbose", params.get("verbose"))
        self.params = {k: v for k, v in params.items() if k not in ("quiet", "verbose")}
        self.seed = seed
        self.device_spec = device
        self.threads = threads
        self.packages = packages
        self.seed_torch = seed_torch
        self.timer = Timer()
        self.result: Any = None
        self.artifacts: dict = {}
        self.device: Any = None
        self.rng = None
        self._saved_fd: int | None = None
        self._out = None
        self._streamed = False
        self._tables: list = []

    # ---- set-up
    def _setup_logging(self):
        level = logging.ERROR if self.quiet else (logging.DEBUG if self.verbose >= 2 else
                                                  logging.INFO if self.verbose == 1 else logging.WARNING)
        logger = logging.getLogger("icmltools")
        for h in list(logger.handlers):
            if getattr(h, "_icml", False):
                logger.removeHandler(h)
        from rich.logging import RichHandler

        h = RichHandler(console=self.console, show_path=False, show_time=False)
        h._icml = True
        logger.addHandler(h)
        logger.setLevel(level)
        logger.propagate = False
        from icmltools.core.device import NOTICE_LOGGER  # standard library only

        # a long compile's notice is progress: shown where the bars are drawn (a terminal, not -q), else with -v;
        # set on every run, so one run's terminal does not carry over to the next in this process
        shown = not self.quiet and self.console.is_terminal
        logging.getLogger(NOTICE_LOGGER).setLevel(logging.INFO if shown else logging.NOTSET)

    @property
    def console(self):
        return stderr_console(self.quiet)

    def log(self, msg: str) -> None:
        """A status line on stderr (silenced by -q)."""
        self.console.print(msg, highlight=False)

    @contextlib.contextmanager
    def progress(self):
        """Yield a callback `(desc, completed, total)` drawing transient bars on stderr (no-op with -q)."""
        if self.quiet or not self.console.is_terminal:
            yield _NullProgress()
            return
        p = _RichProgress(self.console)
        with p.progress:
            yield p

    def __enter__(self):
        self._setup_logging()
        import importlib

        for name in self.packages:  # heavy imports first: thread limits then reach every loaded pool
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        if self.threads is not None:
            from icmltools.core.device import set_threads

            set_threads(self.threads)
        if self.device_spec is not None:
            from icmltools.core.device import resolve_device

            self.device = resolve_device(self.device_spec)
        if self.seed is not None:
            from icmltools.core.seed import seed_everything

            self.rng = seed_everything(self.seed, torch_too=self.seed_torch)
        self._guard_stdout()
        return self

    # ---- stdout guard
    def _guard_stdout(self):
        self._out = sys.stdout
        try:
            sys.stdout.flush()
        except Exception:
            pass
        try:
            real = sys.stdout.fileno() == 1
        except Exception:
            real = False
        # fd-level: C libraries (SCIP, MuJoCo) write to fd 1 directly.
        try:
            sys.__stdout__.flush() if sys.__stdout__ else None
            self._saved_fd = os.dup(1)
            os.dup2(2, 1)
        except OSError:
            self._saved_fd = None
        if real and self._saved_fd is not None:
            self._out = os.fdopen(os.dup(self._saved_fd), "w", encoding="utf-8", closefd=True)
            self._out_owned = True
        else:
            self._out_owned = False
        self._redirect = contextlib.redirect_stdout(sys.stderr)
        self._redirect.__enter__()

    def _restore_stdout(self):
        self._redirect.__exit__(None, None, None)
        try:
            sys.stdout.flush()
        except Exception:
            pass
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 1)
            os.close(self._saved_fd)
            self._saved_fd = None

    def _write(self, text: str):
        self._out.write(text)
        self._out.flush()

    def stream(self, record: Any) -> None:
        """Write one compact JSON line now (for --jsonl streaming); the summary line follows at the end."""
        self._streamed = True
        self._write(dumps(record) + "\n")

    # ---- the run folder
    def make_dir(self, out=None, allow_existing: bool = False, config: dict | None = None, resumable: bool = False):
        """Create (or, with `allow_existing`, reuse) the run folder: `--out DIR` or
        `$ICML_RUNS_DIR/<command>/<timestamp>/`; writes `config.json` (command, version, seed, params, and
        the library's resolved `config` if given) and records both in the artifacts.

        If the command fails, a folder this run created is removed when it holds nothing but config.json;
        if it is interrupted (Ctrl-C), it is removed whole, unless `resumable` (it holds checkpoints that
        a rerun can resume from: kept, and said on stderr)."""
        self._resumable = resumable
        from pathlib import Path

        from icmltools.core.jsonio import atomic_write_json
        from icmltools.core.runs import make_run_dir

        if not self.writes:
            return Path(out) if out is not None else None
        existed = out is not None and Path(out).exists() and any(Path(out).iterdir())
        from icmltools.core.runs import runs_root

        # parents this run creates (runs/, runs/<command>/ or --out's): removed again with a failed run's folder
        target = Path(out) if out is not None else runs_root() / self.command / "x"
        self._new_parents = [p for p in reversed(target.absolute().parents) if not p.exists()]
        d = make_run_dir(self.command, out, allow_existing=allow_existing)
        self.run_dir, self._made_dir = d, not existed
        doc = {"command": self.command, "icml_version": self._version(), "seed": self.seed,
               "device": self.device, "params": to_jsonable(self.params)}
        if config is not None:
            doc["config"] = to_jsonable(config)
        atomic_write_json(d / "config.json", doc)
        self.artifacts["run_dir"] = str(d)
        self.artifacts["config"] = str(d / "config.json")
        return d

    @staticmethod
    def _version() -> str:
        from icmltools import __version__

        return __version__

    def _finish_dir(self, ok: bool, interrupted: bool = False) -> str | None:
        """Write result.json on success; after a failure remove what this run created (see make_dir).
        Returns the line to show when an interrupted run's folder is kept."""
        if self.run_dir is None:
            return None
        if ok:
            from icmltools.core.jsonio import atomic_write_json

            atomic_write_json(self.run_dir / "result.json", self.result)
            self.artifacts["result"] = str(self.run_dir / "result.json")
            return None
        if not self._made_dir or not self.run_dir.exists():
            return None
        import shutil

        left = {p.name for p in self.run_dir.iterdir()}
        if interrupted and getattr(self, "_resumable", False) and left - {"config.json"}:
            return f"interrupted: the partial run is kept in {self.run_dir} (resume from it)"
        if interrupted or left <= {"config.json"}:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for parent in reversed(getattr(self, "_new_parents", [])):
                with contextlib.suppress(OSError):
                    parent.rmdir()  # only if empty
        return None

    # ---- the summary a person reads
    def table(self, title: str, columns: list[str], rows: list[list]) -> None:
        """A summary table for a person at a terminal: drawn on stderr (rich) when the command succeeds,
        unless -q or stderr is not a terminal. The JSON on stdout is unchanged."""
        self._tables.append((title, list(columns), [list(r) for r in rows]))

    def _draw_tables(self) -> None:
        if not self._tables or self.quiet or not self.console.is_terminal:
            return
        from rich.table import Table

        for title, columns, rows in self._tables:
            t = Table(title=title, title_justify="left")
            for c in columns:
                t.add_column(str(c), justify="left" if c == columns[0] else "right")
            for r in rows:
                t.add_row(*[_cell(v) for v in r])
            self.console.print(t)

    # ---- the envelope
    def envelope(self) -> dict:
        device = self.device
        if isinstance(device, str):
            from icmltools.core.device import device_info

            device = device_info(device)
        return Envelope(command=self.command, params=to_jsonable(self.params), device=device, seed=self.seed,
                        result=self.result, artifacts=self.artifacts, timing=self.timer.as_dict(),
                        packages=self.packages, reference=self.reference).to_dict()

    def __exit__(self, exc_type, exc, tb):
        if isinstance(exc, IcmlError):
            _annotate(exc, self.ctx, self.param_flags)
        late = exc_type is None and ctrl_c_seen()  # a Ctrl-C something swallowed: no result, the interrupted path
        if late:
            exc_type, exc = KeyboardInterrupt, KeyboardInterrupt()
        try:
            if exc_type is None and not self.writes:
                self._restore_stdout()
            elif exc_type is None:
                self._finish_dir(ok=True)
                self._draw_tables()
                doc = self.envelope()
                indent = 2 if (not self._streamed and _is_tty(self._out)) else None
                text = dumps(doc, indent=indent)
                self._restore_stdout()
                self._write(text + "\n")
            else:
                self._restore_stdout()
                note = self._finish_dir(ok=False, interrupted=issubclass(exc_type, KeyboardInterrupt))
                if note:  # the one line the user sees names the kept folder
                    exc.note = note
        finally:
            if self._out_owned:
                with contextlib.suppress(Exception):
                    self._out.close()
        if late:
            raise exc
        return False


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except Exception:
        return False


