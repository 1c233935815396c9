"""What readers and writers share: format names, file names, dtype codes, tensor specs, the output record.

Standard library only at import (torch is imported inside the dtype helpers), so a command can import
the format list without torch.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from icmltools.core.errors import BadInputError

# output formats a writer produces ("same" = the base's, resolved by resolve_output_format)
OUTPUT_FORMATS = ("safetensors", "torch", "hf_safetensors", "hf_torch")

ST_INDEX = "model.safetensors.index.json"
ST_SINGLE = "model.safetensors"
PT_INDEX = "pytorch_model.bin.index.json"
PT_SINGLE = "pytorch_model.bin"
RECORD_KEY = "icml"
RECORD_IN_FOLDER = "icml_record.json"

# safetensors dtype codes <-> torch dtype names (resolved lazily so this module imports without torch)
_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "U16": "uint16", "U32": "uint32", "U64": "uint64",
}


def torch_dtype(code: str, where: str):
    """The torch dtype of safetensors code `code` (`where` names the tensor in the error)."""
    import torch

    name = _ST_DTYPES.get(code)
    dt = getattr(torch, name, None) if name else None
    if dt is None:
        raise BadInputError(f"{where}: unsupported safetensors dtype {code!r}")
    return dt


def st_code(dtype) -> str:
    """The safetensors code of a torch dtype."""
    name = str(dtype).replace("torch.", "")
    for code, n in _ST_DTYPES.items():
        if n == name:
            return code
    raise BadInputError(f"dtype {dtype} cannot be written to safetensors")


def is_float_dtype(dtype) -> bool:
    """Task vectors are taken over floating tensors only; integer/bool buffers are copied from the base."""
    return bool(getattr(dtype, "is_floating_point", False))


def all_finite(t) -> bool:
    """Whether every element of float tensor `t` is finite, in one reduction: a sum is finite only if
    every element is (NaN and inf survive any sum); an overflowing sum of finite elements falls back to
    the exact elementwise test. (The elementwise `isfinite(t).all()` allocates a bool tensor and runs ~10x
    slower than the sum on a CPU.)"""
    import math

    import torch

    if t.numel() == 0:
        return True
    if t.dtype.itemsize == 1:  # float8: no sum/isfinite kernels on CPU
        t = t.float()
    if math.isfinite(float(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def count_non_finite(t) -> int:
    """The number of NaN/inf elements of float tensor `t` (for error messages: the slow exact count)."""
    import torch

    if t.dtype.itemsize == 1:
        t = t.float()
    return int(t.numel() - torch.count_nonzero(torch.isfinite(t)))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: object  # torch.dtype
    shape: tuple

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def default_output_name(base, fmt: str) -> str:
    """`merged.safetensors`, `merged.pt` or `merged/` (HF folder) for the chosen output format."""
    return {"safetensors": "merged.safetensors", "torch": "merged.pt"}.get(fmt, "merged")


def resolve_output_format(base, fmt: str | None = "same") -> str:
    """`same` keeps the base's format: safetensors, torch, hf_safetensors or hf_torch."""
    if fmt in ("same", "auto", None):
        return base.format
    if fmt not in OUTPUT_FORMATS:
        raise BadInputError(f"unknown output format {fmt!r}; use same, {', '.join(OUTPUT_FORMATS)}", param="fmt")
    return fmt


def sidecar_path(path: str | os.PathLike) -> Path:
    """`merged.safetensors` -> `merged.safetensors.json` (the record of how a file was made)."""
    p = Path(path)
    return p / RECORD_IN_FOLDER if p.is_dir() else p.with_name(p.name + ".json")


def read_record(path: str | os.PathLike) -> dict:
    """The JSON record written next to (or inside) an output made by a `CheckpointWriter`."""
    p = sidecar_path(path)
    return json.loads(p.read_text()) if p.exists() else {}
