"""Entry points the `fope-train` command calls (pure library: no click, no rich)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from icmltools.core.errors import BadInputError
from icmltools.core.jsonio import atomic_write_json

from .data import PasskeyTask, check_lengths, default_corpus, load_text
from .presets import PRESETS
from .train import RunConfig, run_compare, run_eval


def make_config(preset: str = "quick", **overrides) -> RunConfig:
    """The preset's RunConfig with every non-None override applied, validated."""
    if preset not in PRESETS:
        raise BadInputError(f"--preset: unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    cfg = RunConfig(**PRESETS[preset])
    kw = {k: v for k, v in overrides.items() if v is not None}
    if "eval_factors" in kw:
        kw["eval_factors"] = tuple(kw["eval_factors"])
    cfg = replace(cfg, **kw)
    cfg.validate()
    return cfg


def load_data(cfg: RunConfig, text_file: str | None = None):
    if cfg.task == "passkey":
        if text_file:
            raise BadInputError("--text applies to --task text, not passkey")
        return PasskeyTask(cfg.passkey_digits)
    return load_text(text_file) if text_file else default_corpus()


def preflight(cfg: RunConfig, data, device: str = "cpu") -> None:
    """Check lengths against the data before anything is written (no half-made run folders)."""
    cfg.validate()
    if isinstance(data, PasskeyTask):
        if cfg.train_length + 1 < data.min_length:
            raise BadInputError(f"--train-length {cfg.train_length} is too short for the passkey task "
                                f"(needs >= {data.min_length - 1})")
    else:
        check_lengths(data, cfg.train_length, max(cfg.eval_lengths()),
                      name=f"--text {data.info.get('source')}" if data.info.get("source") != "python-stdlib"
                      else "default corpus")
    memory_check(cfg, data.vocab_size, device)


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
    a mistyped --train-length must be an error, not an out-of-memory kill."""
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
        raise BadInputError(f"--train-length {N} with eval length {L} needs about {need / 2**30:.1f} GiB "
                            f"(free: {free / 2**30:.1f} GiB)",
                            hint="lower --train-length, --eval-factors or --batch-size")


def compare(pes, cfg: RunConfig, data, device: str, seed: int = 0, out_dir=None, extend=(), resume=False,
            progress=None, stream=None) -> dict:
    res = run_compare(pes, cfg, data, device, seed, Path(out_dir) if out_dir else None, tuple(extend), resume,
                      progress or (lambda *a: None), stream)
    res["data"] = data.info if not isinstance(data, PasskeyTask) else data.info()
    return res


def eval_checkpoint(ckpt_dir, device: str, text_file: str | None = None, factors=None, extend=None,
                    extend_factor=None, eval_samples=None, seed: int = 0, progress=None) -> dict:
    """Eval mode: the data is rebuilt from the checkpoint's config (passkey) or --text / the default corpus."""
    d = Path(ckpt_dir)
    if d.is_file():
        d = d.parent
    cfg_path = d / "config.json"
    try:
        meta = json.loads(cfg_path.read_text())
        task = meta["run"]["task"]
        digits = int(meta["run"].get("passkey_digits", 5))
    except FileNotFoundError:
        raise BadInputError(f"--eval {d}: not a fope-train checkpoint folder (no config.json)") from None
    except (ValueError, KeyError, TypeError) as e:
        raise BadInputError(f"--eval {cfg_path}: corrupt checkpoint config ({type(e).__name__})") from None
    if task == "passkey":
        data = PasskeyTask(digits)
    else:
        data = load_text(text_file) if text_file else default_corpus()
        trained_on = (meta.get("data") or {}).get("sha256")
        if trained_on and trained_on != data.info.get("sha256") and not text_file:
            import logging

            logging.getLogger(__name__).warning("the checkpoint was trained on other text (sha256 %s); "
                                                "evaluating on the default corpus", trained_on[:12])
    res = run_eval(d, data, device, factors=factors, extend=extend, extend_factor=extend_factor,
                   eval_samples=eval_samples, seed=seed, progress=progress or (lambda *a: None))
    res["data"] = data.info if not isinstance(data, PasskeyTask) else data.info()
    return res


def write_run_files(run_dir, params: dict, result: dict) -> None:
    run_dir = Path(run_dir)
    atomic_write_json(run_dir / "config.json", params)
    atomic_write_json(run_dir / "result.json", result)
