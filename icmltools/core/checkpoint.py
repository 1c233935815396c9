"""Safe checkpoint loading and atomic saving.

Never unpickles arbitrary objects: `torch.load(..., weights_only=True)`; safetensors preferred.
Every failure (missing, truncated, corrupt, a pickle that needs code) becomes a `BadInputError` that
names the file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import BadInputError
from .files import check_input_file
from .jsonio import atomic_path

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _weights_only_reason(msg: str) -> str:
    """The informative line of torch's weights-only refusal (which global or opcode it met), without the
    paragraph about PyTorch 2.6 defaults around it."""
    import re

    for line in msg.splitlines():
        line = line.strip()
        if re.search(r"GLOBAL|Unsupported|not an allowed|unsupported", line) and "weights_only" not in line:
            return line.rstrip(".")[:200]
    return "it holds objects other than tensors and plain containers"


def _damaged_zip(p: Path) -> bool:
    """A file that starts as a zip archive (torch's format) but has no readable end record: truncated."""
    import zipfile

    try:
        with open(p, "rb") as fh:
            magic = fh.read(4)
        return magic == b"PK\x03\x04" and not zipfile.is_zipfile(p)
    except OSError:
        return False


def safe_torch_load(path: str | os.PathLike, map_location: str = "cpu") -> Any:
    """`torch.load` with `weights_only=True`; corrupt or code-carrying pickles raise `BadInputError`."""
    import pickle

    import torch

    p = check_input_file(path)
    if _damaged_zip(p):
        raise BadInputError(f"{p}: corrupt or truncated torch checkpoint (its zip archive is incomplete)")
    try:
        return torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise BadInputError(
            f"{p}: refused to load: the pickle needs code or globals that a weights-only load does not allow "
            f"({_weights_only_reason(str(e))})",
            hint="re-save the checkpoint as a plain state_dict or as .safetensors",
        ) from e
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, AttributeError, TypeError) as e:
        raise BadInputError(f"{p}: corrupt or truncated torch checkpoint ({type(e).__name__}: {str(e)[:200]})") from e


def load_safetensors(path: str | os.PathLike, device: str = "cpu") -> dict:
    """Load every tensor of a `.safetensors` file; corrupt files raise `BadInputError`."""
    from safetensors.torch import load_file

    p = check_input_file(path)
    try:
        return load_file(str(p), device=device)
    except Exception as e:  # safetensors raises SafetensorError / OSError on bad headers
        raise BadInputError(f"{p}: corrupt or truncated safetensors file ({str(e)[:200]})") from e


def load_state_dict(path: str | os.PathLike, unwrap_keys: tuple[str, ...] = ("state_dict", "model")) -> dict:
    """Load a flat name->tensor mapping from `.safetensors` or a torch checkpoint.

    A torch checkpoint that wraps the weights under one of `unwrap_keys` is unwrapped.
    """
    p = Path(path)
    if p.suffix in SAFETENSORS_SUFFIXES:
        return load_safetensors(p)
    return unwrap_state_dict(safe_torch_load(p), p, unwrap_keys)


def unwrap_state_dict(obj: Any, path: str | os.PathLike, unwrap_keys: tuple[str, ...] = ("state_dict", "model")) -> dict:
    """The flat name -> tensor mapping inside a loaded torch checkpoint (a wrapper key in `unwrap_keys`
    is unwrapped), or a `BadInputError` naming `path` and the first entry that is not a tensor."""
    import torch

    if isinstance(obj, dict):
        for k in unwrap_keys:
            if k in obj and isinstance(obj[k], dict):
                obj = obj[k]
                break
    if not isinstance(obj, dict):
        raise BadInputError(f"{path}: expected a state_dict (name -> tensor), got {type(obj).__name__}")
    if not obj:
        raise BadInputError(f"{path}: the state_dict holds no tensor")
    bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise BadInputError(f"{path}: entry {bad[0]!r} is a {type(obj[bad[0]]).__name__}, not a tensor; "
                            "expected a flat state_dict (optionally under a 'state_dict' key)")
    return obj


def save_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Atomically write tensors as `.safetensors` (contiguous copies, string metadata)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    with atomic_path(path, suffix=".tmp.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return Path(path)


def save_torch(obj: Any, path: str | os.PathLike) -> Path:
    """Atomically `torch.save` an object made of tensors and plain containers (loadable with weights_only)."""
    import torch

    with atomic_path(path, suffix=".tmp.pt") as tmp:
        torch.save(obj, tmp)
    return Path(path)
