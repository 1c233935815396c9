"""Hugging Face causal LMs for guidedquant, through the optional `transformers` (imported here only, from local
files only: `local_files_only=True`, a folder path, never a hub id, nothing downloaded).

Architectures (by `model_type` in config.json): Llama-style decoders with separate projections
(`llama`, `mistral`, `qwen2`: `self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj` of every
`model.layers[i]`) and `gpt2` (`attn.c_attn` with q, k, v fused, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj` of
every `transformer.h[i]`; GPT-2's Conv1D stores the weight as (d_in, d_out): it is quantized as the
(d_out, d_in) matrix W = weight^T and written back transposed). Embeddings, norms and the head stay FP
(official). The calibration text is tokenized with the folder's own tokenizer.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError

from .adapters import Adapter, QLayer

_LLAMA = ("model.layers", (("self_attn.q_proj", 1), ("self_attn.k_proj", 1), ("self_attn.v_proj", 1),
                           ("self_attn.o_proj", 1), ("mlp.gate_proj", 1), ("mlp.up_proj", 1), ("mlp.down_proj", 1)),
          False)
# model_type -> (blocks' module path, ((layer, fused projections), ...), weights stored transposed)
SUPPORTED = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "gpt2": ("transformer.h", (("attn.c_attn", 3), ("attn.c_proj", 1), ("mlp.c_fc", 1), ("mlp.c_proj", 1)), True),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def architecture(path: Path) -> tuple[str, str]:
    """(model_type, architectures as written) of a Hugging Face folder; unsupported ones are refused."""
    doc = json.loads((path / "config.json").read_text())
    mt = str(doc.get("model_type"))
    archs = [str(a) for a in (doc.get("architectures") or [])]
    arch = ",".join(archs) or mt
    causal = all(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs)
    if mt not in SUPPORTED or not causal:
        raise BadInputError(f"{path}: unsupported architecture {arch} (supported: Hugging Face causal LMs of type "
                            f"{', '.join(SUPPORTED)})", param="model")
    return mt, arch


def load(path: Path, device: str) -> tuple["HFAdapter", dict]:
    """(adapter, description) of a Hugging Face causal-LM folder, loaded in float32 from local files only."""
    mt, arch = architecture(path)
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise BadInputError(f"{path}: no tokenizer in the folder ({', '.join(TOKENIZER_FILES)}); the calibration "
                            "text is tokenized with the model's own tokenizer", param="model")
    try:
        import transformers
    except ImportError:
        raise BadInputError(f"{path}: a Hugging Face model needs the optional transformers package "
                            "(pip install 'icml-tools[hf]')", param="model") from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise BadInputError(f"{path}: transformers could not load it ({type(e).__name__}: {first})",
                            param="model") from None
    model = model.float().to(device).eval()
    ad = HFAdapter(model, tok, path, mt)
    return ad, {"source": str(path), "format": "hf", "model_type": mt, "architectures": arch,
                "params": int(sum(p.numel() for p in model.parameters())), "tokenizer": type(tok).__name__,
                "quantized_layers": len(ad.layers())}


class _Stop(Exception):
    """Raised by a forward hook to end a pass once the block of interest has run."""


class HFAdapter(Adapter):
    kind = "hf"

    def __init__(self, model, tokenizer, source: Path, model_type: str):
        self.model, self.tokenizer, self.source, self.model_type = model, tokenizer, Path(source), model_type
        self.blocks_path, self.names, self.transposed = SUPPORTED[model_type]
        cfg = model.config
        self.max_len = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    def _block_modules(self):
        return list(self.model.get_submodule(self.blocks_path))

    def blocks(self) -> list[list[QLayer]]:
        return [[QLayer(f"{self.blocks_path}.{i}.{n}", blk.get_submodule(n), parts, self.transposed)
                 for n, parts in self.names] for i, blk in enumerate(self._block_modules())]

    def logits(self, ids=None, embeds=None):
        if embeds is None:
            return self.model(input_ids=ids, use_cache=False).logits
        return self.model(inputs_embeds=embeds, use_cache=False).logits

    def embed(self, ids):
        return self.model.get_input_embeddings()(ids)

    def block_passes(self, windows, chunk, device):
        """Each block's inputs from full FP forward passes stopped after that block (memory: one chunk's
        activations; compute: blocks 0..i for block i)."""
        for layers, block in zip(self.blocks(), self._block_modules()):
            def run(before_chunk, block=block):
                def stop(mod, inp, out):
                    raise _Stop
                handle = block.register_forward_hook(stop)
                try:
                    for i in range(0, windows.shape[0], chunk):
                        before_chunk(i)
                        with contextlib.suppress(_Stop):
                            self.model(input_ids=windows[i:i + chunk, :-1].to(device), use_cache=False)
                finally:
                    handle.remove()
            yield layers, run

    def state_dict(self) -> dict:
        out, seen = {}, set()
        for k, v in self.model.state_dict().items():
            key = (v.data_ptr(), tuple(v.shape))
            if key not in seen:                 # tied tensors (embedding = head) appear once
                seen.add(key)
                out[k] = v.detach().cpu()
        return out

    def prepare_data(self, data):
        """Both splits of the text tokenized with the folder's tokenizer (no special tokens added)."""
        from icmltools.fope.data import TextData

        def ids(split) -> np.ndarray:
            text = split.tobytes().decode("utf-8", errors="replace")
            return np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

        tr, va = ids(data.train), ids(data.val)
        n_emb = self.model.get_input_embeddings().num_embeddings
        if max(int(tr.max(initial=0)), int(va.max(initial=0))) >= n_emb:
            raise BadInputError(f"{self.source}: the tokenizer gives ids beyond the model's {n_emb} embeddings",
                                param="model")
        info = {**data.info, "unit": "tokens", "tokenizer": type(self.tokenizer).__name__,
                "train_tokens": int(tr.size), "val_tokens": int(va.size)}
        return TextData(tr, va, info, vocab_size=len(self.tokenizer))

    def write_dequantized(self, path: Path, record: dict, source_dir=None) -> None:
        """A Hugging Face folder like the input (same tensor names, dtypes and shards; config, tokenizer and the
        other small files copied) through the icmltools.taskvec writers: `from_pretrained` loads it."""
        from icmltools.taskvec.readers import open_checkpoint
        from icmltools.taskvec.writers import CheckpointWriter

        base = open_checkpoint(self.source)
        state = self.model.state_dict()
        prefix = getattr(self.model, "base_model_prefix", "")
        with CheckpointWriter(base, path, fmt="same", record=record) as w:
            for n in w.order:
                t = state.get(n, state.get(f"{prefix}.{n}"))
                if t is None:
                    raise BadInputError(f"{self.source}: tensor {n} of the checkpoint is not in the loaded model",
                                        param="model")
                w.write(n, t.detach().cpu().to(base.specs[n].dtype).contiguous())
