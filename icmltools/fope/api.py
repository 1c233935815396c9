"""Entry points the `fope-train` command calls (pure library: no click, no rich).

    info = api.process_info()                       # torchrun role: rank, world, whether this process writes
    cfg, data = api.prepare("quick", text_file=None, device="cpu", steps=300)
    result = api.compare(("rope", "fope"), cfg, data, "cpu", seed=0, out_dir=run_dir)
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
from .train import check_data, read_checkpoint_meta, run_compare, run_eval

__all__ = ["Dist", "process_info", "make_config", "load_data", "prepare", "compare", "eval_checkpoint",
           "memory_check"]


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


def compare(pes, cfg: RunConfig, data, device: str, seed: int = 0, out_dir=None, extend=(), resume=False,
            progress=None, stream=None, preset: str | None = None) -> dict:
    """Train and evaluate every position embedding in `pes` (train.run_compare) and describe the data.
    Under torchrun only rank 0 writes checkpoints into `out_dir` (the others read it to resume)."""
    res = run_compare(pes, cfg, data, device, seed, Path(out_dir) if out_dir else None, tuple(extend or ()),
                      resume, progress or (lambda *a: None), stream)
    res["data"] = _data_info(data)
    if preset is not None:
        res["preset"] = preset
    return res


def eval_checkpoint(ckpt_dir, device: str, text_file: str | None = None, factors=None, extend=(),
                    extend_factor=None, eval_samples=None, seed: int = 0, progress=None) -> dict:
    """Eval mode: the data is rebuilt from the checkpoint's config (passkey) or the text file / the
    default corpus (text)."""
    d, meta = read_checkpoint_meta(ckpt_dir)
    run = meta["run"]
    if run.get("task") == "passkey":
        data = PasskeyTask(int(run.get("passkey_digits", 5)))
    else:
        data = load_text(text_file) if text_file else default_corpus()
        trained_on = (meta.get("data") or {}).get("sha256")
        if trained_on and trained_on != data.info.get("sha256") and not text_file:
            logging.getLogger(__name__).warning("the checkpoint was trained on other text (sha256 %s); "
                                                "evaluating on the default corpus", trained_on[:12])
    res = run_eval(d, data, device, factors=factors, extend=extend, extend_factor=extend_factor,
                   eval_samples=eval_samples, seed=seed, progress=progress or (lambda *a: None))
    res["data"] = _data_info(data)
    return res
