"""Value functions given as data: a coalitions CSV, or a command that scores a coalition (cached).

Both are functions of 0/1 coalition masks, as `shapley.shapley` takes them; v(empty) must be 0 (payments
balance only then) unless the caller asks to subtract it.
"""
from __future__ import annotations

import csv
import json
import math
import re
import shlex
import subprocess

import numpy as np

from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.files import check_input_file


class CachedValue:
    """v on mask rows through `score(members) -> float`, each coalition scored once; `offset` is subtracted."""

    def __init__(self, n: int, score):
        self.n, self.score, self.cache, self.offset = n, score, {}, 0.0

    def __call__(self, M: np.ndarray) -> np.ndarray:
        out = np.empty(len(M))
        for r, row in enumerate(M.astype(bool)):
            key = row.tobytes()
            if key not in self.cache:
                self.cache[key] = self.score(tuple(int(j) for j in np.flatnonzero(row)))
            out[r] = self.cache[key]
        return out - self.offset

    @property
    def calls(self) -> int:
        return len(self.cache)

    def check_empty(self, subtract: bool, param: str) -> float:
        """v(empty) != 0 is an error (payments would not balance), or with `subtract` it is removed."""
        v0 = float(self(np.zeros((1, self.n)))[0])
        if abs(v0) > 1e-12:
            if not subtract:
                raise BadInputError(f"v(empty) = {v0:g}, not 0: values must be gains over the no-data model "
                                    "(payments balance only then)", param=param, hint="pass --subtract-empty to "
                                    "subtract v(empty) from every coalition")
            self.offset = v0
        return v0


_SPLIT = re.compile(r"[;|\s,]+")


def _members(text: str, src: str, line: int) -> tuple:
    ids = [t for t in _SPLIT.split(text.strip()) if t]
    try:
        out = tuple(sorted(int(t) for t in ids))
    except ValueError:
        raise BadInputError(f"{src} line {line}: members must be agent numbers (0-based) separated by ';' or "
                            f"spaces, got {text!r}", param="values") from None
    if any(j < 0 for j in out) or len(set(out)) != len(out):
        raise BadInputError(f"{src} line {line}: negative or repeated agent in {text!r}", param="values")
    return out


def read_coalitions(path) -> dict:
    """coalitions.csv with a header `members,value`: one row per coalition, members like `0;2;5` (empty for
    the empty coalition); returns {members tuple: value}."""
    p = check_input_file(path)
    table: dict = {}
    with open(p, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or {"members", "value"} - set(reader.fieldnames):
            raise BadInputError(f"{p}: needs a header with columns 'members' and 'value'", param="values")
        for row in reader:
            line = reader.line_num
            key = _members(row["members"] or "", p, line)
            try:
                v = float(row["value"])
            except (TypeError, ValueError):
                raise BadInputError(f"{p} line {line}: value {row['value']!r} is not a number", param="values") from None
            if not math.isfinite(v):
                raise BadInputError(f"{p} line {line}: value must be finite", param="values")
            if key in table:
                raise BadInputError(f"{p} line {line}: coalition {list(key)} appears twice", param="values")
            table[key] = v
    if not table:
        raise BadInputError(f"{p}: no coalitions", param="values")
    return table


def table_value(table: dict, n: int, src: str, exact: bool) -> CachedValue:
    """A CachedValue over the table; with `exact`, every one of the 2^n - 1 non-empty coalitions must be there
    (the empty one defaults to 0)."""
    top = max((max(k) for k in table if k), default=-1)
    if top >= n:
        raise BadInputError(f"{src}: agent {top} in a coalition, but there are {n} agents", param="values")
    if exact:
        missing = (1 << n) - 1 - sum(1 for k in table if k)
        if missing:
            first = next(m for m in range(1, 1 << n) if tuple(j for j in range(n) if m >> j & 1) not in table)
            raise BadInputError(f"{src}: {missing} of the {(1 << n) - 1} non-empty coalitions are missing (first: "
                                f"{[j for j in range(n) if first >> j & 1]}); exact Shapley needs them all",
                                param="values")

    def score(members):
        if members in table:
            return table[members]
        if not members:
            return 0.0
        raise BadInputError(f"{src}: coalition {list(members)} is missing (Monte Carlo needed it)", param="values")
    return CachedValue(n, score)


def command_value(cmd: str, contrib: np.ndarray, timeout: float = 600.0) -> CachedValue:
    """Score a coalition by running `cmd` (split like a shell, no shell): it reads
    {"members": [...], "contrib": [...]} (0-based agents, their contributions) as JSON on stdin and prints v."""
    argv = shlex.split(cmd)
    if not argv:
        raise BadInputError("empty command", param="value_cmd")

    def score(members):
        doc = json.dumps({"members": list(members), "contrib": [float(contrib[j]) for j in members]})
        try:
            res = subprocess.run(argv, input=doc, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeFailure(f"{argv[0]}: {e}") from None
        if res.returncode != 0:
            tail = (res.stderr.strip().splitlines() or [""])[-1]
            raise RuntimeFailure(f"value command exited {res.returncode} on coalition {list(members)}: {tail}")
        try:
            v = float(res.stdout.strip())
        except ValueError:
            raise BadInputError(f"value command printed {res.stdout.strip()[:60]!r} for coalition {list(members)}; "
                                "expected one number", param="value_cmd") from None
        if not math.isfinite(v):
            raise BadInputError(f"value command printed a non-finite value for {list(members)}", param="value_cmd")
        return v
    return CachedValue(len(contrib), score)
