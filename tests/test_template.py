"""The command template in examples/command_template follows the house pattern and keeps working."""
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def template():
    sys.path.insert(0, str(ROOT))
    try:
        from examples.command_template import api, command, options
        yield command, api, options
    finally:
        sys.path.remove(str(ROOT))


def _group(cmd):
    from icmltools.commands import common

    class G(click.Group):
        def invoke(self, ctx):
            return common.run_guarded(lambda: super(G, self).invoke(ctx))

    g = G("icml")
    g.add_command(cmd.cli)
    return g


def test_template_runs_and_reports_its_method_beside_the_baseline(template, tmp_path):
    cmd, api, options = template
    r = CliRunner().invoke(_group(cmd), ["template", "-q", "--out", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {m["method"]: m for m in doc["result"]["methods"]}
    assert list(rows) == list(options.METHODS) and doc["reference"] == options.REFERENCE
    # heavy tails: the median of means has a far smaller worst-percentile error than the mean
    assert rows["median-of-means"]["q99_abs_error"] < 0.8 * rows["mean"]["q99_abs_error"]
    assert json.loads((tmp_path / "t" / "result.json").read_text()) == doc["result"]
    assert json.loads((tmp_path / "t" / "config.json").read_text())["params"]["blocks"] == options.Config.blocks


def test_template_library_error_names_the_flag_and_writes_nothing(template, tmp_path):
    cmd, _, _ = template
    r = CliRunner().invoke(_group(cmd), ["template", "--blocks", "0", "--out", str(tmp_path / "t")])
    assert r.exit_code == 2 and "--blocks: must be between 1 and n = 1000" in r.stderr
    assert not (tmp_path / "t").exists()


def test_template_same_seed_same_numbers_stage_alone(template):
    _, api, options = template
    a = api.run(options.Config(trials=20), seed=3)
    assert a == api.run(options.Config(trials=20), seed=3)
    assert a != api.run(options.Config(trials=20), seed=4)


def test_template_help_imports_nothing_heavy():
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from click.testing import CliRunner\n"
            "from examples.command_template import command\n"
            "assert CliRunner().invoke(command.cli, ['--help']).exit_code == 0\n"
            "print([m for m in ('numpy', 'torch', 'scipy') if m in sys.modules])") % str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
