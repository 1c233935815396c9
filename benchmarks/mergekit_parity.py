"""`icml cabs-merge --config` against mergekit itself, on the same mergekit files (issue 13: "output differences
explained").

    python benchmarks/mergekit_parity.py --mergekit /tmp/mkvenv/bin/python

mergekit goes in its own venv (`python -m venv --system-site-packages /tmp/mkvenv && /tmp/mkvenv/bin/pip install
mergekit==0.1.5`: the CPU torch already installed is reused). A small Llama model (float32 Hugging Face folders:
base + 3 fine-tuned variants, 4 layers, one word-level tokenizer; sizes below) is generated in a temporary
folder; every config below is run by `mergekit-yaml` and by `icml cabs-merge --config` (one thread), and the
outputs are compared tensor by tensor.
Each config says what to expect: `bitwise` (the same bytes), or why they differ (DARE's random masks come from
different generators; a bfloat16 `dtype` makes mergekit compute in bfloat16 where we compute in float32). Where
the masks are random, the merged task vectors' L1 norms are compared instead (`l1_ratio`, ours / mergekit's over
the whole model: a rescale applied on one side only would put it near 1/density or density). A second family of
models (`q_base`, `q0`..`q2`) holds bfloat16 values in float32 files, as a bf16 checkpoint read in float32, with
fine-tuning deltas of a few bf16 steps: there weighted sums of the task vectors are often exactly 0 (mergekit
elects + there, and so does a config here: the option elect_zero) and many magnitudes are equal at a top-k
threshold; `zero_sum_positive` counts the differing elements where ours is the base and mergekit's above it (what
the other election would leave). Prints one JSON document; `as_expected` is false if a `bitwise` config differs
or an `l1_ratio` is off 1 by more than 5 %.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HID, FFN, VOCAB, LAYERS = 32, 80, 64, 4
MODELS = ("m0", "m1", "m2")
RANDOM_MASKS = ("differs: DARE's random masks (mergekit: torch.bernoulli on the global generator; ours: a stream per "
                "tensor and model from the seed); mergekit rescales to the L1 norm where we divide by the density: "
                "the L1 norms agree")

PER_TENSOR_TIES = """merge_method: ties
base_model: base
models:
  - model: base
  - model: m0
    parameters:
      weight: [{filter: mlp, value: 0.5}, {value: [0.25, 1.0]}]
      density: 0.5
  - model: m1
    parameters:
      weight: 0.75
      density: [{filter: self_attn, value: [0.25, 0.75, 0.5]}]
  - model: m2
    parameters:
      weight: [0.5, 1.5]
parameters:
  density: [{filter: layernorm, value: 0.75}, {value: 0.625}]
  normalize: true
  int8_mask: true
