"""The model behind the pipeline, seen through one small interface (`Adapter`): which Linears are quantized,
block by block; the logits; the block-wise forward passes that give each block's Linears their inputs from
the full-precision model; a copy holding dequantized weights; the state dict and the dequantized checkpoint
in the input's format.

* `DecoderAdapter`: an `icmltools.nn.DecoderStack` (an `icml fope-train` checkpoint or the embedded demo).
  Its `attn.qkv` and `mlp.gate_up` each fuse the outputs of several projections (q, k, v; gate, up) that the
  official code quantizes as separate Linears, so their saliency groups are counted per projection.
* `icmltools.guidedquant.hf.HFAdapter`: a Hugging Face causal LM (optional `transformers`).
"""
from __future__ import annotations

import abc
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from .options import LAYER_NAMES


@dataclass
class QLayer:
    """One quantized layer: W is (d_out, d_in) whatever the module stores (`transposed`: GPT-2's Conv1D keeps
    (d_in, d_out)); `parts` projections are fused in its output rows (each gets its own G saliency groups)."""

    name: str
    module: torch.nn.Module
    parts: int = 1
    transposed: bool = False

    @property
    def W(self) -> torch.Tensor:
        w = self.module.weight.detach()
        return (w.T if self.transposed else w).float().clone()

    def set_W(self, W: torch.Tensor) -> None:
        w = self.module.weight
        w.data.copy_((W.T if self.transposed else W).to(w.dtype))


class Adapter(abc.ABC):
    """What the pipeline needs of a model; subclasses fill the model-specific parts."""

    kind = "model"
    model: torch.nn.Module

    @abc.abstractmethod
    def blocks(self) -> list[list[QLayer]]:
        """The quantized layers of each block, in forward order."""

    def layers(self) -> list[QLayer]:
        return [q for blk in self.blocks() for q in blk]

    @abc.abstractmethod
    def logits(self, ids: torch.Tensor | None = None, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (N, T, vocab) of token ids (N, T), or of input embeddings (N, T, d)."""

    @abc.abstractmethod
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings of token ids (what `logits(embeds=...)` takes)."""

    @abc.abstractmethod
    def block_passes(self, windows: torch.Tensor, chunk: int, device: str) -> Iterator[tuple[list[QLayer], Callable]]:
        """Per block: (its layers, run(before_chunk)) where run feeds every chunk of calibration windows through
        the FP model far enough for the block's Linears to see their inputs, calling before_chunk(i) first."""

    def with_weights(self, outputs: dict) -> "Adapter":
        """A copy whose quantized layers hold `outputs[name]["W_hat"]`."""
        new = copy.copy(self)
        new.model = copy.deepcopy(self.model)
        for q in new.layers():
            if q.name in outputs:
                q.set_W(outputs[q.name]["W_hat"])
        return new

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Every tensor of the checkpoint, detached on the CPU (tied tensors appear once)."""

    def prepare_data(self, data):
        """The calibration text as the model's token ids (bytes for a byte-level model)."""
        return data

    @abc.abstractmethod
    def write_dequantized(self, path: Path, record: dict, source_dir=None) -> None:
        """This model as a checkpoint in the input's format at `path` (a new folder), atomically."""


class DecoderAdapter(Adapter):
    """`icmltools.nn.DecoderStack`: the Linears `attn.qkv` (q, k, v fused), `attn.out`, `mlp.gate_up` (gate, up
    fused) and `mlp.down` of every block; embeddings, norms and head stay FP."""

    kind = "icml-fope-train"
    PARTS = {"attn.qkv": 3, "mlp.gate_up": 2}

    def __init__(self, model):
        self.model = model

    def blocks(self) -> list[list[QLayer]]:
        return [[QLayer(f"blocks.{i}.{n}", block.get_submodule(n), self.PARTS.get(n, 1)) for n in LAYER_NAMES]
                for i, block in enumerate(self.model.blocks)]

    def logits(self, ids=None, embeds=None):
        return self.model(ids) if embeds is None else self.model(embeds=embeds)

    def embed(self, ids):
        return self.model.embed(ids)

    def block_passes(self, windows, chunk, device):
        """Hidden states propagated block by block through the FP model (official `activations.py`)."""
        h = torch.cat([self.model.embed(windows[i:i + chunk, :-1].to(device)) for i in range(0, windows.shape[0], chunk)])
        for layers, block in zip(self.blocks(), self.model.blocks):
            def run(before_chunk, block=block):
                for i in range(0, h.shape[0], chunk):
                    before_chunk(i)
                    h[i:i + chunk] = block(h[i:i + chunk])
            yield layers, run

    def state_dict(self) -> dict:
        state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        if self.model.head is not None and self.model.cfg.tie_weights:
            state.pop("head.weight", None)
        return state

    def write_dequantized(self, path: Path, record: dict, source_dir=None) -> None:
        """`model.safetensors` through the icmltools.taskvec writers, plus the source's config.json so
        fope-train's loader reads the folder."""
        from icmltools.core.jsonio import atomic_write_json
        from icmltools.taskvec import write_state_dict

        write_state_dict(self.state_dict(), path / "model.safetensors", record=record)
        if source_dir is not None and (Path(source_dir) / "config.json").is_file():
            atomic_write_json(path / "config.json", json.loads((Path(source_dir) / "config.json").read_text()))
