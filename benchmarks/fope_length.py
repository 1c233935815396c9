"""Benchmark: length extrapolation of FoPE vs RoPE and the ablations, >= 3 seeds, CPU presets.

Trains every position embedding with the same seed and batches (torch single-threaded), on (1) the
byte-level stdlib corpus with the `quick` preset (N = 64) and (2) the passkey task at N = 64, and reports
per method mean and std over seeds of the loss growth from N to 2N/4N/8N and the passkey accuracy at
N/2N/4N/8N, RoPE + PI / YaRN (training-free) rows, and FoPE's training step time over RoPE's measured
interleaved on the same model (CPU time of the one torch thread, so load from other processes cancels
out). Each aggregated figure also carries the per-seed standard errors of the evaluation (`se`: text
windows are the same at every length, so the growth's is paired over windows; passkey: binomial) and
their root mean square `se_rms`, to set against the spread over seeds (`std`). `--text-windows` sets the
text evaluation windows (default: the quick preset's 2048).

Every (task, seed, position embedding) is an independent unit: its streams come from
`derive(seed, ...)` only, so a unit gives the same numbers alone as inside a comparison. `--jobs N` runs
N units at a time in worker processes of one torch thread each (16 cores: the default set in a few
minutes); `--jobs 1` runs them one after the other in this process. The step-time measurement runs
last, alone.

    python benchmarks/fope_length.py                      # the default (about 40 CPU-minutes)
    python benchmarks/fope_length.py --seeds 0,1,2 --jobs 16 --out /tmp/fope_bench.json

Prints one JSON document on stdout; `--out FILE` also keeps a partial copy updated after each unit.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _stats(vals, ses=None):
    """Mean and std over seeds; with the per-seed standard errors `ses`, also their root mean square (the
    evaluation noise of one seed's figure: compare it with the std over seeds)."""
    v = [x for x in vals if x is not None]
    if not v:
        return None
    out = {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
           "values": [float(x) for x in v]}
    se = [x for x in (ses or []) if x is not None]
    if se:
        out["se"] = [float(x) for x in se]
        out["se_rms"] = float(np.sqrt(np.mean(np.square(se))))
    return out


def aggregate(per_seed: list[dict]) -> dict:
    """{pe: {metric: {mean, std, values[, se, se_rms]}}} over seeds from the per-seed method rows (a
    metric's standard error `<metric>_se` goes with it rather than as a metric of its own)."""
    out: dict = {}
    for res in per_seed:
        for m in res["methods"]:
            d = out.setdefault(m["pe"], {})
            for k, v in m["summary"].items():
                d.setdefault(k, []).append(v)
            if m.get("step_ms") is not None:
                d.setdefault("step_ms", []).append(m["step_ms"])
    return {pe: {k: _stats(v, d.get(f"{k}_se")) for k, v in d.items() if not k.endswith("_se")}
            for pe, d in out.items()}


def fope_vs_rope(agg: dict) -> dict:
    """FoPE's mean loss growth over RoPE's, and FoPE's mean passkey accuracy minus RoPE's."""
    cmp: dict = {}
    if "rope" not in agg or "fope" not in agg:
        return cmp
    for key in agg["rope"]:
        r, f = agg["rope"].get(key), agg["fope"].get(key)
        if r and f and key.startswith("loss_growth") and r["mean"]:
            cmp[f"{key}_fope_over_rope"] = f["mean"] / r["mean"]
        if r and f and key.startswith("passkey_acc"):
            cmp[f"{key}_fope_minus_rope"] = f["mean"] - r["mean"]
    return cmp


def time_steps(cfg, data, rounds: int = 6, steps: int = 8) -> dict:
    """Interleaved training-step timing of RoPE and FoPE on the same shape and batch: median CPU time of
    this (the only torch) thread per step, so other processes' load does not enter it, and wall time."""
    import torch

    from icmltools.core.seed import derive
    from icmltools.fope.data import sample_windows
    from icmltools.fope.train import build_model, lm_loss

    seq = sample_windows(data.train, cfg.batch_size, cfg.train_length, derive(0, "bench", "timing").torch())
    models, opts = {}, {}
    for pe in ("rope", "fope"):
        models[pe] = build_model(pe, cfg.model_config(256), cfg.train_length, sigma=cfg.sigma).train()
        opts[pe] = torch.optim.AdamW(models[pe].parameters(), lr=1e-4)
    cpu: dict = {"rope": [], "fope": []}
    wall: dict = {"rope": [], "fope": []}
    for r in range(rounds):
        for pe in (("rope", "fope") if r % 2 == 0 else ("fope", "rope")):
            for i in range(steps):
                t0, c0 = time.perf_counter(), time.thread_time()
                loss = lm_loss(models[pe], seq, "cpu")
                opts[pe].zero_grad()
                loss.backward()
                opts[pe].step()
                if r > 0 or i > 1:   # skip warm-up
                    cpu[pe].append(time.thread_time() - c0)
                    wall[pe].append(time.perf_counter() - t0)
    med = {pe: float(np.median(v) * 1e3) for pe, v in cpu.items()}
    medw = {pe: float(np.median(v) * 1e3) for pe, v in wall.items()}
    return {"clock": "thread_cpu", "torch_threads": torch.get_num_threads(), "step_cpu_ms": med,
            "step_wall_ms": medw, "fope_over_rope_cpu": med["fope"] / med["rope"],
            "fope_over_rope_wall": medw["fope"] / medw["rope"], "samples_per_method": len(cpu["rope"]),
            "within_1.15x": med["fope"] / med["rope"] <= 1.15}


# --------------------------------------------------------------------------------------------- units


def task_config(task: str, args):
    """(RunConfig, position embeddings) of one task."""
    from icmltools.fope.api import make_config

    if task == "text":
        return make_config("quick", steps=args.text_steps, eval_samples=args.text_windows), args.text_pes.split(",")
    cfg = make_config("quick", task="passkey", train_length=args.passkey_length, batch_size=32,
                      steps=args.passkey_steps, lr=2e-3, warmup=50, eval_samples=100)
    return cfg, args.passkey_pes.split(",")


def _corpus():
    """The default corpus, or the copy of a stdlib under --corpus-root (passed to workers by environment)."""
    import os

    from icmltools.fope.data import default_corpus

    return default_corpus(root=os.environ.get("FOPE_BENCH_CORPUS_ROOT") or None)


def task_data(task: str, cfg):
    from icmltools.fope.data import PasskeyTask

    return _corpus() if task == "text" else PasskeyTask(cfg.passkey_digits)


def _init_worker() -> None:
    from icmltools.core.device import set_threads

    set_threads(1)


def run_unit(task: str, seed: int, pe: str, cfg_dict: dict, extend: tuple) -> dict:
    """Train and evaluate one position embedding on one task and seed (the rope unit adds its extensions)."""
    from icmltools.fope.options import RunConfig
    from icmltools.fope.train import run_compare

    cfg = RunConfig.from_dict(cfg_dict)
    res = run_compare(pe, cfg, task_data(task, cfg), "cpu", seed, None, extend)
    rows = [{"pe": m["pe"], "summary": m["summary"],
             "eval": [{k: e[k] for k in e if k not in ("buckets", "by_depth")} for e in m["eval"]],
             "step_ms": m.get("train", {}).get("step_ms"), "step_clock": m.get("train", {}).get("step_clock")}
            for m in res["methods"]]
    return {"task": task, "seed": seed, "pe": pe, "rows": rows, "cpu_s": res["cpu_seconds"]}


def run_units(units: list[tuple], jobs: int, on_done) -> list[dict]:
    """Every unit (task, seed, pe, cfg_dict, extend), `jobs` at a time (1: in this process)."""
    if jobs <= 1:
        out = []
        for u in units:
            out.append(run_unit(*u))
            on_done(out[-1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker) as pool:
        futures = [pool.submit(run_unit, *u) for u in units]
        for f in as_completed(futures):
            on_done(f.result())
        return [f.result() for f in futures]


def assemble(doc: dict, done: list[dict], seeds: list[int]) -> None:
    """Per task: per-seed method rows in the order of the position embeddings, aggregates, FoPE vs RoPE."""
    for task, entry in doc["tasks"].items():
        by_key = {(u["seed"], u["pe"]): u for u in done if u["task"] == task}
        entry["per_seed"] = [{"seed": s, "methods": [row for pe in entry["pes"] if (s, pe) in by_key
                                                      for row in by_key[(s, pe)]["rows"]]}
                             for s in seeds if any((s, pe) in by_key for pe in entry["pes"])]
        entry["aggregate"] = aggregate(entry["per_seed"])
        entry["fope_vs_rope"] = fope_vs_rope(entry["aggregate"])


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--tasks", default="text,passkey")
    ap.add_argument("--text-pes", default="rope,fope,fope-cf,fope-fs")
    ap.add_argument("--passkey-pes", default="rope,fope,fope-cf")
    ap.add_argument("--text-steps", type=int, default=600, help="quick preset: 600")
    ap.add_argument("--text-windows", type=int, default=None,
                    help="text evaluation windows per length (the same at every length; default: the quick preset's)")
    ap.add_argument("--passkey-steps", type=int, default=600)
    ap.add_argument("--passkey-length", type=int, default=64)
    ap.add_argument("--extend", default="pi,yarn")
    ap.add_argument("--jobs", type=int, default=1,
                    help="units (task, seed, pe) run at a time, each a process with one torch thread")
    ap.add_argument("--no-speed", action="store_true", help="skip the interleaved step-time measurement")
    ap.add_argument("--out", default=None, help="also write the (partial, then final) JSON here")
    ap.add_argument("--corpus-root", default=None,
                    help="read the default corpus from this copy of a Python stdlib (another machine's Python "
                         "has other sources: compare result.data.sha256)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    from icmltools.core.device import set_threads
    from icmltools.core.jsonio import atomic_write_json, dumps

    set_threads(1)
    if args.corpus_root:
        import os

        os.environ["FOPE_BENCH_CORPUS_ROOT"] = args.corpus_root
    seeds = [int(s) for s in args.seeds.split(",")]
    extend = tuple(e for e in args.extend.split(",") if e)
    t0, c0 = time.perf_counter(), time.process_time()
    doc: dict = {"benchmark": "fope_length", "command": "python benchmarks/fope_length.py " + " ".join(argv or sys.argv[1:]),
                 "seeds": seeds, "torch": torch.__version__, "threads": 1, "jobs": args.jobs, "tasks": {}}
    units, done = [], []
    for task in (t for t in args.tasks.split(",") if t):
        cfg, pes = task_config(task, args)
        doc["tasks"][task] = {"config": cfg.to_dict(), "pes": pes}
        units += [(task, seed, pe, cfg.to_dict(), extend) for seed in seeds for pe in pes]

    def on_done(unit: dict) -> None:
        done.append(unit)
        print(f"[fope_length {time.perf_counter() - t0:7.0f}s] {unit['task']} seed {unit['seed']} {unit['pe']}: "
              f"{json.dumps(unit['rows'][0]['summary'])[:200]}", file=sys.stderr, flush=True)
        if args.out:
            assemble(doc, done, seeds)
            atomic_write_json(args.out, doc)

    units_out = run_units(units, args.jobs, on_done)
    assemble(doc, units_out, seeds)
    for task, entry in doc["tasks"].items():
        cfg, _ = task_config(task, args)
        data = task_data(task, cfg)
        entry["data"] = data.info if task == "text" else data.info()
    if not args.no_speed:
        print("[fope_length] interleaved step timing rope vs fope", file=sys.stderr, flush=True)
        from icmltools.fope.api import make_config

        doc["speed"] = time_steps(make_config("quick"), _corpus())
    doc["wall_s"] = time.perf_counter() - t0
    doc["cpu_s"] = time.process_time() - c0 + (sum(u["cpu_s"] for u in units_out) if args.jobs > 1 else 0.0)
    if args.out:
        atomic_write_json(args.out, doc)
    print(dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
