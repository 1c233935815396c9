"""Data for fope-train: byte-level text (a user file or the offline default corpus) and the
synthetic passkey-retrieval task (token level, generated in-process).

Default corpus: the CPython standard library's `.py` sources on this machine (no download), without
test suites, `encodings/`, `lib2to3/` and any site-packages, in sorted path order; its SHA-256 goes in
the JSON because it differs between Python versions. Train/validation are split by file (a file's
path hash decides), so no validation byte is ever in a training window. A user text file is split
contiguously: the first 90% trains, the last 10% validates.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from icmltools.core.errors import BadInputError

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings", "lib2to3", "__pycache__"}


@dataclass
class TextData:
    train: np.ndarray            # uint8 bytes
    val: np.ndarray
    info: dict = field(default_factory=dict)
    vocab_size: int = 256


def stdlib_files(root: str | os.PathLike | None = None) -> tuple[Path, list[Path]]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted((f for f in root.rglob("*.py")
                    if f.is_file() and not (set(f.relative_to(root).parts[:-1]) & _SKIP_DIRS)),
                   key=lambda f: f.relative_to(root).as_posix())
    return root, files


def default_corpus(val_every: int = 10, root: str | os.PathLike | None = None) -> TextData:
    """The stdlib `.py` corpus at byte level, split by file (about 1 file in `val_every` validates).
    Read once per process (the arrays are read-only)."""
    return _default_corpus(int(val_every), str(root) if root else None)


@functools.lru_cache(maxsize=2)
def _default_corpus(val_every: int, root: str | None) -> TextData:
    root, files = stdlib_files(root)
    if not files:
        raise BadInputError(f"default corpus: no .py files under {root}", hint="train on a text file instead")
    sha = hashlib.sha256()
    train, val = [], []
    for f in files:
        rel = f.relative_to(root).as_posix()
        try:
            data = f.read_bytes()
        except OSError:
            continue
        sha.update(rel.encode() + b"\0" + data)
        is_val = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % val_every == 0
        (val if is_val else train).append(data + b"\n")
    tr = np.frombuffer(b"".join(train), dtype=np.uint8)
    va = np.frombuffer(b"".join(val), dtype=np.uint8)
    info = {"source": "python-stdlib", "root": str(root), "files": len(files), "train_files": len(train),
            "val_files": len(val), "bytes": int(tr.size + va.size), "train_bytes": int(tr.size),
            "val_bytes": int(va.size), "sha256": sha.hexdigest(), "split": "by file (sha1(path) % 10 == 0 -> val)"}
    return TextData(tr, va, info)


def load_text(path: str | os.PathLike, val_frac: float = 0.1) -> TextData:
    """A user text file at byte level; refuses empty and binary files (NUL bytes or invalid UTF-8)."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p}: no such file", param="text_file")
    data = p.read_bytes()
    if not data.strip():
        raise BadInputError(f"{p}: file is empty", param="text_file")
    if b"\0" in data[:1 << 20]:
        raise BadInputError(f"{p}: looks binary (contains NUL bytes), expected UTF-8 text", param="text_file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInputError(f"{p}: not valid UTF-8 text (byte {e.start}: {e.reason})", param="text_file") from None
    arr = np.frombuffer(data, dtype=np.uint8)
    cut = int(round(arr.size * (1 - val_frac)))
    info = {"source": str(p), "path": str(p.resolve()), "bytes": int(arr.size), "train_bytes": cut,
            "val_bytes": int(arr.size - cut), "sha256": hashlib.sha256(data).hexdigest(),
            "split": f"contiguous: first {1 - val_frac:.0%} train"}
    return TextData(arr[:cut], arr[cut:], info)


def check_lengths(data: TextData, train_length: int, max_eval_length: int, name: str | None = None) -> None:
    """Both splits hold at least one window: the training split one of `train_length + 1` bytes, the
    validation split one of `max_eval_length + 1`. The message names the data (the user's file or the corpus)."""
    source = data.info.get("source")
    name = name or (str(source) if source not in (None, "python-stdlib") else "default corpus")
    for split, what, length, param, fix in ((data.train, "train length", train_length, "train_length",
                                             "a shorter training length"),
                                            (data.val, "longest evaluation length", max_eval_length, "eval_factors",
                                             "smaller evaluation factors")):
        if split.size < length + 1:
            part = "training" if split is data.train else "validation"
            raise BadInputError(f"{name}: {what} {length} is longer than the {part} split ({split.size} bytes)",
                                param=param, hint=f"use {fix} or a larger text file")


def sample_windows(stream: np.ndarray, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` random windows of `length + 1` bytes (inputs and shifted targets) as int64."""
    hi = stream.size - length - 1
    starts = torch.randint(0, hi + 1, (batch,), generator=gen).numpy()
    idx = starts[:, None] + np.arange(length + 1)[None]
    return torch.from_numpy(stream[idx].astype(np.int64))


def eval_starts(size: int, n: int, max_length: int) -> np.ndarray:
    """Start offsets of `n` evaluation windows, evenly spaced over a split of `size` bytes so that a window
    of `max_length + 1` bytes fits at each. Every evaluation length uses these starts (the window of
    length L starts where the N window starts), so the growth from N to L compares like with like."""
    hi = size - max_length - 1
    if hi < 0:
        raise BadInputError(f"a validation split of {size} bytes holds no window of {max_length + 1} bytes",
                            param="eval_factors")
    return np.linspace(0, hi, num=n).astype(np.int64) if n > 1 else np.zeros(1, dtype=np.int64)


def windows_at(stream: np.ndarray, starts: np.ndarray, length: int) -> torch.Tensor:
    """The windows of `length + 1` bytes (inputs and shifted targets) at `starts`, as int64."""
    idx = starts[:, None] + np.arange(length + 1)[None]
    return torch.from_numpy(stream[idx].astype(np.int64))


def eval_windows(stream: np.ndarray, n: int, length: int) -> torch.Tensor:
    """`n` evenly spaced windows of `length + 1` bytes (the same for every method)."""
    return windows_at(stream, eval_starts(stream.size, n, length), length)


# --------------------------------------------------------------------------------------------- passkey

FILLER = "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back again .".split()
KEY_LINE = "The pass key is {k} . Remember it . {k} is the pass key .".split()
QUESTION = "What is the pass key ? The pass key is".split()
DIGITS = [str(i) for i in range(10)]


class PasskeyTask:
    """Passkey retrieval (Mohtashami & Jaggi 2023; the FoPE paper's protocol) at word-token level.

    A sequence is filler sentences (starting at a random phase of the cycle) with the key line
    "The pass key is K . Remember it . K is the pass key ." inserted at a uniformly random depth,
    then "What is the pass key ? The pass key is" and the key's digits, one token per digit.
    Accuracy: exact match of the greedily generated digits, which equals all digits being the argmax
    under teacher forcing (one forward pass).
    """

    def __init__(self, digits: int = 5):
        self.digits = int(digits)
        words = sorted(set(FILLER) | set(KEY_LINE) | set(QUESTION) - {"{k}"})
        self.vocab = DIGITS + [w for w in words if w not in DIGITS and w != "{k}"]
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.filler = torch.tensor([self.index[w] for w in FILLER])
        self.question = torch.tensor([self.index[w] for w in QUESTION])
        self.vocab_size = len(self.vocab)
        self.key_len = len(KEY_LINE) - 2 + 2 * self.digits
        self.min_length = self.key_len + len(QUESTION) + self.digits + 1

    def info(self) -> dict:
        return {"source": "passkey", "vocab_size": self.vocab_size, "digits": self.digits,
                "filler": " ".join(FILLER), "key_line": " ".join(KEY_LINE).replace("{k}", "K"),
                "question": " ".join(QUESTION)}

    def batch(self, batch: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, length + 1), answer target positions (B, digits) in the shifted targets)."""
        if length + 1 < self.min_length:
            raise BadInputError(f"passkey: length {length} is too short for the key line and question "
                                f"(needs >= {self.min_length - 1} tokens)")
        n_fill = length + 1 - self.key_len - len(QUESTION) - self.digits
        keys = torch.randint(0, 10, (batch, self.digits), generator=gen)
        phase = torch.randint(0, len(FILLER), (batch,), generator=gen)
        depth = torch.randint(0, n_fill + 1, (batch,), generator=gen)
        cyc = self.filler.repeat(n_fill // len(FILLER) + 2)
        out = torch.empty(batch, length + 1, dtype=torch.long)
        for b in range(batch):
            k = keys[b]
            line = []
            for w in KEY_LINE:
                line.append(k if w == "{k}" else torch.tensor([self.index[w]]))
            line = torch.cat(line)
            fill = cyc[phase[b]: phase[b] + n_fill]
            d = int(depth[b])
            out[b] = torch.cat([fill[:d], line, fill[d:], self.question, k])
        ans = torch.arange(length - self.digits, length)[None].expand(batch, -1)
        return out, ans

    def decode(self, tokens) -> str:
        return " ".join(self.vocab[int(t)] for t in tokens)
