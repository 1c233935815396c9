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
        msg = err.message + (f" (hint: {err.hint})" if err.hint else "")
        super().__init__(msg)
        self.exit_code = err.exit_code


def debug_enabled() -> bool:
    return os.environ.get("ICML_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def run_guarded(fn: Callable[[], Any]) -> Any:
    """The one place library errors become CLI errors: exit 2 bad input, 1 runtime, no traceback
    unless ICML_DEBUG=1."""
    try:
        return fn()
    except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError, KeyboardInterrupt):
        raise
    except IcmlError as e:
        if debug_enabled():
            traceback.print_exc(file=sys.stderr)
        raise IcmlClickError(e) from None
    except MemoryError:
        raise click.ClickException("out of memory; try a smaller preset or input") from None
    except Exception as e:  # unexpected: one line, traceback only on request
        if debug_enabled():
            traceback.print_exc(file=sys.stderr)
        msg = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
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
    return click.option("--seed", type=int, default=0, show_default=True,
                        help="Seeds python, numpy and torch once.")(f)


def device_option(f):
    return click.option("--device", default="auto", show_default=True, envvar="ICML_DEVICE",
                        metavar="auto|cpu|cuda[:N]|mps",
                        help="Torch device; auto = cuda, then mps, then cpu. An absent explicit device is an error.")(f)


def threads_option(default: int | None = 1):
    def deco(f):
        return click.option("--threads", type=click.IntRange(min=1), default=default, show_default=True,
                            help="Torch/BLAS threads (one thread is far faster for small models on shared cores).")(f)
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


def command(name: str, **kwargs):
    """`click.command` with the house settings: -h, show_default, env vars via auto prefix."""
    settings = {"help_option_names": ["-h", "--help"], "show_default": True}
    settings.update(kwargs.pop("context_settings", {}))
    return click.command(name, context_settings=settings, **kwargs)


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
    """One command invocation: logging, seeding, device, threads, timing, stdout guard, the envelope.

    Use as a context manager around the work; set `run.result` (and `run.artifacts`); the envelope is
    printed on stdout when the block ends without error. Anything written to stdout inside the block
    (including C libraries writing to fd 1) is sent to stderr so stdout stays one JSON document.
    """

    def __init__(self, ctx: click.Context, command: str, *, seed: int | None = None, device: str | None = None,
                 threads: int | None = None, packages: tuple = ("numpy", "torch"), seed_torch: bool = True):
        self.ctx = ctx
        self.command = command
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

    # ---- the envelope
    def envelope(self) -> dict:
        device = self.device
        if isinstance(device, str):
            from icmltools.core.device import device_info

            device = device_info(device)
        return Envelope(command=self.command, params=to_jsonable(self.params), device=device, seed=self.seed,
                        result=self.result, artifacts=self.artifacts, timing=self.timer.as_dict(),
                        packages=self.packages).to_dict()

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                doc = self.envelope()
                indent = 2 if (not self._streamed and _is_tty(self._out)) else None
                text = dumps(doc, indent=indent)
                self._restore_stdout()
                self._write(text + "\n")
            else:
                self._restore_stdout()
        finally:
            if self._out_owned:
                with contextlib.suppress(Exception):
                    self._out.close()
        return False


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except Exception:
        return False


def write_json_artifact(run: CommandRun, name: str, path, obj) -> None:
    """Atomically write `obj` as JSON to `path` and record it under `artifacts[name]`."""
    from icmltools.core.jsonio import atomic_write_json

    atomic_write_json(path, obj)
    run.artifacts[name] = str(path)