dtype: float32
"""


def _plain(method: str, params: str, top: str = "", dtype: str = "float32") -> str:
    models = "".join(f"  - model: {m}\n    parameters: {{{params.format(w=w)}}}\n"
                     for m, w in zip(MODELS, (0.5, 0.75, 1.0)))
    return (f"merge_method: {method}\nbase_model: base\nmodels:\n{models}"
            + (f"parameters: {{{top}}}\n" if top else "") + f"dtype: {dtype}\n")


def _q(method: str, params: str) -> str:
    """A config over the bf16-valued models (equal weights: exact zero sums are common)."""
    return _plain(method, params).replace("base_model: base", "base_model: q_base").replace("model: m", "model: q")


CONFIGS = {   # name -> (config, what to expect)
    "task_arithmetic": (_plain("task_arithmetic", "weight: {w}"), "bitwise"),
    "task_arithmetic_normalize": (_plain("task_arithmetic", "weight: {w}", "normalize: true"), "bitwise"),
    "ties": (_plain("ties", "weight: {w}, density: 0.5"), "bitwise"),
    "ties_no_normalize": (_plain("ties", "weight: {w}, density: 0.5", "normalize: false"), "bitwise"),
    "ties_density_0.02": (_plain("ties", "weight: {w}, density: 0.02"), "bitwise"),
    "ties_lambda_0.5": (_plain("ties", "weight: {w}, density: 0.5", "lambda: 0.5"), "bitwise"),
    "task_arithmetic_normalize_lambda_1.5": (_plain("task_arithmetic", "weight: {w}", "normalize: true, lambda: 1.5"),
                                             "bitwise"),
    "breadcrumbs": (_plain("breadcrumbs", "weight: {w}, density: 0.5", "gamma: 0.05"), "bitwise"),
    "breadcrumbs_normalize": (_plain("breadcrumbs", "weight: {w}, density: 0.5", "gamma: 0.05, normalize: true"),
                              "bitwise"),
    "breadcrumbs_ties": (_plain("breadcrumbs_ties", "weight: {w}, density: 0.5", "gamma: 0.05"), "bitwise"),
    "breadcrumbs_ties_normalize": (
        _plain("breadcrumbs_ties", "weight: {w}, density: 0.5", "gamma: 0.05, normalize: true"), "bitwise"),
    "dare_linear_density_1_normalize": (_plain("dare_linear", "weight: {w}, density: 1.0", "normalize: true"),
                                        "bitwise"),
    "dare_ties_density_1": (_plain("dare_ties", "weight: {w}, density: 1.0"), "bitwise"),
    "per_tensor_ties": (PER_TENSOR_TIES, "bitwise"),
    "per_tensor_task_arithmetic": (
        "merge_method: task_arithmetic\nbase_model: base\nmodels:\n"
        "  - model: m0\n    parameters: {weight: [{filter: self_attn, value: [0.0, 0.5, 1.0]}, {value: 0.25}]}\n"
        "  - model: m1\n    parameters: {weight: [1.0, 0.5]}\n"
        "  - model: m2\nparameters: {weight: [{filter: mlp, value: 0.125}, {value: 0.75}], normalize: true}\n"
        "dtype: float32\n", "bitwise"),
    "ties_tokenizer_source_base": (_plain("ties", "weight: {w}, density: 0.5") + "tokenizer_source: base\n",
                                   "bitwise"),
    "task_arithmetic_tokenizer_source_union": (_plain("task_arithmetic", "weight: {w}") + "tokenizer_source: union\n",
                                               "bitwise"),
    "task_arithmetic_bfloat16_dtype": (_plain("task_arithmetic", "weight: {w}", dtype="bfloat16"),
                                       "differs: mergekit computes in the config's bfloat16, we in float32 (one "
                                       "cast): roundings"),
    "ties_bfloat16_dtype": (_plain("ties", "weight: {w}, density: 0.5", dtype="bfloat16"),
                            "differs: mergekit's task vectors are bfloat16 before its top-k and sign election, ours "
                            "float32: other elements are kept at the threshold"),
    "dare_ties_density_0.5": (_plain("dare_ties", "weight: {w}, density: 0.5"), RANDOM_MASKS),
    "dare_linear_density_0.5": (_plain("dare_linear", "weight: {w}, density: 0.5"), RANDOM_MASKS),
    "dare_linear_rescale_false": (_plain("dare_linear", "weight: {w}, density: 0.5", "rescale: false"), RANDOM_MASKS),
    "ties_density_0_for_one": (_plain("ties", "weight: {w}, density: 0.5").replace(
        "weight: 0.75, density: 0.5", "weight: 0.75, density: 0.0"), "bitwise"),
    "dare_linear_densities_1_and_0_normalize": (_plain("dare_linear", "weight: {w}, density: 1.0", "normalize: true")
                                                .replace("weight: 0.75, density: 1.0", "weight: 0.75, density: 0.0"),
                                                "bitwise"),
    "ties_mlp_weight_0_everywhere": (_plain("ties", "weight: [{{filter: mlp, value: 0.0}}, {{value: {w}}}], "
                                                    "density: 0.5"), "bitwise"),
    "ties_negative_weight": (_plain("ties", "weight: {w}, density: 0.5").replace("weight: 0.75,", "weight: -0.75,"),
                             "bitwise"),
    "task_arithmetic_weights_summing_to_0_normalize": (
        _plain("task_arithmetic", "weight: {w}", "normalize: true").replace("weight: 1.0", "weight: -1.25"), "bitwise"),
    "dare_ties_density_1_negative_weight_normalize": (
        _plain("dare_ties", "weight: {w}, density: 1.0", "normalize: true").replace("weight: 0.5,", "weight: -0.5,"),
        "bitwise"),
    "ties_density_1": (_plain("ties", "weight: {w}, density: 1.0"), "bitwise"),
    "ties_top_level_parameters_only": ("merge_method: ties\nbase_model: base\nmodels:\n  - model: m0\n  - model: m1\n"
                                       "  - model: m2\nparameters: {weight: 0.5, density: 0.3}\ndtype: float32\n",
                                       "bitwise"),
    "breadcrumbs_gamma_0": (_plain("breadcrumbs", "weight: {w}, density: 0.5", "gamma: 0.0"), "bitwise"),
    "breadcrumbs_density_plus_gamma_over_1": (_plain("breadcrumbs", "weight: {w}, density: 0.9", "gamma: 0.2"),
                                              "bitwise"),
    "breadcrumbs_ties_density_gradient": (_plain("breadcrumbs_ties", "weight: {w}, density: [0.2, 0.9]", "gamma: 0.1"),
                                          "bitwise"),
    "per_tensor_ties_lambda": (PER_TENSOR_TIES.replace("  int8_mask: true\n", "  int8_mask: true\n  lambda: 0.75\n"),
                               "bitwise"),
    "ties_out_dtype_bfloat16": (_plain("ties", "weight: {w}, density: 0.5") + "out_dtype: bfloat16\n", "bitwise"),
    "task_arithmetic_float16_dtype": (_plain("task_arithmetic", "weight: {w}", dtype="float16"),
                                      "differs: mergekit computes in the config's float16, we in float32 (one cast): "
                                      "roundings"),
    "task_arithmetic_bf16_values": (_q("task_arithmetic", "weight: 1.0"), "bitwise"),
    "ties_bf16_values_density_1": (_q("ties", "weight: 1.0, density: 1.0"), "bitwise"),
    "dare_ties_bf16_values_density_1": (_q("dare_ties", "weight: 1.0, density: 1.0"), "bitwise"),
    "breadcrumbs_ties_bf16_values_density_1": (_q("breadcrumbs_ties", "weight: 1.0, density: 1.0"), "bitwise"),
    "ties_bf16_values_density_0.5": (_q("ties", "weight: 1.0, density: 0.5"),
                                     "differs: among equal magnitudes at the top-k threshold mergekit keeps those "
                                     "torch.argsort (not stable) puts first, we the lower indices"),
}


def generate(folder: Path) -> None:
    import torch

    from icmltools.taskvec import write_state_dict

    g = torch.Generator().manual_seed(1)
    base = {"model.embed_tokens.weight": torch.randn(VOCAB, HID, generator=g),
            "model.norm.weight": torch.randn(HID, generator=g), "lm_head.weight": torch.randn(VOCAB, HID, generator=g)}
    for i in range(LAYERS):
        for p in ("q", "k", "v", "o"):
            base[f"model.layers.{i}.self_attn.{p}_proj.weight"] = torch.randn(HID, HID, generator=g)
        for p, shape in (("gate", (FFN, HID)), ("up", (FFN, HID)), ("down", (HID, FFN))):
            base[f"model.layers.{i}.mlp.{p}_proj.weight"] = torch.randn(shape, generator=g)
        for p in ("input_layernorm", "post_attention_layernorm"):
            base[f"model.layers.{i}.{p}.weight"] = torch.randn(HID, generator=g)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HID,
              "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": VOCAB, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 64, "torch_dtype": "float32"}
    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, VOCAB)}}   # a word-level tokenizer of VOCAB tokens
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
                 "added_tokens": [{"id": 0, "content": "<unk>", "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True}],
                 "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    for name in ("base",) + MODELS:
        sd = base if name == "base" else {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in base.items()}
        write_state_dict(sd, folder / name, fmt="hf_safetensors")
        (folder / name / "config.json").write_text(json.dumps(config))
        (folder / name / "tokenizer.json").write_text(json.dumps(tokenizer))
        (folder / name / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"}))
    q = {k: v.bfloat16().float() for k, v in base.items()}   # bf16 values, a few bf16 steps of fine-tuning
    for name in ("q_base",) + tuple(f"q{i}" for i in range(len(MODELS))):
        sd = q if name == "q_base" else {k: (v + 0.01 * torch.randn(v.shape, generator=g)).bfloat16().float()
                                         for k, v in q.items()}
        write_state_dict(sd, folder / name, fmt="hf_safetensors")
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (folder / name / f).write_text((folder / "base" / f).read_text())


def _load(folder: Path) -> dict:
    from icmltools.taskvec import open_checkpoint

    r = open_checkpoint(folder)
    return {k: r.get(k) for k in r.keys()}


def compare(a: dict, b: dict, base: dict) -> dict:
    """mergekit's output `a` against ours `b`; l1_ratio: |b - base|_1 / |a - base|_1 over every tensor."""
    import torch

    if set(a) != set(b):
        return {"error": f"tensor names differ: {sorted(set(a) ^ set(b))[:5]}"}
    n_diff = sum(int((a[k] != b[k]).sum()) for k in a)
    numel = sum(a[k].numel() for k in a)
    l1 = [sum(float((x[k].double() - base[k].double()).abs().sum()) for k in a) for x in (a, b)]
    zero_sum = sum(int(((a[k] != b[k]) & (b[k] == base[k]) & (a[k] > base[k])).sum()) for k in a)
    return {"n_tensors": len(a), "tensors_equal": sum(torch.equal(a[k], b[k]) for k in a),
            "elements_differing": n_diff / numel, "n_differing": n_diff, "zero_sum_positive": zero_sum,
            "max_abs_diff": max(float((a[k].float() - b[k].float()).abs().max()) for k in a),
            "l1_ratio": round(l1[1] / l1[0], 4) if l1[0] else None}


