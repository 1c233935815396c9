"""Typed errors raised by the library; the CLI boundary turns them into one `Error:` line.

`exit_code` follows click: 2 for bad input / usage, 1 for runtime failures.

The library names its own parameters, never command-line flags: `BadInputError("must be finite",
param="lam")` reads `lam: must be finite` from Python, and the command layer renders it with the flag
that feeds that parameter (`--lam: must be finite`).
"""
from __future__ import annotations


class IcmlError(Exception):
    """Base class of every error the library raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, param: str | None = None):
        self.message = message
        self.hint = hint
        self.param = param
        super().__init__(self.render())

    def render(self, name: str | None = None) -> str:
        """The message, prefixed with `name` (a flag), or with the parameter's own name."""
        who = name or self.param
        return f"{who}: {self.message}" if who else self.message


class BadInputError(IcmlError):
    """The user's input (file, option value, data) is unusable. Exit code 2."""

    exit_code = 2


class MissingDependencyError(IcmlError):
    """An optional package needed for this feature is not installed."""

    exit_code = 1


class DeviceUnavailableError(IcmlError):
    """An explicitly requested device is absent (never a silent fallback)."""

    exit_code = 2


class InfeasibleError(IcmlError):
    """A model or problem has no feasible solution."""

    exit_code = 1


class OutputError(IcmlError):
    """An output file or folder cannot be written (permissions, a folder in the way, a full disk)."""

    exit_code = 1


class RuntimeFailure(IcmlError):
    """Anything else that went wrong while running a method."""

    exit_code = 1
