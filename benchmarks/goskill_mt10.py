"""MT10 benchmark for `icml goskill`: GO-Skill vs MT-BC vs MT-BC-RTG over several seeds, one JSON on stdout.

Every seed collects its own ramp dataset once, trains and evaluates the three methods on it (same data,
same evaluation envs), then optional GO-Skill variants reuse that data (`mlp` = MLP skill decoder,
`h5` = skill horizon H = 5, `noenh` = without skill enhancement comes for free from the base run).

    python benchmarks/goskill_mt10.py --seeds 0,1,2 --jobs 2 > goskill_mt10.json
    python benchmarks/goskill_mt10.py --preset cpu --seeds 0,1,2            # the full CPU preset (slow)
    python benchmarks/goskill_mt10.py --oracle RUN_DIR --oracle-tasks reach-v3,push-v3   # decoder diagnostic

`--oracle RUN_DIR` evaluates a finished run's skill decoder with ORACLE codes: at every skill start the
scripted expert is rolled H steps ahead from a snapshot of the MuJoCo state (then restored), and the code
of enc(norm(s_{t+H}) - norm(s_t)) drives the decoder. If the decoder fails even with oracle codes, the
low level is at fault; if it succeeds where the high level fails, the high level is.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from icmltools.goskill import options

VARIANTS = {"mlp": {"decoder": "mlp"}, "h5": {"H": 5}, "task": {"conditioning": "task"}}


def _one_seed(job):
    seed, args, root = job
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from icmltools.goskill.api import start
    from icmltools.goskill.tasks import quiet

    ov = json.loads(args.overrides)
    ov.setdefault("tasks", args.tasks)
    out = {"seed": seed}
    with quiet():
        t0 = time.perf_counter()
        base = start(preset=args.preset, out=str(Path(root) / f"s{seed}" / "base"), seed=seed, device="cpu",
                     methods="goskill,goskill_noenh,mtbc,mtbc_rtg", overrides=ov)
        out["base"] = base
        out["base_s"] = time.perf_counter() - t0
        data = str(Path(root) / f"s{seed}" / "base" / "data")
        for v in [v for v in args.variants.split(",") if v]:
            if args.variant_seeds and seed not in args.variant_seeds:
                continue
            vov = {**ov, **VARIANTS[v]}
            vov.pop("tasks", None)
            t0 = time.perf_counter()
            out[v] = start(preset=args.preset, out=str(Path(root) / f"s{seed}" / v), data=data, seed=seed,
                           device="cpu", methods="goskill", overrides=vov)
            out[v + "_s"] = time.perf_counter() - t0
    print(f"[goskill_mt10] seed {seed} done", file=sys.stderr, flush=True)
    return out


def _snapshot(env):
    import copy

    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    st = np.zeros(mujoco.mj_stateSize(env.model, spec))
    mujoco.mj_getState(env.model, env.data, st, spec)
    extra = {k: copy.deepcopy(v) for k, v in vars(env).items() if k in ("_prev_obs", "curr_path_length", "_last_stable_obs")}
    return st, extra


def _restore(env, snap):
    import copy

    import mujoco

    st, extra = snap
    mujoco.mj_setState(env.model, env.data, st, mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(env.model, env.data)
    for k, v in extra.items():
        setattr(env, k, copy.deepcopy(v))


def oracle(run_dir: str, tasks: list[str], episodes: int, key: str = "skill_enhanced") -> dict:
    """Success of the skill decoder driven by oracle codes vs by the trained high level, same envs and seeds."""
    import torch

    torch.set_num_threads(1)
    from icmltools.core.seed import derive
    from icmltools.goskill import train as TR
    from icmltools.goskill.evaluate import GoSkillAgent
    from icmltools.goskill.pipeline import Run, eval_prompts
    from icmltools.goskill.tasks import MetaWorldBackend, quiet

    run = Run.open(run_dir)
    fd, cfg = run.flat(), run.cfg
    skill = run.load(key, run.new_skill(), "cpu", "enhance").eval()
    hl = run.load("high_level", run.new_high_level(), "cpu", "policy").eval()
    codes = TR.relabel(skill, fd, cfg.H, "cpu")
    prompts = eval_prompts(run, codes)
    b, H = MetaWorldBackend(), cfg.H
    out = {}
    with quiet(), torch.no_grad():
        for task in tasks:
            tid, expert = fd.tasks.index(task), b.expert(task)
            res = {}
            agree = []
            for mode in ("oracle", "high_level"):
                succ = []
                for ep in range(episodes):
                    env = b.make(task, derive(run.seed, "oracle", task, ep).int(31))
                    obs = b.reset(env)
                    agent = GoSkillAgent(hl, skill, cfg, fd.mean, fd.std, fd.task_max_return(), prompts, "cpu",
                                         fd.actions.shape[1])
                    agent.reset(np.array([tid]))
                    ok = False
                    for t in range(cfg.max_steps):
                        if t % H == 0:
                            snap, o2 = _snapshot(env), obs
                            for _ in range(H):
                                o2, _, _ = b.step(env, expert(o2))
                            _restore(env, snap)
                            g = fd.normalize(o2) - fd.normalize(obs)
                            oc = skill.codes_of(torch.as_tensor(g[None]))
                        if mode == "oracle":   # the agent's own decoder path, with the code replaced
                            act = agent.act(obs[None], t, code=oc if t % H == 0 else None)[0]
                        else:
                            act = agent.act(obs[None], t)[0]
                            if t % H == 0:
                                agree.append(int(agent.code.item()) == int(oc.item()))
                        obs, r, done = b.step(env, act)
                        agent.observe(np.array([r]))
                        ok |= done
                    succ.append(float(ok))
                res[mode + "_success"] = float(np.mean(succ))
            res["high_level_oracle_code_agreement"] = float(np.mean(agree))
            out[task] = res
    return {"run_dir": run_dir, "decoder": key, "episodes": episodes, "per_task": out}


def _ms(x):
    x = np.asarray(x, float)
    return {"mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0, "per_seed": x.tolist()}


def _aggregate(rs: list[dict]) -> dict:
    """Mean +- std over seeds of one method's evaluations (and its per-task success, mean over seeds)."""
    return {"success": _ms([x["success"] for x in rs]), "return": _ms([x["return"] for x in rs]),
            "per_task_success": {t: float(np.mean([x["per_task"][t]["success"] for x in rs])) for t in rs[0]["per_task"]}}


