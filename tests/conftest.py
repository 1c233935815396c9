import os

import pytest


@pytest.fixture(autouse=True)
def _clean_icml_env(monkeypatch, tmp_path):
    """No ICML_* variable from the caller leaks in; run folders land in tmp_path."""
    for k in list(os.environ):
        if k.startswith("ICML_"):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ICML_RUNS_DIR", str(tmp_path / "runs"))
    yield


@pytest.fixture
def run_cli():
    """Invoke `icml ARGS` through CliRunner; returns (result, parsed JSON or None)."""
    import json

    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    def _run(args, input=None, expect_code=0):
        runner = CliRunner()
        res = runner.invoke(cli, list(args), input=input, catch_exceptions=False)
        assert res.exit_code == expect_code, (res.exit_code, res.stdout[-2000:], res.stderr[-2000:])
        doc = json.loads(res.stdout) if expect_code == 0 else None
        return res, doc

    return _run
