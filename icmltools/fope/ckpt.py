"""fope-train checkpoints: one folder per position embedding, `model.safetensors` (weights and the frozen
FoPE coefficients; its metadata holds the step), `config.json` (position embedding, run and model config,
training data with its SHA-256, step) and `train_state.pt` (optimizer, step, batch-stream state).

A checkpoint is written whole or not at all: its weights are checked finite first, each file is written
atomically, and Ctrl-C during the three writes takes effect right after them. Reading refuses a corrupt
file, weights that do not match the config, and a non-finite tensor, naming it.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path

import torch

from icmltools.core.checkpoint import load_safetensors, safe_torch_load, save_safetensors, save_torch
from icmltools.core.errors import BadInputError, RuntimeFailure
from icmltools.core.jsonio import atomic_write_json
from icmltools.nn import DecoderStack, TransformerConfig

from .model import build_model
from .options import RunConfig

__all__ = ["FORMAT", "MODEL_FIELDS", "deferred_interrupt", "first_non_finite", "save_checkpoint",
           "read_checkpoint_meta", "load_weights", "load_checkpoint", "resume_state", "check_resume"]

FORMAT = "icml-fope-train"
# RunConfig fields a resumed run must share with its checkpoints (they define the model and its data)
MODEL_FIELDS = ("task", "train_length", "d_model", "n_layers", "n_heads", "mlp_hidden", "theta", "sigma", "pad",
                "passkey_digits")


@contextlib.contextmanager
def deferred_interrupt():
    """Ctrl-C (SIGINT) inside the block takes effect when the block ends (main thread only)."""
    got: list = []
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(frame))
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
            if got and callable(old):
                old(signal.SIGINT, got[-1])       # Python's default handler raises KeyboardInterrupt
            elif got and old == signal.SIG_DFL:
                raise KeyboardInterrupt


def first_non_finite(tensors: dict) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, or None."""
    for name, t in tensors.items():
        if torch.is_floating_point(t) and not bool(torch.isfinite(t).all()):
            return name
    return None


def save_checkpoint(ckpt_dir: Path, model: DecoderStack, meta: dict, opt=None, data_rng=None, step: int = 0) -> None:
    """Write the checkpoint of `model` at `step` (with `opt` and the batch-stream state `data_rng`: resumable)."""
    state = dict(model.state_dict())
    if model.head is not None and model.cfg.tie_weights:
        state.pop("head.weight", None)
    bad = first_non_finite(state)
    if bad is not None:
        raise RuntimeFailure(f"{meta['pe']}: tensor {bad} holds NaN or inf at step {step}; no checkpoint written")
    with deferred_interrupt():
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        save_safetensors(state, ckpt_dir / "model.safetensors",
                         metadata={"format": FORMAT, "pe": meta["pe"], "step": str(step)})
        if opt is not None:
            save_torch({"optimizer": opt.state_dict(), "step": step, "data_rng": data_rng}, ckpt_dir / "train_state.pt")
        atomic_write_json(ckpt_dir / "config.json", {**meta, "step": step})


