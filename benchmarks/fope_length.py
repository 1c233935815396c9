"""Benchmark: length extrapolation of FoPE vs RoPE and the ablations, >= 3 seeds, CPU presets.

Trains every position embedding with the same seed and batches (one process, torch single-threaded),
on (1) the byte-level stdlib corpus with the `quick` preset (N = 64) and (2) the passkey task at N = 64,
and reports per method mean and std over seeds of the loss growth from N to 2N/4N/8N and the passkey
accuracy at N/2N/4N/8N, RoPE + PI / YaRN (training-free) rows, and FoPE's training step time over
RoPE's measured interleaved on the same model (CPU time, so load from other processes cancels out).

    python benchmarks/fope_length.py                      # the default (about 17 CPU-minutes)
    python benchmarks/fope_length.py --seeds 0,1,2 --tasks text --out /tmp/fope_bench.json

Prints one JSON document on stdout; `--out FILE` also keeps a partial copy updated after each model.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch


def _stats(vals):
    v = [x for x in vals if x is not None]
    if not v:
        return None
    return {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
            "values": [float(x) for x in v]}


def aggregate(per_seed: list[dict]) -> dict:
    """{pe: {metric: {mean, std, values}}} over seeds from run_compare results."""
    out: dict = {}
    for res in per_seed:
        for m in res["methods"]:
            d = out.setdefault(m["pe"], {})
            for k, v in m["summary"].items():
                d.setdefault(k, []).append(v)
            if "train" in m:
                d.setdefault("step_cpu_ms", []).append(m["train"]["step_cpu_ms"])
    return {pe: {k: _stats(v) for k, v in d.items()} for pe, d in out.items()}


def time_steps(cfg, data, rounds: int = 6, steps: int = 8) -> dict:
    """Interleaved training-step timing of RoPE and FoPE on the same shape and batch (median CPU ms)."""
    from icmltools.fope.train import build_model, lm_loss

    gen = torch.Generator().manual_seed(0)
    from icmltools.fope.data import sample_windows

    seq = sample_windows(data.train, cfg.batch_size, cfg.train_length, gen)
    models, opts = {}, {}
    for pe in ("rope", "fope"):
        models[pe] = build_model(pe, cfg.model_config(256), cfg.train_length, sigma=cfg.sigma).train()
        opts[pe] = torch.optim.AdamW(models[pe].parameters(), lr=1e-4)
    cpu: dict = {"rope": [], "fope": []}
    wall: dict = {"rope": [], "fope": []}
    for r in range(rounds):
        order = ("rope", "fope") if r % 2 == 0 else ("fope", "rope")
        for pe in order:
            for i in range(steps):
                t0, c0 = time.perf_counter(), time.process_time()
                loss = lm_loss(models[pe], seq, "cpu")
                opts[pe].zero_grad()
                loss.backward()
                opts[pe].step()
                if r > 0 or i > 1:   # skip warm-up
                    cpu[pe].append(time.process_time() - c0)
                    wall[pe].append(time.perf_counter() - t0)
    med = {pe: float(np.median(v) * 1e3) for pe, v in cpu.items()}
    medw = {pe: float(np.median(v) * 1e3) for pe, v in wall.items()}
    return {"step_cpu_ms": med, "step_wall_ms": medw, "fope_over_rope_cpu": med["fope"] / med["rope"],
            "fope_over_rope_wall": medw["fope"] / medw["rope"], "samples_per_method": len(cpu["rope"]),
            "within_1.15x": med["fope"] / med["rope"] <= 1.15}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--tasks", default="text,passkey")
    ap.add_argument("--text-pes", default="rope,fope,fope-cf,fope-fs")
    ap.add_argument("--passkey-pes", default="rope,fope,fope-cf")
    ap.add_argument("--text-steps", type=int, default=600, help="quick preset: 600")
    ap.add_argument("--passkey-steps", type=int, default=600)
    ap.add_argument("--passkey-length", type=int, default=64)
    ap.add_argument("--extend", default="pi,yarn")
    ap.add_argument("--no-speed", action="store_true", help="skip the interleaved step-time measurement")
    ap.add_argument("--out", default=None, help="also write the (partial, then final) JSON here")
    args = ap.parse_args(argv)

    from icmltools.core.device import set_threads
    from icmltools.core.jsonio import atomic_write_json, dumps
    from icmltools.fope.api import make_config
    from icmltools.fope.data import PasskeyTask, default_corpus
    from icmltools.fope.train import run_compare

    set_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    extend = tuple(e for e in args.extend.split(",") if e)
    t0, c0 = time.perf_counter(), time.process_time()
    doc: dict = {"benchmark": "fope_length", "command": "python benchmarks/fope_length.py " + " ".join(argv or sys.argv[1:]),
                 "seeds": seeds, "torch": torch.__version__, "threads": 1, "tasks": {}}
    corpus = default_corpus()

    def log(msg):
        print(f"[fope_length {time.perf_counter() - t0:7.0f}s] {msg}", file=sys.stderr, flush=True)

    def save():
        if args.out:
            atomic_write_json(args.out, doc)

    tasks = [t for t in args.tasks.split(",") if t]
    for task in tasks:
        if task == "text":
            cfg = make_config("quick", steps=args.text_steps)
            data, pes = corpus, args.text_pes
        else:
            cfg = make_config("quick", task="passkey", train_length=args.passkey_length, batch_size=32,
                              steps=args.passkey_steps, lr=2e-3, warmup=50, eval_samples=100)
            data, pes = PasskeyTask(cfg.passkey_digits), args.passkey_pes
        entry = {"config": cfg.to_dict(), "pes": pes.split(","), "per_seed": []}
        entry["data"] = data.info if task == "text" else data.info()
        doc["tasks"][task] = entry
        for seed in seeds:
            log(f"{task} seed {seed}: {pes}")
            res = run_compare(pes, cfg, data, "cpu", seed, None, extend,
                              stream=lambda rec: log(f"  {rec['pe']}: {json.dumps(rec['summary'])[:200]}"))
            entry["per_seed"].append({"seed": seed, "methods": [
                {"pe": m["pe"], "summary": m["summary"], "eval": [{k: e[k] for k in e if k not in ("buckets", "by_depth")}
                                                                   for e in m["eval"]],
                 "step_cpu_ms": m.get("train", {}).get("step_cpu_ms")} for m in res["methods"]]})
            entry["aggregate"] = aggregate(entry["per_seed"])
            save()
        agg = entry["aggregate"]
        if "rope" in agg and "fope" in agg:
            cmp = {}
            for key in agg["rope"]:
                r, f = agg["rope"].get(key), agg["fope"].get(key)
                if r and f and key.startswith("loss_growth") and r["mean"]:
                    cmp[f"{key}_fope_over_rope"] = f["mean"] / r["mean"]
                if r and f and key.startswith("passkey_acc"):
                    cmp[f"{key}_fope_minus_rope"] = f["mean"] - r["mean"]
            entry["fope_vs_rope"] = cmp
    if not args.no_speed:
        log("interleaved step timing rope vs fope")
        doc["speed"] = time_steps(make_config("quick"), corpus)
    doc["wall_s"] = time.perf_counter() - t0
    doc["cpu_s"] = time.process_time() - c0
    save()
    print(dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
