"""Benchmark of the shared merge engine (issue 13): every method on base + N models, each method in a fresh process.

    python benchmarks/merge_engine.py                  # base + 4 models of ~1 GB each, bf16 (spec's layout)
    python benchmarks/merge_engine.py --gb 0.25 --n 4 --methods ties,task_arithmetic
    python benchmarks/merge_engine.py --mergekit /tmp/mkvenv/bin/python   # also mergekit 0.1.5 on the HF folders

The models are generated in a temporary folder (removed at the end): a Llama-like layout (embedding and head
32000 x 2048, blocks of 4 x 2048^2 + 3 x 2048 x 5632, the number of blocks chosen for --gb) in bfloat16, written
both as single .safetensors files and as Hugging Face sharded folders. For each layout: a plain read of the same
files through the same reader (the floor, one thread; run twice, the second timed, so the files are in the page
cache), then every method (task vector merge written to disk), each in a fresh process with --threads threads
(default: every core): seconds, GB/s of checkpoint read (the bytes of base + models, once), peak RSS
(VmHWM) minus the process's RSS after its imports, and the ratio to the plain read (the target); the deletion of
the output afterwards is not timed (it was until 2026-12-02: 0.07-0.2 s of each merge). For context a
second floor, `read_write`: the same read plus writing one model-sized output through the same writer (what every
merge must also do), and each method's ratio to it. `kernels_load_seconds`: numba's import and first cached loop
(once per process, inside `seconds`); `ratio_to_read_after_load` leaves it out (context: a process that merges
more than once pays it once). `numba_512_bit`: whether the merge's loops were compiled with 512-bit vectors
preferred (AVX-512 hosts from Ice Lake on: `core.device.numba_wide_vectors`). `transparent_hugepage`: the
kernel's THP mode (the engine's large buffers ask for huge pages, which "madvise" and "always" serve; "never" and
None: plain pages, more page faults for the one-pass top-k methods' whole tensors).
`free_page_reporting_order`: where not None, the kernel hands free blocks of that order and larger to its
hypervisor, and at 9 or below the engine's buffers other than the output slots take plain pages instead
(`engine._huge_blocks_reported`; the slots keep huge pages for the writer's O_DIRECT).
`--repeat R` runs R rounds over every row and keeps each row's fastest run (a shared host's noise only slows a
run; every run's seconds are listed). Prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB, HID, FFN = 32000, 2048, 5632
METHODS = ("task_arithmetic", "magnitude", "dare", "ties", "dare_ties", "breadcrumbs", "negmerge", "uniform",
           "magmax")
RSS_TARGET_GB, RATIO_TARGET = 2.5, 0.5


def layout(gb: float, norms: bool = True) -> list[tuple[str, tuple]]:
    """Tensor names and shapes of a Llama-layout model of about `gb` GB in bf16 (at least one block); without
    `norms` only the matrices (the CABS spec's layout, benchmarks/cabs_merge.py)."""
    block = 4 * HID * HID + 3 * HID * FFN + 2 * HID * norms
    fixed = 2 * VOCAB * HID + HID * norms
    n_blocks = max(1, round((gb * 1e9 / 2 - fixed) / block))
    out = [("model.embed_tokens.weight", (VOCAB, HID))]
    for b in range(n_blocks):
        p = f"model.layers.{b}."
        out += [(p + f"self_attn.{x}_proj.weight", (HID, HID)) for x in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (FFN, HID)), (p + "mlp.up_proj.weight", (FFN, HID)),
                (p + "mlp.down_proj.weight", (HID, FFN))]
        if norms:
            out += [(p + "input_layernorm.weight", (HID,)), (p + "post_attention_layernorm.weight", (HID,))]
    return out + [("model.norm.weight", (HID,))] * norms + [("lm_head.weight", (VOCAB, HID))]


