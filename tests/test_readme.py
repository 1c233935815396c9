"""Docs that run (STYLE 26): every ```bash block followed by a ```text block in README.md and docs/*.md is
executed and its output compared with the text block.

The bash block holds one line, `icml ARGS | jq [-c] 'FILTER'` (or `icml ARGS` alone); the text block holds
the outputs, one JSON value per line as `jq -c` prints them. Numbers must agree to the digits shown. An
HTML comment right before the bash block marks the example: `<!-- slow -->` (it takes more than a few
seconds), `<!-- slow, cpu-drift D -->` or `<!-- slow, cpu-drift P% -->` (its non-integer numbers come from
training on the CPU and may also differ by up to D, or P %, on another x86 CPU, the pins of tests/conftest.py
notwithstanding: README "Reproducible figures").
"""
import json
import math
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"(?:<!-- (?P<flags>slow(?:, cpu-drift (?P<drift>[0-9.]+)(?P<pct>%)?)?) -->\s*\n)?"
                   r"```bash\n(?P<cmd>[^`]*?)```\s*\n```text\n(?P<out>[^`]*?)```", re.S)


def examples():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text[: m.start()].count("\n") + 1
            marks = [pytest.mark.slow] if m.group("flags") else []
            d = float(m.group("drift") or 0.0)
            drift = (0.0, d / 100) if m.group("pct") else (d, 0.0)  # (absolute, relative)
            yield pytest.param(m.group("cmd").strip(), m.group("out").strip(), drift, id=f"{doc.name}:{line}",
                               marks=marks)


def _close(expected, got, drift: tuple = (0.0, 0.0)) -> bool:
    """Equal, with numbers compared to the precision written in the docs, give or take `drift` (absolute,
    relative) for the non-integers (counts and bit widths stay exact)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected == got
    if isinstance(expected, int) and isinstance(got, int):
        return expected == got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        s = repr(expected)
        decimals = len(s.split(".")[1]) if "." in s and "e" not in s else 0
        return math.isclose(expected, got, rel_tol=1e-9 + drift[1],
                            abs_tol=0.5 * 10 ** -decimals + drift[0] + 1e-12)
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(_close(a, b, drift) for a, b in zip(expected, got))
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(_close(expected[k], got[k], drift) for k in expected)
    return expected == got


def run_example(cmd: str, icml_json_once):
    """The example's outputs: the command run once per session (conftest `icml_json_once`: examples that differ
    only in their jq filter share the run), then the filter."""
    import jq

    icml_part, _, jq_part = cmd.partition("|")
    argv = shlex.split(icml_part)
    assert argv[0] == "icml", cmd
    doc = icml_json_once(argv[1:])
    if not jq_part.strip():
        return [doc]
    jargs = shlex.split(jq_part)
    assert jargs[0] == "jq", cmd
    filt = [a for a in jargs[1:] if not a.startswith("-")]
    return jq.compile(filt[0]).input_value(doc).all()


@pytest.mark.parametrize("cmd,expected,drift", list(examples()))
def test_documented_example_prints_what_the_docs_show(cmd, expected, drift, icml_json_once):
    got = run_example(cmd, icml_json_once)
    want = [json.loads(line) for line in expected.splitlines() if line.strip()]
    assert len(got) == len(want), (cmd, got)
    for w, g in zip(want, got):
        assert _close(w, g, drift), f"{cmd}\n docs: {json.dumps(w)}\n code: {json.dumps(g)}"


def test_every_command_has_a_readme_example():
    from icmltools.commands.registry import COMMANDS

    cmds = {shlex.split(c.values[0])[1] for c in examples() if c.id.startswith("README.md")}
    missing = sorted(set(COMMANDS) - cmds - {"env"})
    assert not missing, f"commands without a run README example: {missing}"


def test_every_mark_above_an_example_is_read():
    """A comment right above an example is one of the marks (a typo would silently make it exact and fast)."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"<!--[^\n]*-->\s*\n```bash\n", text):
            hit = FENCE.match(text, m.start())
            assert hit and hit.group("flags"), f"{doc.name}: unknown mark {m.group(0).splitlines()[0]!r}"


def test_drift_widens_the_comparison_by_the_stated_amount():
    assert not _close(0.739, 0.738) and _close(0.739, 0.738, (0.002, 0.0)) and not _close(0.739, 0.742, (0.002, 0.0))
    assert _close(0.0181, 0.0235, (0.0, 0.35)) and not _close(0.0181, 0.0300, (0.0, 0.35))
    assert _close(["gptq", 2, 0.0081], ["gptq", 2, 0.0063], (0.0, 0.35)) and not _close(["gptq", 3, 0.0081],
                                                                                       ["gptq", 2, 0.0081], (0.0, 0.35))
    drifts = {p.values[0].split("|")[0].strip(): p.values[2] for p in examples() if p.values[2] != (0.0, 0.0)}
    assert drifts == {"icml fope-train -q --threads 1 --no-save --eval-factors 1,4": (0.002, 0.0),
                      "icml cabs-merge": (0.002, 0.0),
                      "icml guidedquant --threads 1 -q --steps 300 --calib-seqs 64 --methods lnq_guided,lnq,gptq,rtn":
                      (0.0, 0.35),
                      "icml guidedquant -q --threads 1 --seed 0": (0.0, 0.35)}
