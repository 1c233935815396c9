"""Entry points the `fope-train` command calls (pure library: no click, no rich).

    info = api.process_info()                       # torchrun role: rank, world, whether this process writes
    cfg, data = api.prepare("quick", text_file=None, device="cpu", steps=300)
    result = api.compare(("rope", "fope"), cfg, data, "cpu", seed=0, out_dir=run_dir)
    api.check_resume("runs/x", cfg, data, ("rope", "fope"))   # before resuming: folder, settings, data
    result = api.eval_checkpoint("runs/x/fope", "cpu", factors=(1, 2, 4, 8))
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from icmltools.core.errors import BadInputError

from .data import PasskeyTask, default_corpus, load_text
from .dist import Dist, process_info
from .options import DEFAULT_PRESET, PRESETS, RunConfig

__all__ = ["Dist", "process_info", "make_config", "load_data", "prepare", "compare", "eval_checkpoint",
           "memory_check", "check_resume", "checkpoint_data"]

log = logging.getLogger(__name__)


def make_config(preset: str = DEFAULT_PRESET, **overrides) -> RunConfig:
    """The preset's RunConfig with every non-None override applied, validated."""
    if preset not in PRESETS:
        raise BadInputError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}", param="preset")
    kw = {k: v for k, v in overrides.items() if v is not None}
    if "eval_factors" in kw:
        kw["eval_factors"] = tuple(kw["eval_factors"])
    cfg = replace(RunConfig(**PRESETS[preset]), **kw)
    cfg.validate()
    return cfg


def load_data(cfg: RunConfig, text_file: str | None = None):
    """The passkey task, the user's text file, or the default corpus (the stdlib's .py sources)."""
    if cfg.task == "passkey":
        if text_file:
            raise BadInputError("applies to the text task, not passkey", param="text_file")
        return PasskeyTask(cfg.passkey_digits)
    return load_text(text_file) if text_file else default_corpus()


def prepare(preset: str = DEFAULT_PRESET, text_file: str | None = None, device: str = "cpu",
            **overrides) -> tuple[RunConfig, object]:
    """Resolve the configuration (a text file implies the text task unless `task` is given), load the
    data and check lengths and memory, all before anything is written."""
    if text_file and overrides.get("task") is None:
        overrides["task"] = "text"
    from .train import check_data

    cfg = make_config(preset, **overrides)
    data = load_data(cfg, text_file)
    check_data(cfg, data)
    memory_check(cfg, data.vocab_size, device)
    return cfg, data


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_check(cfg: RunConfig, vocab: int, device: str = "cpu") -> None:
    """Refuse runs whose attention scores alone would not fit in half the free host memory (CPU):
    a mistyped training length must be an error, not an out-of-memory kill."""
    if not device.startswith("cpu"):
        return
    free = _available_bytes()
    if not free:
        return
    L, N = max(cfg.eval_lengths()), cfg.train_length
    ev = cfg.eval_batch * cfg.n_heads * L * L * 4 * 3 + cfg.eval_batch * L * (vocab + 8 * cfg.d_model) * 4
    tr = cfg.batch_size * cfg.n_layers * cfg.n_heads * N * N * 4 * 4 + cfg.batch_size * N * cfg.d_model * 4 * 40
    need = max(ev, tr)
    if need > free // 2:
        raise BadInputError(f"{N} with evaluation length {L} needs about {need / 2**30:.1f} GiB "
                            f"(free: {free / 2**30:.1f} GiB)", param="train_length",
                            hint="lower the training length, the evaluation factors or the batch size")


def _data_info(data) -> dict:
    return data.info() if isinstance(data, PasskeyTask) else data.info


def check_resume(out_dir, cfg: RunConfig, data, pes) -> None:
    """Before a resumed run writes anything: `out_dir` is a fope-train run folder whose checkpoints of
    `pes` were trained with this model, task and data (BadInputError naming `out` otherwise)."""
    from .ckpt import check_resume as _check
    from .model import parse_pes

    if out_dir is None:
        raise BadInputError("a resumed run needs the run folder to resume", param="out")
    _check(out_dir, cfg, _data_info(data), parse_pes(pes))


