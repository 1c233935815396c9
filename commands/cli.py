"""The `icml` root group: lazy subcommands, global flags, error boundary, BrokenPipe-safe entry point."""
from __future__ import annotations

import importlib
import os
import sys

import click

from icmltools import __version__

from .registry import COMMANDS

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "ICML", "show_default": True}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand runs (click docs, lazy loading)."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, _ = COMMANDS[name]
        mod = importlib.import_module(f"icmltools.commands.{module}")
        return mod.cli

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx):
        from .common import run_guarded

        return run_guarded(lambda: super(LazyGroup, self).invoke(ctx))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Like click's main, but every error is ONE line on stderr: `Error: ... (try 'icml X --help')`."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # bare `icml`: show the help, as click does
                e.show()
                sys.exit(e.exit_code)
            hint = f" (try '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            click.echo(f"Error: {e.format_message()}{hint}", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"Error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except (click.Abort, KeyboardInterrupt, EOFError) as e:
            if isinstance(e, KeyboardInterrupt) or isinstance(e.__cause__, KeyboardInterrupt):
                click.echo("Error: interrupted (nothing was written)", err=True)
                sys.exit(130)
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS,
             epilog="Examples:\n\n\b\n  icml onemax-sim | jq .result.worst_case\n  icml env\n  icml fope-train --help")
@click.version_option(__version__, "--version", prog_name="icml")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or logs on stderr.")
@click.option("-v", "--verbose", count=True, help="More logs on stderr (-vv for debug).")
@click.pass_context
def cli(ctx, quiet, verbose):
    """icml: ICML 2025 methods as command-line tools.

    Every command prints exactly one JSON document on stdout (pipe it into jq);
    progress and logs go to stderr. Set ICML_DEBUG=1 for tracebacks.
    """
    ctx.ensure_object(dict)
    ctx.obj["quiet"] = quiet
    ctx.obj["verbose"] = verbose


def main(argv=None):
    """Console-script entry point; exits quietly when stdout is closed early (`| head`)."""
    try:
        cli.main(args=argv, prog_name="icml")
    except BrokenPipeError:
        # Python flushes stdout at exit; point it at devnull so that flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    except SystemExit as e:
        from icmltools.core.device import exits_without_finalizing

        if e.code == 130 or exits_without_finalizing():
            _exit_now(e.code)
        raise


def _exit_now(code):
    """Run the exit handlers, flush, and leave by os._exit with `code` (SystemExit's: None 0, an int, else
    printed and 1), skipping the interpreter's finalization; only from the console entry point, never inside
    CliRunner. After Ctrl-C (130): CPython remembers a KeyboardInterrupt that passed through code run by
    `exec(<string>)` (dataclass and namedtuple creation do that, e.g. while torch imports) even when we caught
    it, and then ends the process by SIGINT instead of our exit code (seen in CI: -2 instead of 130). And for a
    process whose C libraries' threads would touch Python during finalization (a torchrun rank:
    :func:`icmltools.core.device.exit_without_finalizing`)."""
    import atexit

    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code or 0)