def generate(folder: Path, gb: float, n: int) -> dict:
    """base + n models (base + small noise), each as model_i.safetensors and hf_i/ (about 4 shards)."""
    import torch

    from icmltools.core.seed import derive
    from icmltools.taskvec import write_state_dict

    names = layout(gb)
    sizes = [s[0] * (s[1] if len(s) > 1 else 1) * 2 for _, s in names]
    per_shard = sum(sizes) / 4
    shards, cur, acc = [], [], 0
    for (k, _), sz in zip(names, sizes):
        cur.append(k)
        acc += sz
        if acc >= per_shard:
            shards.append(cur)
            cur, acc = [], 0
    if cur:
        shards.append(cur)
    g = derive(0, "bench", "base").torch()
    base = {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in names}
    for i in range(n + 1):
        if i == 0:
            sd = base
        else:
            gi = derive(0, "bench", "model", i).torch()
            sd = {k: (v.float() + torch.randn(v.shape, generator=gi) * 0.002).to(torch.bfloat16) for k, v in base.items()}
        tag = "base" if i == 0 else f"m{i}"
        write_state_dict(sd, folder / f"{tag}.safetensors")
        write_state_dict(sd, folder / f"hf_{tag}", fmt="hf_safetensors", shards=shards)
        (folder / f"hf_{tag}" / "config.json").write_text(json.dumps(llama_config(len(names))))
        del sd
    return {"n_tensors": len(names), "bytes_per_model": sum(sizes), "n_shards": len(shards),
            "largest_tensor_elems": max(s[0] * (s[1] if len(s) > 1 else 1) for _, s in names)}