def compare(pes, cfg: RunConfig, data, device: str, seed: int = 0, out_dir=None, extend=(), resume=False,
            progress=None, stream=None, preset: str | None = None) -> dict:
    """Train and evaluate every position embedding in `pes` (train.run_compare) and describe the data.
    Under torchrun only rank 0 writes checkpoints into `out_dir` (the others read it to resume)."""
    from .train import run_compare

    res = run_compare(pes, cfg, data, device, seed, Path(out_dir) if out_dir else None, tuple(extend or ()),
                      resume, progress or (lambda *a: None), stream)
    res["data"] = _data_info(data)
    if preset is not None:
        res["preset"] = preset
    return res


def _recorded_text(d: Path, info: dict):
    """The text file a checkpoint was trained on, read again and checked against its SHA-256."""
    path = info.get("path") or info.get("source")
    if not path:
        raise BadInputError(f"{d}: the checkpoint does not record its training text", param="ckpt_dir",
                            hint="give the evaluation text file explicitly")
    if not Path(path).is_file():
        raise BadInputError(f"{d}: trained on {path}, which is missing", param="ckpt_dir",
                            hint="give the evaluation text file explicitly to evaluate on other text")
    data = load_text(path)
    if info.get("sha256") and data.info["sha256"] != info["sha256"]:
        raise BadInputError(f"{d}: trained on {path}, which has changed since (sha256 {data.info['sha256'][:12]}, "
                            f"trained on {info['sha256'][:12]})", param="ckpt_dir",
                            hint="give the evaluation text file explicitly to evaluate on it anyway")
    return data


def _recorded_corpus(info: dict):
    """The default corpus: from the recorded stdlib root when it is there and matches, else this Python's."""
    root, sha = info.get("root"), info.get("sha256")
    if root and Path(root).is_dir():
        data = default_corpus(root=root)
        if not sha or data.info["sha256"] == sha:
            return data
    return default_corpus()


def checkpoint_data(ckpt_dir, meta: dict, text_file: str | None = None):
    """The data to evaluate a checkpoint on: the passkey task, `text_file` when given, else the data recorded
    in the checkpoint (its text file, refused if missing or changed; or the default corpus). The returned
    data's info says whether it matches the training data (`matches_training`)."""
    run, info = meta["run"], dict(meta.get("data") or {})
    if run.get("task") == "passkey":
        if text_file:
            raise BadInputError(f"{ckpt_dir} was trained on the passkey task; a text file does not apply",
                                param="text_file")
        return PasskeyTask(int(run.get("passkey_digits", 5)))
    if text_file:
        data = load_text(text_file)
    elif info.get("source") in (None, "python-stdlib"):
        data = _recorded_corpus(info)
    else:
        data = _recorded_text(Path(ckpt_dir), info)
    same = not info.get("sha256") or data.info.get("sha256") == info["sha256"]
    data = replace(data, info={**data.info, "matches_training": same, "trained_on_sha256": info.get("sha256")})
    if not same and not text_file:
        log.warning("the checkpoint was trained on another default corpus (sha256 %s, here %s): another Python "
                    "version's standard library", str(info.get("sha256"))[:12], data.info["sha256"][:12])
    return data


def eval_checkpoint(ckpt_dir, device: str, text_file: str | None = None, factors=None, extend=(),
                    extend_factor=None, eval_samples=None, seed: int = 0, progress=None) -> dict:
    """Eval mode: the data is `text_file` when given, else what the checkpoint's config records
    (`checkpoint_data`)."""
    from .ckpt import read_checkpoint_meta
    from .train import run_eval

    d, meta = read_checkpoint_meta(ckpt_dir)
    data = checkpoint_data(d, meta, text_file)
    res = run_eval(d, data, device, factors=factors, extend=extend, extend_factor=extend_factor,
                   eval_samples=eval_samples, seed=seed, progress=progress or (lambda *a: None))
    res["data"] = _data_info(data)
    return res
