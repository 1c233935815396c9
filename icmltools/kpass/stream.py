"""JSONL groups in, per-sample advantages out: the trainer-agnostic stream transform.

Input, one group per line: {"samples": [{"reward": 1, "answer": "42"}, ...], ...} or {"rewards": [...],
"answers": [...], ...}; every other key passes through. Output: the same object plus "advantages", "objective"
(the group's estimate of f) and "k". Reads whatever the input has ready (`read1`), computes it vectorised per
group size, writes and flushes before reading on: memory is bounded by one chunk, not by the number of lines.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError, IcmlError, RuntimeFailure
from icmltools.core.files import check_input_file
from icmltools.core.jsonio import apply_umask, output_errors

from .estimators import _encode_group, evaluate
from .options import TransformConfig

CHUNK = 1 << 16
MAX_LISTED = 20


class LineError(Exception):
    """A bad input line (the stream adds the line number)."""


# ------------------------------------------------------------------------------------------------ input


def open_input(path: str):
    """A binary reader with `read1` for a file or '-' (stdin); gzip by extension or by its magic bytes."""
    if path == "-":
        raw = getattr(sys.stdin, "buffer", sys.stdin)
        name = "stdin"
    else:
        p = check_input_file(path, allow_empty=True)
        raw = open(p, "rb")  # noqa: SIM115 (closed by the caller)
        name = str(p)
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == b"\x1f\x8b" or name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb"), name
    return raw, name


def _lines(reader, name):
    """Yield batches [(line number, bytes)] of the complete lines available now."""
    buf = b""
    lineno = 0
    while True:
        try:
            chunk = reader.read1(CHUNK)
        except (OSError, EOFError) as e:  # corrupt or truncated gzip
            raise BadInputError(f"{name}: line {lineno + 1}: cannot read input: {e}", param="input") from None
        if not chunk:
            break
        buf += chunk
        parts = buf.split(b"\n")
        buf = parts.pop()
        batch = []
        for line in parts:
            lineno += 1
            batch.append((lineno, line))
        if batch:
            yield batch
    if buf.strip():
        yield [(lineno + 1, buf)]


# ------------------------------------------------------------------------------------------------ output


@dataclass
class Sink:
    """Where lines go: stdout (streamed) or a file written as `<name>.part` and renamed at the end."""

    fh: object
    path: Path | None = None
    tmp: Path | None = None
    written: int = 0
    owned: bool = True

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        with output_errors(self.path or "stdout"):
            self.fh.write(b"\n".join(lines) + b"\n")
            self.fh.flush()
        self.written += len(lines)

    def finish(self) -> None:
        self._close()
        if self.tmp is not None:
            apply_umask(self.tmp)
            with output_errors(self.path):
                os.replace(self.tmp, self.path)

    def abort(self, keep: bool) -> Path | None:
        """On a bad line: keep the lines already written as `<out>.partial` (if any); else remove the temp."""
        self._close()
        if self.tmp is None:
            return None
        if keep and self.written:
            partial = self.path.with_name(self.path.name + ".partial")
            apply_umask(self.tmp)
            os.replace(self.tmp, partial)
            return partial
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()
        return None

    def _close(self):
        if self.owned:
            with contextlib.suppress(Exception):
                self.fh.close()


def open_output(path: str) -> Sink:
    """stdout ('-'): a binary duplicate of fd 1 taken now (before the run guards stdout); a file: a temp in the
    same folder, gzip when the name ends in .gz."""
    if path == "-":
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        try:
            fd = sys.stdout.fileno()
            return Sink(os.fdopen(os.dup(fd), "wb"))
        except (AttributeError, OSError, ValueError):
            return Sink(sys.stdout.buffer, owned=False)
    p = Path(path)
    with output_errors(p):
        if p.is_dir():
            raise IsADirectoryError(21, "is a directory")
        fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.", suffix=".part")
    fh = os.fdopen(fd, "wb")
    if p.name.endswith(".gz"):
        fh = gzip.GzipFile(fileobj=fh, mode="wb", mtime=0)
        fh.myfileobj = fh.fileobj  # closing the gzip closes the file too
    return Sink(fh, path=p, tmp=Path(tmp))


# ------------------------------------------------------------------------------------------------ parsing


def _is_num(x) -> bool:
    return type(x) in (int, float)


def _group(obj, cfg: TransformConfig):
    """rewards, answers (or None) of one parsed line."""
    if not isinstance(obj, dict):
        raise LineError("expected a JSON object")
    if "samples" in obj:
        samples = obj["samples"]
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise LineError('"samples" must be a list of objects')
        try:
            rewards = [s[cfg.reward_key] for s in samples]
        except KeyError:
            raise LineError(f'a sample has no "{cfg.reward_key}"') from None
        answers = [s.get(cfg.answer_key) for s in samples] if any(cfg.answer_key in s for s in samples) else None
    elif "rewards" in obj:
        rewards, answers = obj["rewards"], obj.get("answers")
        if not isinstance(rewards, list):
            raise LineError('"rewards" must be a list')
        if answers is not None and (not isinstance(answers, list) or len(answers) != len(rewards)):
            raise LineError('"answers" must be a list as long as "rewards"')
    else:
        raise LineError('no "samples" or "rewards"')
    return rewards, answers


def _check_rewards(rewards):
    if not all(_is_num(x) for x in rewards):
        bad = next(i for i, x in enumerate(rewards) if not _is_num(x))
        raise LineError(f"sample {bad + 1}: reward {rewards[bad]!r} is not a number")
    if not math.isfinite(sum(rewards)):
        bad = [i for i, x in enumerate(rewards) if not math.isfinite(x)]
        if bad:
            raise LineError(f"sample {bad[0] + 1}: reward {rewards[bad[0]]} is not finite")


def _check_size(n, cfg: TransformConfig):
    k = n if cfg.k is None else cfg.k
    if n < 2:
        raise LineError(f"a group needs at least 2 samples, got {n}")
    if n < k:
        raise LineError(f"group of {n} samples is smaller than k = {k}")
    if cfg.estimator == "pkpo-loo" and n == k:
        raise LineError(f"pkpo-loo needs more samples than k = {k} (got {n})")
    return k


def parse_line(line: bytes, cfg: TransformConfig):
    """(object, rewards, codes, code rewards, k) of one line; LineError naming what is wrong."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise LineError(f"invalid JSON ({str(e).splitlines()[0]})") from None
    rewards, answers = _group(obj, cfg)
    _check_rewards(rewards)
    n = len(rewards)
    k = _check_size(n, cfg)
    codes = rew = None
    if cfg.objective == "maj":
        if answers is None:
            raise LineError(f'the maj objective needs answers ("{cfg.answer_key}" in samples, or "answers")')
        if not all(a is None or isinstance(a, (str, int, float, bool)) for a in answers):
            raise LineError("answers must be strings, numbers or null")
        codes, rew = np.full(n, -1, dtype=np.int64), np.zeros(n)
        try:
            _encode_group(answers, np.asarray(rewards, dtype=float), codes, rew, cfg.answer_reward, 0)
        except BadInputError as e:
            raise LineError(str(e).replace("group 0: ", "")) from None
    return obj, rewards, codes, rew, k


