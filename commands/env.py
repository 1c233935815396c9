"""`icml env`: versions, devices and threads of this installation, as JSON."""
from __future__ import annotations

from . import common


@common.command("env", epilog="Examples:\n\n\b\n  icml env | jq .result.devices")
@common.quiet_options
@common.click.pass_context
def cli(ctx, quiet, verbose):
    """Report python and package versions, torch devices (CUDA, MPS) and thread counts."""
    from icmltools.core.envinfo import full_report

    with common.CommandRun(ctx, "env", packages=("numpy", "torch", "scipy", "pyscipopt")) as run:
        run.result = full_report()
        run.device = {"available": run.result["devices"]}