def llama_config(n_tensors: int) -> dict:
    """A Llama config.json matching the layout (mergekit reads the architecture from it)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HID,
            "intermediate_size": FFN, "num_hidden_layers": (n_tensors - 3) // 9, "num_attention_heads": 16,
            "num_key_value_heads": 16, "vocab_size": VOCAB, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


def _paths(folder: Path, fmt: str, n: int):
    if fmt == "safetensors":
        return folder / "base.safetensors", [folder / f"m{i}.safetensors" for i in range(1, n + 1)]
    return folder / "hf_base", [folder / f"hf_m{i}" for i in range(1, n + 1)]


def _vm(key: str) -> int:
    """VmRSS / VmHWM of this process in bytes. (ru_maxrss is not used: Linux folds the pre-exec parent's
    high-water mark into a child's ru_maxrss, so a child of a big parent reports the parent's peak.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def _selections() -> dict:
    """A scanning method's threshold selections: with every low histogram counted in the high pass (hit) or not,
    and the tensors whose thresholds were found in the merge's own pass (deferred: tried, found; CA-magnitude:
    ca_deferred), or in one scan over every model (CA-magnitude: ca_thresholds)."""
    from icmltools.merge import kernels as K

    extra = {}
    if sum(K.WINDOWS.values()):
        extra["selections"] = dict(K.WINDOWS)
    for key, counts in (("deferred", K.DEFERRED), ("ca_deferred", K.CA_DEFERRED), ("ca_thresholds", K.CA_THRESHOLDS)):
        if counts["tried"]:
            extra[key] = dict(counts)
    return extra


def child(mode: str, folder: Path, fmt: str, n: int, threads: int = 1, chunk_elems: int | None = None) -> dict:
    """One measurement in this fresh process: a plain read, or one method's merge to disk."""
    import torch

    import icmltools.cabs.methods  # noqa: F401  (registers cabs, bs, ca_magnitude)
    import icmltools.merge.methods  # noqa: F401
    from icmltools.core.device import numba_wide_vectors, set_threads
    from icmltools.merge import engine as E
    from icmltools.taskvec import CheckpointWriter, open_checkpoint

    set_threads(threads)  # torch, BLAS and the engine's compiled loops (numba)
    base_p, model_ps = _paths(folder, fmt, n)
    rss0 = _vm("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    load = 0.0
    if mode not in ("read", "read_write"):  # numba's import and first cached loop, timed apart (inside `seconds`)
        from icmltools.merge import kernels as K

        if K.available():
            K.count_nonzero(torch.ones(1))
        load = time.perf_counter() - t0
    base, models = open_checkpoint(base_p), [open_checkpoint(p) for p in model_ps]
    nbytes = base.nbytes * (1 + n)
    if mode == "read":
        buf = None
        for r in [base] + models:
            for name, spec in r.specs.items():
                if buf is None or buf.numel() < spec.numel:
                    buf = torch.empty(spec.numel, dtype=spec.dtype)
                r.get_into(name, buf[: spec.numel].view(spec.shape))
    elif mode == "read_write":  # the same read, and the base's tensors written as a merge writes its output
        out = folder / f"out_rw_{fmt}"
        out = out.with_suffix(".safetensors") if fmt == "safetensors" else out
        bufs: dict = {}
        with CheckpointWriter(base, out) as w:
            for r in models:
                for name, spec in r.specs.items():
                    b = bufs.setdefault("m", torch.empty(0, dtype=spec.dtype))
                    if b.numel() < spec.numel:
                        b = bufs["m"] = torch.empty(spec.numel, dtype=spec.dtype)
                    r.get_into(name, b[: spec.numel].view(spec.shape))
            for name in w.order:
                spec = base.specs[name]
                b = bufs.setdefault("b", torch.empty(0, dtype=spec.dtype))
                if b.numel() < spec.numel:
                    b = bufs["b"] = torch.empty(spec.numel, dtype=spec.dtype)
                w.write(name, base.get_into(name, b[: spec.numel].view(spec.shape)))
    else:
        out = folder / f"out_{mode}_{fmt}"
        out = out.with_suffix(".safetensors") if fmt == "safetensors" else out
        kw = {} if chunk_elems is None else {"chunk_elems": chunk_elems}  # None: the engine's default
        E.merge_to_checkpoint(base, models, E.make_plan(mode, n, **kw), 1.0, out)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    extra = {} if mode in ("read", "read_write") else {**_selections(), "numba_512_bit": numba_wide_vectors()}
    if mode != "read":  # the benchmark's own clean-up, not timed (deleting a 1 GB file took 0.07-0.2 s here)
        shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink()
        Path(str(out) + ".json").unlink(missing_ok=True)
    peak = _vm("VmHWM")
    return {"seconds": round(dt, 2), "cpu_seconds": round(cpu, 2), "bytes": nbytes, "gb_per_s": round(nbytes / 1e9 / dt, 3),
            "peak_rss_gb": round((peak - rss0) / 1e9, 3), "import_rss_gb": round(rss0 / 1e9, 3),
            "peak_rss_total_gb": round(peak / 1e9, 3), "kernels_load_seconds": round(load, 2), **extra}


def fresh_memory_rate(gb: float = 0.5) -> float:
    """GB/s at which this machine hands out memory never touched before (context: on a VM whose host backs
    guest memory lazily this is far below the memory bandwidth and varies from run to run; every merge's
    fresh buffers and page-cache pages pay it, a plain read of cached files does not)."""
    import numpy as np

    t0 = time.perf_counter()
    a = np.ones(int(gb * 1e9) // 8)
    dt = time.perf_counter() - t0
    del a
    return round(gb / dt, 2)


def _engine_chunk() -> int:
    from icmltools.merge.options import CHUNK_ELEMS  # standard library only

    return CHUNK_ELEMS


def _run_child(args: list[str], threads: int = 1, chunk_elems: int | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    extra = [] if chunk_elems is None else ["--chunk-elems", str(chunk_elems)]
    p = subprocess.run([sys.executable, __file__, "--child", *args, "--threads", str(threads), *extra],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(p.stdout)


MERGEKIT_YAML = """merge_method: {method}
base_model: {base}
models:
{models}
dtype: bfloat16
"""


def mergekit(python: str, folder: Path, n: int, method: str) -> dict:
    """mergekit-yaml (the venv's) on the HF folders: wall time and peak RSS of the whole process tree (GNU time)."""
    base, models = _paths(folder, "hf", n)
    params = "    parameters: {weight: 1.0}" if method == "task_arithmetic" else \
        "    parameters: {weight: 1.0, density: 0.2}"
    cfg = folder / f"mk_{method}.yml"
    cfg.write_text(MERGEKIT_YAML.format(method=method, base=base, models="\n".join(
        f"  - model: {m}\n{params}" for m in models)))
    out = folder / f"mk_out_{method}"
    script = Path(python).parent / "mergekit-yaml"
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", str(script), str(cfg), str(out), "--lazy-unpickle",
                        "--no-copy-tokenizer"],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": ([ln for ln in p.stderr.strip().splitlines()[:-1] if ln.strip()] or ["?"])[-1][:300]}
    peak_kb = int(p.stderr.strip().splitlines()[-1])
    nbytes = sum(f.stat().st_size for d in [base] + models for f in Path(d).glob("*.safetensors"))
    res = {"seconds": round(dt, 2), "gb_per_s": round(nbytes / 1e9 / dt, 3), "peak_rss_gb": round(peak_kb * 1024 / 1e9, 3),
           "output": str(out)}
    return res


def _compare_mergekit(folder: Path, n: int, method: str, mk_out: Path) -> dict:
    """Our merge (same method, density 0.2) against mergekit's output: max |difference| and fraction differing."""

    from icmltools.merge import engine as E
    from icmltools.taskvec import open_checkpoint

    base_p, model_ps = _paths(folder, "hf", n)
    ours = folder / f"ours_{method}.safetensors"
    E.merge_to_checkpoint(open_checkpoint(base_p), [open_checkpoint(p) for p in model_ps],
                          E.make_plan(method, n, densities=[0.2] if method == "ties" else None), 1.0, ours,
                          fmt="safetensors")
    a, b = open_checkpoint(ours), open_checkpoint(mk_out)
    worst, differ, total = 0.0, 0, 0
    for k in a.keys():
        x, y = a.get(k).float(), b.get(k).float()
        worst = max(worst, float((x - y).abs().max()))
        differ += int((x != y).sum())
        total += x.numel()
    ours.unlink()
    return {"max_abs_diff": worst, "fraction_differing": differ / total}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of each model in GB (bf16)")
    ap.add_argument("--n", type=int, default=4, help="models besides the base")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--formats", default="safetensors,hf")
    ap.add_argument("--tmp", default=None, help="folder for the generated models (default: a temp dir)")
    ap.add_argument("--data", default=None, help="reuse models generated there with the same --gb/--n (kept)")
    ap.add_argument("--mergekit", default=None, metavar="PYTHON", help="python of a venv with mergekit 0.1.5")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of each merge (torch, BLAS, the compiled loops); the plain read is one thread")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over every row; each row keeps its fastest run (all runs' seconds are listed)")
    ap.add_argument("--chunk-elems", type=int, default=None,
                    help="elements per chunk of the merges (default: the engine's, CHUNK_ELEMS)")
    ap.add_argument("--child", nargs=4, metavar=("MODE", "FOLDER", "FMT", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        mode, folder, fmt, n = a.child
        if mode == "generate":
            print(json.dumps(generate(Path(folder), float(fmt), int(n))))
        else:
            print(json.dumps(child(mode, Path(folder), fmt, int(n), a.threads, a.chunk_elems)))
        return
    if a.chunk_elems is not None and a.chunk_elems < 1:
        ap.error("--chunk-elems must be >= 1")
    folder = Path(a.data) if a.data else Path(tempfile.mkdtemp(prefix="merge_engine_bench_", dir=a.tmp))
    from icmltools.core.envinfo import free_page_reporting, thp_mode  # standard library only

    doc: dict = {"gb": a.gb, "n_models": a.n, "threads": a.threads, "read_threads": 1,
                 "chunk_elems": a.chunk_elems or _engine_chunk(),
                 "targets": {"peak_rss_gb_below": RSS_TARGET_GB, "ratio_to_read_at_least": RATIO_TARGET},
                 "fresh_memory_gb_per_s": fresh_memory_rate(), "transparent_hugepage": thp_mode(),
                 "free_page_reporting_order": free_page_reporting()}
    try:
        if not a.data:
            t0 = time.perf_counter()
            doc["layout"] = _run_child(["generate", str(folder), str(a.gb), str(a.n)])
            doc["generate_seconds"] = round(time.perf_counter() - t0, 1)
        doc["results"] = {fmt: _measure_format(folder, fmt, a) for fmt in a.formats.split(",")}
        if a.mergekit:
            doc["mergekit"] = _mergekit_all(a.mergekit, folder, a.n, doc["results"].get("hf", {}))
    finally:
        if not a.data:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(doc, indent=1))


def _best(runs: list[dict]) -> dict:
    """The fastest of a row's runs, with every run's seconds (a shared host's noise only ever slows a run)."""
    ok = [r for r in runs if "seconds" in r]
    if not ok:
        return runs[-1]
    best = dict(min(ok, key=lambda r: r["seconds"]))
    if len(runs) > 1:
        best["runs_seconds"] = [r.get("seconds") for r in runs]
    return best


def _measure_format(folder: Path, fmt: str, a) -> dict:
    _run_child(["read", str(folder), fmt, str(a.n)])  # warm the page cache: the floor is a read of cached files
    modes = ["read", "read_write"] + a.methods.split(",")  # the floors one thread, the merges --threads
    runs: dict = {m: [] for m in modes}
    for _ in range(max(1, a.repeat)):  # rounds over every row, so each row sees the same spread of noise
        for m in modes:
            r = _run_child([m, str(folder), fmt, str(a.n)], 1 if m in ("read", "read_write") else a.threads,
                           None if m in ("read", "read_write") else a.chunk_elems)
            runs[m].append(r)
            print(f"{fmt} {m}: {r}", file=sys.stderr, flush=True)
    rows = {m: _best(rs) for m, rs in runs.items()}
    read, rw = rows["read"], rows["read_write"]
    if "gb_per_s" in rw and "gb_per_s" in read:
        rw["ratio_to_read"] = round(rw["gb_per_s"] / read["gb_per_s"], 3)
    for m in modes[2:]:
        r = rows[m]
        if "gb_per_s" in r and "gb_per_s" in read:
            r["ratio_to_read"] = round(r["gb_per_s"] / read["gb_per_s"], 3)
            after = r["seconds"] - r["kernels_load_seconds"]  # context: what a process with numba loaded would see
            r["ratio_to_read_after_load"] = round(r["bytes"] / 1e9 / after / read["gb_per_s"], 3) if after > 0 else None
            if "gb_per_s" in rw:  # context only: the target stays the ratio to the plain read
                r["ratio_to_read_write"] = round(r["gb_per_s"] / rw["gb_per_s"], 3)
            r["rss_ok"] = r["peak_rss_gb"] < RSS_TARGET_GB
            r["ratio_ok"] = r["ratio_to_read"] >= RATIO_TARGET
    return rows


def _mergekit_all(python: str, folder: Path, n: int, ours: dict) -> dict:
    out = {}
    for m in ("task_arithmetic", "ties"):
        r = mergekit(python, folder, n, m)
        if "output" in r:
            mk_out = Path(r.pop("output"))
            r["vs_ours"] = _compare_mergekit(folder, n, m, mk_out)
            shutil.rmtree(mk_out, ignore_errors=True)
            if m in ours and "gb_per_s" in ours[m]:
                r["ours_speedup"] = round(ours[m]["gb_per_s"] / r["gb_per_s"], 2)
                r["ours_rss_ratio"] = round(ours[m]["peak_rss_total_gb"] / r["peak_rss_gb"], 2)  # both whole-process
        out[m] = r
        print(f"mergekit {m}: {r}", file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    main()