def read_checkpoint_meta(ckpt_dir: str | os.PathLike, param: str = "ckpt_dir") -> tuple[Path, dict]:
    """(folder, parsed config.json) of a checkpoint folder (or of the folder of a file in it); a missing,
    corrupt or foreign config raises BadInputError naming `param`."""
    d = Path(ckpt_dir)
    if d.is_file():
        d = d.parent
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise BadInputError(f"{d}: not a fope-train checkpoint folder (no config.json)", param=param)
    try:
        meta = json.loads(cfg_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInputError(f"{cfg_path}: corrupt checkpoint config ({type(e).__name__})", param=param) from None
    if isinstance(meta, dict) and "command" in meta and "pe" not in meta:
        subs = sorted(c.parent.name for c in d.glob("*/model.safetensors"))
        raise BadInputError(f"{d} is a run folder; pass one of its checkpoints: {', '.join(subs) or 'none'}",
                            param=param)
    if not isinstance(meta, dict) or not {"pe", "run", "model"} <= set(meta):
        raise BadInputError(f"{cfg_path}: corrupt checkpoint config (missing pe/run/model)", param=param)
    return d, meta


def load_weights(path: Path, device: str = "cpu", param: str = "ckpt_dir") -> dict:
    """Every tensor of a checkpoint's `model.safetensors`; corrupt files and non-finite tensors raise
    BadInputError naming the file (and the tensor)."""
    try:
        state = load_safetensors(path, device=device)
    except BadInputError as e:
        raise BadInputError(e.message, param=param) from None
    bad = first_non_finite(state)
    if bad is not None:
        raise BadInputError(f"{path}: tensor {bad} holds NaN or inf", param=param)
    return state


def _weights_step(path: Path) -> int | None:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        step = (f.metadata() or {}).get("step")
    return int(step) if step is not None and step.isdigit() else None


def load_checkpoint(ckpt_dir: str | os.PathLike, device: str = "cpu", param: str = "ckpt_dir"
                    ) -> tuple[DecoderStack, dict]:
    """Rebuild a model from `config.json` + `model.safetensors`; corrupt files raise BadInputError."""
    d, meta = read_checkpoint_meta(ckpt_dir, param)
    try:
        run = RunConfig.from_dict(meta["run"])
        mcfg = TransformerConfig(**meta["model"])
        model = build_model(meta["pe"], mcfg, run.train_length, run.theta, run.sigma, run.pad,
                            int(meta.get("seed", 0)))
    except (ValueError, KeyError, TypeError, BadInputError) as e:
        raise BadInputError(f"{d / 'config.json'}: corrupt checkpoint config ({type(e).__name__}: {e})",
                            param=param) from None
    state = load_weights(d / "model.safetensors", param=param)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise BadInputError(f"{d / 'model.safetensors'}: weights do not match config.json "
                            f"({str(e).splitlines()[0][:200]})", param=param) from None
    return model.to(device), meta


def _training_state(ckpt_dir: Path, device: str = "cpu") -> tuple[dict, dict]:
    """(train_state.pt, weights) of a resumable checkpoint, refused when corrupt, non-finite or inconsistent."""
    try:
        st = safe_torch_load(ckpt_dir / "train_state.pt")
    except BadInputError as e:
        raise BadInputError(e.message, param="out") from None
    if not isinstance(st, dict) or not {"optimizer", "step", "data_rng"} <= set(st):
        raise BadInputError(f"{ckpt_dir / 'train_state.pt'}: not a fope-train training state", param="out")
    weights = ckpt_dir / "model.safetensors"
    state = load_weights(weights, device, param="out")
    if _weights_step(weights) not in (None, int(st["step"])):
        raise BadInputError(f"{ckpt_dir}: weights at step {_weights_step(weights)} but training state at step "
                            f"{int(st['step'])} (a write was cut short)", param="out")
    return st, state


def resume_state(ckpt_dir: Path, model, opt, gen: torch.Generator, device: str) -> int:
    """Load weights, optimizer and batch-stream state from a checkpoint folder; returns its step (0 when the
    folder holds no training state yet). Refuses a corrupt, non-finite or inconsistent checkpoint."""
    if not (ckpt_dir / "train_state.pt").is_file():
        return 0
    st, state = _training_state(ckpt_dir, device)
    try:
        model.load_state_dict(state)
        opt.load_state_dict(st["optimizer"])
        gen.set_state(st["data_rng"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise BadInputError(f"{ckpt_dir}: cannot resume from this checkpoint "
                            f"({str(e).splitlines()[0][:200]})", param="out") from None
    return int(st["step"])


def _run_folder(out_dir: Path) -> None:
    if not out_dir.is_dir():
        raise BadInputError(f"{out_dir}: no such run folder (nothing to resume)", param="out",
                            hint="start a new run, or give the folder of the run to continue")
    try:
        doc = json.loads((out_dir / "config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict) or doc.get("command") != "fope-train":
        raise BadInputError(f"{out_dir}: not a fope-train run folder (no readable config.json from fope-train)",
                            param="out")


def check_resume(out_dir, cfg: RunConfig, data_info: dict, pes) -> None:
    """Before anything is written: `out_dir` is a fope-train run folder and each of its checkpoints of
    `pes` was trained with this model, task and data, at no more than `cfg.steps` steps, and loads."""
    out_dir = Path(out_dir)
    _run_folder(out_dir)
    want = cfg.to_dict()
    for pe in pes:
        if not (out_dir / pe / "config.json").is_file():
            continue                                       # not started yet: trains from step 0
        d, meta = read_checkpoint_meta(out_dir / pe, param="out")
        for f in MODEL_FIELDS:
            if meta["run"].get(f) != want[f]:
                raise BadInputError(f"{d}: trained with {f} {meta['run'].get(f)}, this run has {want[f]}; "
                                    "resume with the settings of the run", param="out")
        trained_on = (meta.get("data") or {}).get("sha256")
        if trained_on and trained_on != data_info.get("sha256"):
            raise BadInputError(f"{d}: trained on other data (sha256 {trained_on[:12]}, this run's "
                                f"{str(data_info.get('sha256'))[:12]})", param="out")
        if int(meta.get("step") or 0) > cfg.steps:
            raise BadInputError(f"{d}: already at step {meta['step']}, beyond this run's {cfg.steps} steps",
                                param="out")
        if (d / "train_state.pt").is_file():
            _training_state(d)