def _report(args, seeds: list[int], runs: list[dict], root: str, wall_s: float) -> dict:
    methods = {m: _aggregate([next(x for x in r["base"]["methods"] if x["method"] == m) for r in runs])
               for m in options.METHODS}
    variants = {}
    for v in [v for v in args.variants.split(",") if v]:
        rs = [r[v]["methods"][0] for r in runs if v in r]
        if rs:
            variants["goskill_" + v] = {"config": VARIANTS[v], "seeds": [r["seed"] for r in runs if v in r],
                                        **_aggregate(rs)}
    phases = {}
    for r in runs:
        for k, v in r["base"]["phase_s"].items():
            phases.setdefault(k, []).append(v)
    g, b, rtg = (methods[m]["success"]["mean"] for m in ("goskill", "mtbc", "mtbc_rtg"))
    cfg = json.loads((Path(runs[0]["base"]["run_dir"]) / "pipeline.json").read_text())["config"]
    return {
        "benchmark": "goskill_mt10", "preset": args.preset, "overrides": json.loads(args.overrides),
        "tasks": runs[0]["base"]["tasks"], "seeds": seeds,
        "data": runs[0]["base"]["data"], "eval_episodes_per_task": cfg["eval_episodes"],
        "config": {k: cfg[k] for k in ("episodes", "max_steps", "H", "decoder", "dec_hidden", "dec_layers", "hl_hidden",
                                       "hl_layers", "context", "prompt_len", "extract_iters", "enhance_iters",
                                       "policy_iters", "bc_iters")},
        "methods": methods, "variants": variants,
        "ratios": {"goskill_over_mtbc": g / b if b else None, "goskill_over_mtbc_rtg": g / rtg if rtg else None},
        "phase_s_mean": {k: float(np.mean(v)) for k, v in phases.items()},
        "code_usage_per_seed": [r["base"]["code_usage"] for r in runs],
        "codes_used_per_seed": [r["base"]["codes_used"] for r in runs],
        "enhance_action_mse": [r["base"]["enhance"] for r in runs],
        "wall_s": wall_s, "root": root,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=options.DEFAULT_PRESET, choices=options.PRESET_NAMES)
    ap.add_argument("--tasks", default="mt10")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (one thread each)")
    ap.add_argument("--variants", default="mlp,h5", help="GO-Skill variants on the same data: mlp, h5, task")
    ap.add_argument("--variant-seeds", default="", help="seeds that run the variants (default: all)")
    ap.add_argument("--overrides", default="{}", help="JSON dict of config overrides, e.g. '{\"policy_iters\": 1000}'")
    ap.add_argument("--root", default=None, help="where run directories go (default: a temp folder)")
    ap.add_argument("--oracle", default=None, metavar="RUN_DIR", help="only run the oracle-code decoder diagnostic")
    ap.add_argument("--oracle-tasks", default="reach-v3,push-v3")
    ap.add_argument("--oracle-episodes", type=int, default=5)
    ap.add_argument("--oracle-decoder", default="skill_enhanced", choices=["skill", "skill_enhanced"])
    args = ap.parse_args()
    if args.oracle:
        print(json.dumps(oracle(args.oracle, args.oracle_tasks.split(","), args.oracle_episodes, args.oracle_decoder)))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    args.variant_seeds = [int(s) for s in args.variant_seeds.split(",")] if args.variant_seeds else []
    root = args.root or tempfile.mkdtemp(prefix="goskill_mt10_")
    t0 = time.perf_counter()
    jobs = [(s, args, root) for s in seeds]
    if args.jobs > 1:
        with mp.get_context("fork").Pool(args.jobs) as pool:
            runs = pool.map(_one_seed, jobs)
    else:
        runs = [_one_seed(j) for j in jobs]
    print(json.dumps(_report(args, seeds, runs, root, time.perf_counter() - t0)))


if __name__ == "__main__":
    main()