def run(folder: Path, mergekit_python: str, name: str, text: str) -> dict:
    cfg = folder / f"{name}.yml"
    cfg.write_text(text)
    mk_out, ours = folder / f"mk_{name}", folder / f"ours_{name}"
    script = Path(mergekit_python).parent / "mergekit-yaml"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([str(script), str(cfg), str(mk_out), "--lazy-unpickle", "--no-copy-tokenizer",
                        "--no-write-model-card"], cwd=folder,
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"error": "mergekit: " + ([ln for ln in p.stderr.splitlines() if ln.strip()] or ["?"])[-1][:300]}
    p = subprocess.run([sys.executable, "-m", "icmltools", "cabs-merge", "-q", "--threads", "1", "--config", str(cfg),
                        "--out", str(ours)], cwd=folder, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": "ours: " + p.stderr.strip()[-300:]}
    out = json.loads(p.stdout)["result"]["output"]
    base = re.search(r"^base_model: (\S+)$", text, re.M).group(1)
    return compare(_load(mk_out), _load(Path(out)), _load(folder / base))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mergekit", required=True, metavar="PYTHON", help="python of a venv with mergekit 0.1.5")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names (default: all)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and keep it (default: a temp folder)")
    a = ap.parse_args(argv)
    p = subprocess.run([a.mergekit, "-c", "import importlib.metadata as m; print(m.version('mergekit'))"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(f"error: {a.mergekit}: mergekit not importable", file=sys.stderr)
        return 2
    folder = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="mkparity_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        generate(folder)
        rows = {}
        for name in a.configs.split(","):
            text, expect = CONFIGS[name]
            rows[name] = {"expect": expect, **run(folder, a.mergekit, name, text)}
            print(f"{name}: {rows[name]}", file=sys.stderr, flush=True)
        ok = all("error" not in r and (r["expect"] != "bitwise" or r["tensors_equal"] == r["n_tensors"])
                 and (r["expect"] != RANDOM_MASKS or abs(r["l1_ratio"] - 1) <= 0.05) for r in rows.values())
        doc = {"mergekit_version": p.stdout.strip(), "model": {"hidden": HID, "ffn": FFN, "vocab": VOCAB,
                                                               "layers": LAYERS, "dtype": "float32"},
               "configs": rows, "as_expected": ok}
        print(json.dumps(doc, indent=2))
        return 0 if ok else 1
    finally:
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