# ------------------------------------------------------------------------------------------------ the transform


@dataclass
class Summary:
    lines: int = 0
    blank: int = 0
    groups: int = 0
    skipped: int = 0
    skipped_lines: list = field(default_factory=list)
    first_errors: list = field(default_factory=list)
    sizes: dict = field(default_factory=dict)


def _compute(items, cfg: TransformConfig):
    """Advantages for parsed items, vectorised per (n, k); returns output lines in input order."""
    buckets: dict = {}
    for pos, it in enumerate(items):
        buckets.setdefault((len(it[1]), it[4]), []).append(pos)
    out: list = [None] * len(items)
    for (_n, k), poss in buckets.items():
        R = np.array([items[p][1] for p in poss], dtype=float)
        codes = rew = None
        if cfg.objective == "maj":
            codes = np.stack([items[p][2] for p in poss])
            rew = np.stack([items[p][3] for p in poss])
        A, f = evaluate(R, k, cfg.objective, cfg.estimator, codes, rew, cfg.scale, cfg.seed)
        if not (np.isfinite(A).all() and np.isfinite(f).all()):
            raise RuntimeFailure("advantages overflowed to a non-finite value (rewards too large)")
        for row, p in enumerate(poss):
            obj = items[p][0]
            obj["advantages"] = A[row].tolist()
            obj["objective"] = float(f[row])
            obj["k"] = k
            out[p] = obj
    return out


def _dump(obj) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode("utf-8")
    except ValueError:
        raise LineError("a passed-through value is not finite (NaN/Infinity)") from None


def _fail(summary: Summary, sink: Sink, lineno: int, msg: str, name: str):
    partial = sink.abort(keep=True)
    where = (f"; the {sink.written} good line(s) before it are in {partial}" if partial else
             f"; the {sink.written} line(s) before it were written" if sink.path is None and sink.written else "")
    raise BadInputError(f"{name}: line {lineno}: {msg}{where} (--on-error skip skips bad lines)", param="input")


def _note_skip(summary: Summary, lineno: int, msg: str):
    summary.skipped += 1
    if len(summary.skipped_lines) < MAX_LISTED:
        summary.skipped_lines.append(lineno)
        summary.first_errors.append(f"line {lineno}: {msg}")


def _process(batch, cfg, summary, sink, name):
    items, numbers, bad = [], [], None
    for lineno, line in batch:
        summary.lines = lineno
        if not line.strip():
            summary.blank += 1
            continue
        try:
            items.append(parse_line(line, cfg))
            numbers.append(lineno)
        except LineError as e:
            if cfg.on_error == "stop":
                bad = (lineno, str(e))
                break
            _note_skip(summary, lineno, str(e))
    out = _compute(items, cfg) if items else []
    lines = []
    for lineno, obj in zip(numbers, out):
        try:
            lines.append(_dump(obj))
        except LineError as e:
            if cfg.on_error == "stop":
                sink.write(lines)
                _fail(summary, sink, lineno, str(e), name)
            _note_skip(summary, lineno, str(e))
            continue
        n = len(obj["advantages"])
        summary.sizes[n] = summary.sizes.get(n, 0) + 1
    sink.write(lines)
    summary.groups += len(lines)
    if bad is not None:
        _fail(summary, sink, bad[0], bad[1], name)


def transform(cfg: TransformConfig, reader, name: str, sink: Sink) -> dict:
    """Stream every line of `reader` through the estimator into `sink`. stop: a bad line ends the run with an
    error naming it, after the good lines before it are written; skip: bad lines are left out and counted."""
    summary = Summary()
    try:
        for batch in _lines(reader, name):
            _process(batch, cfg, summary, sink, name)
        sink.finish()
    except IcmlError:
        sink.abort(keep=False)  # _fail already kept the partial output where there was one
        raise
    except BaseException:
        sink.abort(keep=False)
        raise
    return {"lines": summary.lines, "groups": summary.groups, "blank_lines": summary.blank,
            "skipped": summary.skipped, "skipped_lines": summary.skipped_lines,
            "first_errors": summary.first_errors[:5],
            "group_sizes": {str(k): v for k, v in sorted(summary.sizes.items())}}
