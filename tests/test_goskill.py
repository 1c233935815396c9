"""GO-Skill: goal indexing, VQ, balanced sampling, hierarchical rollout (toy env), MetaWorld smoke, CLI."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from icmltools.goskill import data as D
from icmltools.goskill.config import make_config
from icmltools.goskill.options import STAGES
from icmltools.goskill.vq import VectorQuantizer

torch.set_num_threads(1)

TOY = "toy-a,toy-b,toy-c,toy-d"
TINY = ["--episodes", "4", "--max-steps", "20", "-H", "5", "--extract-iters", "20", "--enhance-iters", "5",
        "--policy-iters", "10", "--bc-iters", "10", "--eval-episodes", "1"]


def _episode(T, ds=3, da=2, offset=0.0):
    o = (np.arange(T)[:, None] * np.ones((1, ds)) + offset).astype(np.float32)
    return {"observations": o, "next_observations": o + 1, "actions": np.zeros((T, da), np.float32),
            "rewards": np.ones(T, np.float32)}


def test_goal_indexing_and_end_clipping():
    fd = D.flatten(["a"], [[_episode(7), _episode(4, offset=100.0)]], mean=np.zeros(3), std=np.ones(3))
    H = 3
    idx = np.arange(fd.n)
    j = D.goal_end_index(idx, fd.ep_end[idx], H)
    # episode 1 spans 0..6: window t ends at next_obs[min(t+2, 6)]; episode 2 spans 7..10
    assert j.tolist() == [2, 3, 4, 5, 6, 6, 6, 9, 10, 10, 10]
    g = D.goals(fd, idx, H)[:, 0]
    # g_t = s_{t+H} - s_t = H inside an episode; clipped near the end (s_T - s_t)
    assert g.tolist() == [3, 3, 3, 3, 3, 2, 1, 3, 3, 2, 1]
    s, a, m = D.windows(fd, np.array([5, 9]), H)
    assert m.tolist() == [[1, 1, 0], [1, 1, 0]]
    assert s[0, :2, 0].tolist() == [5, 6] and s[0, 2].tolist() == [0, 0, 0]
    # return-to-go and in-episode timesteps
    assert fd.rtg[:7].tolist() == [7, 6, 5, 4, 3, 2, 1] and fd.timestep[7:].tolist() == [0, 1, 2, 3]


def test_skill_sequences_left_pad_and_prompt():
    fd = D.flatten(["a"], [[_episode(25)]], mean=np.zeros(3), std=np.ones(3))
    codes = np.arange(fd.n)
    s, c, r, ts, m = D.skill_sequences(fd, codes, np.array([12]), L=4, H=5, rtg_scale=1.0)
    # timesteps are skill-step indices t // H (official batcher), not raw environment steps
    assert m.tolist() == [[0, 1, 1, 1]] and ts.tolist() == [[0, 0, 1, 2]]
    assert c[0, 1:].tolist() == [2, 7, 12] and r[0, 1:, 0].tolist() == [23, 18, 13]
    # the prompt is the LAST P skill steps of the episode (official get_prompt): steps 10, 15, 20 of 25
    ps, pc, pr, pts, pm = D.prompt_sequence(fd, codes, fd.episodes[0], P=3, H=5, rtg_scale=1.0)
    assert pm.tolist() == [1, 1, 1] and pc.tolist() == [10, 15, 20] and pts.tolist() == [2, 3, 4]
    assert ps[:, 0].tolist() == [10, 15, 20] and pr[:, 0].tolist() == [15, 10, 5]
    # an episode with fewer than P skill steps is left-padded: T = 12, H = 5 -> steps 2, 7
    fd2 = D.flatten(["a"], [[_episode(12)]], mean=np.zeros(3), std=np.ones(3))
    ps, pc, pr, pts, pm = D.prompt_sequence(fd2, np.arange(12), fd2.episodes[0], P=3, H=5, rtg_scale=1.0)
    assert pm.tolist() == [0, 1, 1] and pc.tolist() == [0, 2, 7] and pts.tolist() == [0, 0, 1]


def test_eval_timesteps_match_training_skill_step_index():
    """The high level sees the same timestep convention at run time (t // H at decision t) as in training."""
    from icmltools.goskill.evaluate import GoSkillAgent

    cfg = make_config("quick", tasks="toy-a", H=5, context=3, conditioning="task", hl_hidden=16, vq_dim=4, n_codes=4)
    seen = []

    class HL(torch.nn.Module):
        def forward(self, s, z, r, ts, mask, prompt=None, task=None):
            seen.append(ts.clone())
            return torch.zeros(s.shape[0], s.shape[1], 4)

    class Skill(torch.nn.Module):
        H = 5

        def __init__(self):
            super().__init__()
            from icmltools.goskill.vq import VectorQuantizer
            self.vq = VectorQuantizer(4, 4, kmeans_init=False)

        def act(self, code, S, A, k):
            return torch.zeros(S.shape[0], 2)

    agent = GoSkillAgent(HL(), Skill(), cfg, np.zeros(6, np.float32), np.ones(6, np.float32), np.ones(1), {}, "cpu", 2)
    agent.reset(np.array([0]))
    for t in range(16):
        agent.act(np.zeros((1, 6), np.float32), t)
    assert [x[0].tolist() for x in seen] == [[0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 2, 3]]


def test_agent_code_override_skips_the_high_level_and_drives_the_decoder():
    """`act(..., code=c)` at a skill start (the oracle diagnostic) hands c to the decoder for the next H steps,
    with the in-skill history reset, and never calls the high level."""
    from icmltools.goskill.evaluate import GoSkillAgent

    cfg = make_config("quick", tasks="toy-a", H=3, context=2, conditioning="task", vq_dim=4, n_codes=4)
    calls, seen = [], []

    class HL(torch.nn.Module):
        def forward(self, *a, **k):
            calls.append(1)
            return torch.zeros(1, 2, 4)

    class Skill(torch.nn.Module):
        def act(self, code, S, A, k):
            seen.append((int(code.item()), S.shape[1], A.shape[1], k))
            return torch.zeros(S.shape[0], 2)

    agent = GoSkillAgent(HL(), Skill(), cfg, np.zeros(6, np.float32), np.ones(6, np.float32), np.ones(1), {}, "cpu", 2)
    agent.reset(np.array([0]))
    for t in range(6):
        c = torch.tensor([2 if t < 3 else 1]) if t % 3 == 0 else None
        agent.act(np.zeros((1, 6), np.float32), t, code=c)
    assert not calls and agent.decisions == 0
    assert seen == [(2, 1, 0, 0), (2, 2, 1, 1), (2, 3, 2, 2), (1, 1, 0, 0), (1, 2, 1, 1), (1, 3, 2, 2)]


def test_vq_kmeans_init_nearest_ema_and_straight_through():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[3.0, 0.0], [-3.0, 0.0], [0.0, 3.0]])
    z = (centres[torch.arange(300) % 3] + 0.1 * torch.randn(300, 2, generator=g)).requires_grad_(True)
    vq = VectorQuantizer(n_codes=3, dim=2, decay=0.8, commitment=1.0, kmeans_init=True)
    vq.generator = torch.Generator().manual_seed(1)
    vq.train()
    q, idx, loss = vq(z)
    # k-means init finds the three clusters: each code sits within 0.1 of one centre, one code per cluster
    d = torch.cdist(vq.codebook, centres)
    assert d.min(1).values.max() < 0.1 and len(set(d.argmin(1).tolist())) == 3
    assert len(set(idx.tolist())) == 3 and float(loss.detach()) >= 0
    assert torch.allclose(loss, ((z - q.detach()) ** 2).mean())
    # straight-through: the quantised output carries an identity gradient to z
    q.sum().backward()
    assert torch.allclose(z.grad, torch.ones_like(z))
    # nearest code on a hand-made codebook
    vq2 = VectorQuantizer(n_codes=2, dim=2, kmeans_init=False)
    vq2.codebook.copy_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert vq2.nearest(torch.tensor([[0.2, 0.1], [0.9, 0.7], [0.6, 0.6]])).tolist() == [0, 1, 1]
    # EMA update: counts and sums decay by 0.8; the code moves toward its assigned encodings
    vq3 = VectorQuantizer(n_codes=2, dim=2, decay=0.8, kmeans_init=False)
    vq3.codebook.copy_(torch.tensor([[0.0, 0.0], [5.0, 5.0]]))
    vq3.embed_avg.copy_(vq3.codebook)
    vq3.cluster_size.fill_(1.0)
    x = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    vq3.train()
    vq3(x)
    assert torch.allclose(vq3.cluster_size, torch.tensor([0.8 + 0.2 * 2, 0.8]))
    assert torch.allclose(vq3.embed_avg[0], torch.tensor([0.4, 0.4]))
    assert 0.0 < float(vq3.codebook[0, 0]) < 1.0 and torch.allclose(vq3.codebook[1], torch.tensor([5.0, 5.0]), atol=1e-3)
    # frozen / eval: no update, zero commitment
    before = vq3.codebook.clone()
    vq3.eval()
    _, _, l0 = vq3(x)
    assert torch.equal(before, vq3.codebook) and float(l0) == 0.0


def test_balanced_sampler_equal_counts_per_used_code():
    rng = np.random.default_rng(0)
    codes = np.array([0] * 500 + [3] * 20 + [7] * 3 + [9] * 1)
    idx = D.balanced_indices(codes, 6, rng)
    counts = np.bincount(codes[idx], minlength=16)
    assert counts[[0, 3, 7, 9]].tolist() == [6, 6, 6, 6] and counts.sum() == 24


def test_enhancement_schedule_and_batch_follow_the_official_loop():
    """Official main loop: one decoder-only enhancement step per high-level step, on a balanced batch as large
    as a phase-1 batch (batch_size * n_tasks // valid_codes windows per code)."""
    from icmltools.goskill.config import PRESETS
    from icmltools.goskill.train import enhance_per_code

    for name in PRESETS:
        cfg = make_config(name)
        assert cfg.enhance_iters == cfg.policy_iters, name
        assert cfg.enhance_per_code == 0, name
    cfg = make_config("quick", extract_batch=64)
    codes = np.repeat(np.arange(10), 7)          # 10 used codes of 16
    assert enhance_per_code(cfg, codes) == 6
    idx = D.balanced_indices(codes, enhance_per_code(cfg, codes), np.random.default_rng(0))
    assert len(idx) == 60 and np.bincount(codes[idx]).tolist() == [6] * 10
    assert enhance_per_code(make_config("quick", enhance_per_code=3), codes) == 3


def _toy_run(tmp_path, **kw):
    from icmltools.goskill.pipeline import Run

    base = dict(tasks=TOY, episodes=6, max_steps=20, H=5, enc_hidden=32, dec_hidden=32, hl_hidden=32,
                vq_dim=8, n_codes=8, context=4, prompt_len=2, extract_batch=32, policy_batch=8,
                extract_iters=60, enhance_iters=5, policy_iters=10, bc_iters=10, eval_episodes=2)
    cfg = make_config("quick", **{**base, **kw})
    return Run.create(tmp_path / "run", cfg, seed=0)


def test_relabel_shapes_and_hierarchical_rollout_on_toy_env(tmp_path):
    from icmltools.goskill import train as TR
    from icmltools.goskill.evaluate import GoSkillAgent, evaluate
    from icmltools.goskill.pipeline import eval_prompts, run_pipeline
    from icmltools.goskill.tasks import ToyBackend

    run = _toy_run(tmp_path)
    res = run_pipeline(run, ["collect", "extract"], "cpu")
    assert res["codes_used"] >= 2
    st = run.stage_stats()["extract"]
    assert st["loss_last"] < st["loss_first"]  # phase-1 loss decreases
    fd, cfg = run.flat(), run.cfg
    skill = run.load("skill", run.new_skill(), "cpu", "extract")
    codes = TR.relabel(skill, fd, cfg.H, "cpu")
    assert codes.shape == (fd.n,) and codes.dtype == np.int64 and codes.max() < cfg.n_codes
    hl = run.new_high_level()
    agent = GoSkillAgent(hl, skill, cfg, fd.mean, fd.std, fd.task_max_return(), eval_prompts(run, codes),
                         "cpu", fd.actions.shape[1])
    calls = []
    orig = agent.act

    def spy(obs, t):
        a = orig(obs, t)
        calls.append(a)
        return a

    agent.act = spy
    out = evaluate(agent, ToyBackend(), fd.tasks, episodes=2, max_steps=12, seed=0, envs_per_task=2)
    # 4 tasks x 2 envs in one round of 12 steps: the high level decides at t = 0, 5, 10
    assert agent.decisions == 3 and len(calls) == 12
    assert all(a.shape == (8, 2) and np.all(np.abs(a) <= 1) for a in calls)
    assert set(out["per_task"]) == set(fd.tasks) and all(v["episodes"] == 2 for v in out["per_task"].values())
    assert 0.0 <= out["success"] <= 1.0


def test_mtbc_learns_toy_tasks(tmp_path):
    """Effect size on a fixed seed: MT-BC trained on ramp data beats the untrained network on the toy env."""
    from icmltools.goskill.pipeline import run_pipeline

    run = _toy_run(tmp_path, bc_iters=300)
    run_pipeline(run, ["collect"], "cpu")
    untrained = run.new_bc(rtg=False)
    run.save("mtbc", untrained)
    before = run_pipeline(run, ["evaluate"], "cpu", methods=("mtbc",))["methods"][0]["success"]
    after = run_pipeline(run, ["baselines", "evaluate"], "cpu", methods=("mtbc",))["methods"][0]["success"]
    assert after >= before + 0.5, (before, after)


def test_metaworld_smoke_reach_v3(tmp_path):
    from icmltools.goskill.collect import collect
    from icmltools.goskill.data import load_dataset_dir

    summary = collect(["reach-v3"], tmp_path / "d", episodes=2, max_steps=8, seed=0)
    tasks, eps = load_dataset_dir(tmp_path / "d")
    assert tasks == ["reach-v3"] and len(eps[0]) == 2
    e = eps[0][1]
    assert e["observations"].shape == (8, 39) and e["observations"].dtype == np.float32
    assert e["actions"].shape == (8, 4) and np.all(np.abs(e["actions"]) <= 1)
    assert np.allclose(e["next_observations"][:-1], e["observations"][1:])
    assert summary["per_task"]["reach-v3"]["mean_return"] > 0


def test_metaworld_goals_follow_the_seed_not_the_global_rng():
    """Reset goals come from the env's seeded generator (MetaWorld's default draws from the global np.random,
    which made --seed runs differ); `reseed` rewinds the sequence so every method faces the same goals."""
    from icmltools.goskill.tasks import MetaWorldBackend

    b = MetaWorldBackend()

    def goals(env, n=3):
        return [b.reset(env)[-3:].copy() for _ in range(n)]

    env = b.make("reach-v3", 123)
    first = goals(env)
    np.random.seed(999)                       # the global RNG must not matter
    env2 = b.make("reach-v3", 123)
    np.random.rand(5)
    assert np.array_equal(np.stack(goals(env2)), np.stack(first))
    assert not np.array_equal(first[0], first[1])   # still a new goal on every reset
    b.reseed(env)
    assert np.array_equal(np.stack(goals(env)), np.stack(first))
    assert not np.array_equal(goals(b.make("reach-v3", 124), 1)[0], first[0])


def test_cli_toy_end_to_end_and_stage_by_stage(run_cli, tmp_path):
    out = tmp_path / "r"
    res, doc = run_cli(["goskill", "-q", "--tasks", TOY, "--out", str(out), "--stages", "collect", *TINY])
    assert doc["result"]["stages_run"] == ["collect"] and (out / "data" / "toy-a" / "0.npz").exists()
    res, doc = run_cli(["goskill", "-q", "--run-dir", str(out), "--methods", "goskill,mtbc,mtbc_rtg"])
    r = doc["result"]
    assert r["stages_run"] == ["extract", "enhance", "policy", "baselines", "evaluate"]
    assert [m["method"] for m in r["methods"]] == ["goskill", "mtbc", "mtbc_rtg"]
    for m in r["methods"]:
        assert 0 <= m["success"] <= 1 and set(m["per_task"]) == set(TOY.split(","))
    assert len(r["code_usage"]) == 16 and sum(r["code_usage"]) == r["data"]["steps"]
    assert json.loads((out / "result.json").read_text())["methods"][0]["method"] == "goskill"
    for f in ("config.json", "stages.json", "checkpoints/skill.safetensors", "checkpoints/high_level.safetensors"):
        assert (out / f).exists(), f
    assert doc["device"] and doc["seed"] == 0 and "extract" in doc["timing"]


def test_user_dataset_official_layout(run_cli, tmp_path):
    from icmltools.goskill.collect import collect

    collect(["toy-a", "toy-b"], tmp_path / "data", episodes=4, max_steps=15, seed=1)
    res, doc = run_cli(["goskill", "-q", "--data", str(tmp_path / "data"), "--split", "sub", "--out",
                        str(tmp_path / "r"), "--methods", "mtbc", *TINY])
    r = doc["result"]
    assert r["tasks"] == ["toy-a", "toy-b"] and r["data"]["episodes"] == 4  # sub = first half of 4 per task
    assert "collect" not in r["stages_run"] and not (tmp_path / "r" / "data").exists()


def _err(res):
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_bad_inputs(run_cli, tmp_path):
    res, _ = run_cli(["goskill", "-q", "--tasks", "reach-v3,pushh-v3"], expect_code=2)
    assert "pushh-v3" in _err(res)
    bad = tmp_path / "bad" / "reach-v3"
    bad.mkdir(parents=True)
    np.savez(bad / "0.npz", observations=np.zeros((5, 39)), actions=np.zeros((4, 4)), rewards=np.zeros(5))
    res, _ = run_cli(["goskill", "-q", "--data", str(tmp_path / "bad")], expect_code=2)
    assert "0.npz" in _err(res) and "episode length" in _err(res)
    empty = tmp_path / "empty"
    empty.mkdir()
    res, _ = run_cli(["goskill", "-q", "--run-dir", str(empty)], expect_code=2)
    assert "empty" in _err(res)
    if not torch.cuda.is_available():
        res, _ = run_cli(["goskill", "-q", "--device", "cuda"], expect_code=2)
        assert "cuda" in _err(res).lower()
    res, _ = run_cli(["goskill", "-q", "--stages", "extract,fly"], expect_code=2)
    assert "fly" in _err(res)
    assert not list(Path(tmp_path / "runs").glob("goskill/*/config.json")) if (tmp_path / "runs").exists() else True


def test_parallel_collection_matches_serial(tmp_path):
    from icmltools.goskill.collect import collect
    from icmltools.goskill.data import load_dataset_dir

    collect(["toy-a", "toy-b"], tmp_path / "one", episodes=3, max_steps=6, seed=3, workers=1)
    collect(["toy-a", "toy-b"], tmp_path / "two", episodes=3, max_steps=6, seed=3, workers=2)
    _, e1 = load_dataset_dir(tmp_path / "one")
    _, e2 = load_dataset_dir(tmp_path / "two")
    for a, b in zip(sum(e1, []), sum(e2, [])):
        assert np.array_equal(a["actions"], b["actions"]) and np.array_equal(a["observations"], b["observations"])
    # the quality ramp: the last (expert) episode earns more than the first (random-heavy) one on average
    rets = [[float(e["rewards"].sum()) for e in eps] for eps in e1]
    assert all(r[-1] > r[0] for r in rets)


# --------------------------------------------------------------------------------------------- issue 20


def test_every_mt50_expert_leaves_the_observation_unchanged():
    """Issue 20: the door experts shift parts of the observation they are given in place. Every scripted expert
    goes through `MetaWorldBackend.expert`, which must hand it a copy: the stored arrays stay as they were."""
    from icmltools.goskill.tasks import MetaWorldBackend, resolve_tasks

    b = MetaWorldBackend()
    rng = np.random.default_rng(0)
    frozen = [rng.uniform(-0.3, 0.9, 39).astype(np.float32) for _ in range(4)]
    changed = []
    for task in resolve_tasks("mt50"):
        expert = b.expert(task)
        for obs in frozen:
            stored = obs.copy()
            a = expert(obs)
            assert a.shape == (4,)
            if not np.array_equal(obs, stored):
                changed.append(task)
                obs[:] = stored
    assert changed == [], f"experts that modified our observation: {sorted(set(changed))}"


@pytest.mark.parametrize("task", ["door-open-v3", "door-close-v3"])
def test_collected_door_episodes_replay_to_the_experts_success(tmp_path, task):
    """The stored observations are the ones the environment produced (replaying the stored actions in an env
    with the collection seed reproduces them exactly), and the expert episode replays to success."""
    from icmltools.goskill.collect import collect, env_seed
    from icmltools.goskill.tasks import MetaWorldBackend

    summary = collect([task], tmp_path / "d", episodes=2, max_steps=100, seed=0)
    assert summary["per_task"][task]["expert_half_success"] == 1.0
    _, eps = D.load_dataset_dir(tmp_path / "d")
    b = MetaWorldBackend()
    env = b.make(task, env_seed(0, task))
    for ep in eps[0]:       # episode i starts at the env's i-th reset
        obs, succ = b.reset(env), []
        assert np.array_equal(obs, ep["observations"][0])
        for t, a in enumerate(ep["actions"]):
            assert np.array_equal(obs, ep["observations"][t]), (task, t)
            obs, _, s = b.step(env, a)
            assert np.array_equal(obs, ep["next_observations"][t]), (task, t)
            succ.append(s)
        assert np.array_equal(np.asarray(succ, np.float32), ep["successes"])
    assert max(succ)        # the last episode is the expert's (quality 1)


# --------------------------------------------------------------------------------------------- issue 11


def _tensors(path):
    from icmltools.core.checkpoint import load_safetensors

    return load_safetensors(path)


def _same_checkpoint(a, b):
    ta, tb = _tensors(a), _tensors(b)
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_a_stage_alone_gives_the_numbers_it_gives_inside_the_pipeline(tmp_path):
    """Every stage draws from derive(seed, "<stage>", ...): run alone (in another folder on the same data, in
    another order, after other torch work) it gives bitwise the checkpoints and scores of the full chain."""
    from icmltools.goskill.collect import collect
    from icmltools.goskill.pipeline import Run, run_pipeline

    full = _toy_run(tmp_path)
    res = run_pipeline(full, list(STAGES), "cpu", methods=("goskill", "mtbc", "mtbc_rtg"))
    alone = Run.create(tmp_path / "alone", full.cfg, seed=0, data_dir=full.root / "data")
    torch.rand(7)                                                  # global torch state must not matter
    run_pipeline(alone, ["baselines"], "cpu", methods=("mtbc_rtg",))
    assert _same_checkpoint(alone.path("mtbc_rtg"), full.path("mtbc_rtg"))
    run_pipeline(alone, ["extract"], "cpu")
    assert _same_checkpoint(alone.path("skill"), full.path("skill"))
    run_pipeline(alone, ["policy"], "cpu")                        # before enhance this time
    assert _same_checkpoint(alone.path("high_level"), full.path("high_level"))
    run_pipeline(alone, ["enhance"], "cpu")
    assert _same_checkpoint(alone.path("skill_enhanced"), full.path("skill_enhanced"))
    ev = run_pipeline(alone, ["evaluate"], "cpu", methods=("goskill",))["methods"][0]
    assert ev["per_task"] == res["methods"][0]["per_task"]
    # collection is keyed by task name: one task alone gives the data it gets among all four
    collect(["toy-c"], tmp_path / "one", episodes=6, max_steps=20, seed=0)
    _, e1 = D.load_dataset_dir(tmp_path / "one")
    _, e4 = D.load_dataset_dir(full.root / "data", ["toy-c"])
    assert all(np.array_equal(a["actions"], b["actions"]) for a, b in zip(e1[0], e4[0]))


def test_resume_reads_pipeline_json_or_an_old_config_json(run_cli, tmp_path):
    """The command owns config.json/result.json; the pipeline's resume state is pipeline.json. A run folder
    from before pipeline.json (state in config.json) still resumes, and gets a pipeline.json."""
    out = tmp_path / "r"
    run_cli(["goskill", "-q", "--tasks", TOY, "--out", str(out), "--stages", "collect", *TINY])
    state = json.loads((out / "pipeline.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "goskill" and cfg["config"] == state["config"] and state["tasks"] == TOY.split(",")
    assert not (out / "result.json").exists() or json.loads((out / "result.json").read_text())["stages_run"]
    # an old folder: the state in config.json, no pipeline.json
    (out / "pipeline.json").unlink()
    (out / "config.json").write_text(json.dumps({"config": state["config"], "seed": 0, "data_dir": None,
                                                 "tasks": state["tasks"]}))
    res, doc = run_cli(["goskill", "-q", "--run-dir", str(out), "--stages", "extract,baselines", "--methods", "mtbc"])
    assert doc["result"]["stages_run"] == ["extract", "baselines"] and doc["seed"] == 0
    assert json.loads((out / "pipeline.json").read_text())["config"] == state["config"]
    assert json.loads((out / "result.json").read_text())["stages_done"] == ["collect", "extract", "baselines"]
    assert doc["artifacts"]["config"].endswith("config.json") and doc["reference"]["arxiv"] == "2507.06628"


def test_task_names_in_any_case(run_cli, tmp_path):
    from icmltools.goskill.tasks import MT10, resolve_tasks

    assert resolve_tasks("MT10") == MT10 and len(resolve_tasks("mt50")) == 50
    assert resolve_tasks("Reach-V3, PUSH-v3") == ["reach-v3", "push-v3"]
    assert resolve_tasks("TOY-A,toy-B") == ["toy-a", "toy-b"]
    res, doc = run_cli(["goskill", "-q", "--tasks", "Toy-A,TOY-B", "--methods", "mtbc", "--out", str(tmp_path / "r"),
                        *TINY])
    assert doc["result"]["tasks"] == ["toy-a", "toy-b"]


def test_usage_conflicts_and_library_messages_name_parameters(run_cli, tmp_path):
    from icmltools.core.errors import BadInputError
    from icmltools.goskill import api

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    for args in (["--run-dir", str(run_dir), "--out", str(tmp_path / "x")],
                 ["--run-dir", str(run_dir), "--preset", "cpu"],
                 ["--run-dir", str(run_dir), "--seed", "3"],
                 ["--data", str(run_dir), "--stages", "collect,extract"],
                 ["--stages", "extract"]):
        res, _ = run_cli(["goskill", "-q", *args], expect_code=2)
        assert _err(res).startswith("Error: --") or "without --data" in _err(res), _err(res)
    for kw, param in ((dict(stages="extract,fly"), "stages"), (dict(methods="mtbc,bc"), "methods"),
                      (dict(overrides={"decoder": "rnn"}), "decoder"), (dict(overrides={"H": 0}), "H"),
                      (dict(stages="extract"), "stages"), (dict(run_dir=run_dir), "run_dir")):
        with pytest.raises(BadInputError) as e:
            api.plan(**kw)
        assert e.value.param == param and "--" not in e.value.message, (kw, e.value.message)


def test_help_names_the_default_preset(run_cli):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    out = CliRunner().invoke(cli, ["goskill", "--help"]).output
    assert "quick (the default" in out and "the quick preset (the default)" in " ".join(out.split())


def test_quiet_means_quiet_metaworld_and_mujoco(run_cli, tmp_path, monkeypatch, capfd):
    """`-q`: nothing on stderr from a MetaWorld run (parallel collection included); MuJoCo's own warnings go to
    the log instead of stdout and ./MUJOCO_LOG.TXT."""
    import mujoco

    from icmltools.goskill.tasks import quiet

    monkeypatch.chdir(tmp_path)
    m = mujoco.MjModel.from_xml_string("<mujoco><worldbody><body><freejoint/><geom size='1'/></body></worldbody>"
                                       "</mujoco>")
    d = mujoco.MjData(m)
    d.qvel[:] = 1e30
    with quiet():
        mujoco.mj_step(m, d)
    assert "WARNING" not in capfd.readouterr().out and not (tmp_path / "MUJOCO_LOG.TXT").exists()
    res, doc = run_cli(["goskill", "-q", "--tasks", "reach-v3,door-open-v3", "--workers", "2", "--out",
                        str(tmp_path / "r"), *TINY])
    assert res.stderr == "" and doc["result"]["tasks"] == ["reach-v3", "door-open-v3"]
    assert capfd.readouterr().err == ""       # file-descriptor level too (C libraries, forked workers)


# --------------------------------------------------------------------------------------------- issue 19
# The bad-input catalogue of goskill: (setup, argv, exit code, a substring of the one stderr line). `setup`
# builds the inputs in the test's folder: a dataset `d/` (episode files written by `_ep`) or a run folder `r/`
# copied from a finished toy run (`r` = every stage done; `c` = collect only; `u` = a run on a user dataset).

SMALL = ["--episodes", "4", "--max-steps", "20", "-H", "5", "--extract-iters", "5", "--enhance-iters", "2",
         "--policy-iters", "2", "--bc-iters", "2", "--eval-episodes", "1"]


def _ep(path, T=12, ds=39, da=4, **arrays):
    """Write one episode file (zeros of the given widths; `arrays` replace or add arrays)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ep = {"observations": np.zeros((T, ds), np.float32), "actions": np.zeros((T, da), np.float32),
          "rewards": np.zeros(T, np.float32), **arrays}
    np.savez(path, **{k: v for k, v in ep.items() if v is not None})


def _edit_json(path, fn):
    path = Path(path)
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _nan_tensor(path):
    from safetensors.torch import load_file, save_file

    t = load_file(str(path))
    k = sorted(t)[0]
    t[k].view(-1)[0] = float("nan")
    save_file(t, str(path))


def _run_cli_quiet(args):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    res = CliRunner().invoke(cli, ["goskill", "-q", "--threads", "1", *args])
    assert res.exit_code == 0, res.stderr
    return res


@pytest.fixture(scope="session")
def toy_runs(tmp_path_factory):
    """Template run folders on toy tasks: `r` every stage done, `c` collect only, `u` extract on a user dataset."""
    root = tmp_path_factory.mktemp("goskill_templates")
    _run_cli_quiet(["--tasks", "toy-a,toy-b", "--out", str(root / "r"), *SMALL])
    _run_cli_quiet(["--tasks", "toy-a,toy-b", "--out", str(root / "c"), "--stages", "collect", *SMALL])
    _run_cli_quiet(["--data", str(root / "c" / "data"), "--out", str(root / "u"), "--stages", "extract", *SMALL])
    return root


def _copy(templates, name, dest="r"):
    import shutil

    shutil.copytree(templates / name, dest)


SETUPS = {
    "none": lambda t: None,
    "empty_npz": lambda t: (Path("d/reach-v3").mkdir(parents=True), Path("d/reach-v3/0.npz").write_bytes(b"")),
    "text_npz": lambda t: (Path("d/reach-v3").mkdir(parents=True), Path("d/reach-v3/0.npz").write_text("hello")),
    "truncated_npz": lambda t: (_ep("d/reach-v3/0.npz"),
                                Path("d/reach-v3/0.npz").write_bytes(Path("d/reach-v3/0.npz").read_bytes()[:300])),
    "no_actions": lambda t: _ep("d/reach-v3/0.npz", actions=None),
    "object_array": lambda t: _ep("d/reach-v3/0.npz", observations=np.array([None] * 12, dtype=object)),
    "complex": lambda t: _ep("d/reach-v3/0.npz", observations=np.zeros((12, 39)) + 1j),
    "3d_obs": lambda t: _ep("d/reach-v3/0.npz", observations=np.zeros((12, 39, 1))),
    "length_mismatch": lambda t: _ep("d/reach-v3/0.npz", actions=np.zeros((11, 4))),
    "zero_steps": lambda t: _ep("d/reach-v3/0.npz", T=0),
    "nan_obs": lambda t: _ep("d/reach-v3/0.npz", observations=np.full((12, 39), np.nan)),
    "inf_reward": lambda t: _ep("d/reach-v3/0.npz", rewards=np.r_[np.zeros(5), np.inf, np.zeros(6)]),
    "huge_obs": lambda t: _ep("d/reach-v3/0.npz", observations=np.full((12, 39), 1e300)),
    "short_successes": lambda t: _ep("d/reach-v3/0.npz", successes=np.zeros(3)),
    "next_obs_shape": lambda t: _ep("d/reach-v3/0.npz", next_observations=np.zeros((12, 38))),
    "narrow_obs": lambda t: _ep("d/reach-v3/0.npz", ds=6),
    "narrow_act": lambda t: _ep("d/reach-v3/0.npz", da=3),
    "toy_metaworld_widths": lambda t: _ep("d/toy-a/0.npz"),
    "widths_across_tasks": lambda t: (_ep("d/bar/0.npz", ds=5), _ep("d/foo/0.npz", ds=6)),
    "unknown_task": lambda t: _ep("d/foo/0.npz"),
    "same_number": lambda t: (_ep("d/reach-v3/0.npz"), _ep("d/reach-v3/00.npz")),
    "task_folder_given": lambda t: _ep("d/0.npz"),
    "no_numbered_episode": lambda t: _ep("d/reach-v3/first.npz"),
    "run": lambda t: _copy(t, "r"),
    "collected": lambda t: _copy(t, "c"),
    "user_data_run": lambda t: _copy(t, "u"),
    "corrupt_state": lambda t: (_copy(t, "r"), Path("r/pipeline.json").write_text("{bad")),
    "state_bad_seed": lambda t: (_copy(t, "r"), _edit_json("r/pipeline.json", lambda d: d.update(seed="x"))),
    "state_bad_type": lambda t: (_copy(t, "r"), _edit_json("r/pipeline.json", lambda d: d["config"].update(H="ten"))),
    "state_bad_value": lambda t: (_copy(t, "r"), _edit_json("r/pipeline.json", lambda d: d["config"].update(H=0))),
    "state_unknown_key": lambda t: (_copy(t, "r"), _edit_json("r/pipeline.json", lambda d: d["config"].update(x=1))),
    "state_missing": lambda t: (_copy(t, "r"), Path("r/pipeline.json").unlink()),
    "other_command": lambda t: (Path("r").mkdir(), Path("r/config.json").write_text('{"command": "negmerge"}')),
    "corrupt_stages": lambda t: (_copy(t, "r"), Path("r/stages.json").write_text("[1]")),
    "task_data_gone": lambda t: (_copy(t, "c"), __import__("shutil").rmtree("r/data/toy-b")),
    "collect_unfinished": lambda t: (_copy(t, "c"), Path("r/stages.json").write_text("{}")),
    "truncated_ckpt": lambda t: (_copy(t, "r"), Path("r/checkpoints/high_level.safetensors").write_bytes(b"xx")),
    "nan_ckpt": lambda t: (_copy(t, "r"), _nan_tensor("r/checkpoints/mtbc.safetensors")),
    "no_high_level": lambda t: (_copy(t, "r"), Path("r/checkpoints/high_level.safetensors").unlink()),
    "user_data_gone": lambda t: (_copy(t, "u"), _edit_json("r/pipeline.json", lambda d: d.update(data_dir="gone"))),
    "out_not_empty": lambda t: (Path("o").mkdir(), Path("o/x").write_text("x")),
}

BAD_INPUTS = [
    # datasets (--data): read and checked before anything is created or trained
    ("empty_npz", ["--data", "d"], 2, "d/reach-v3/0.npz: empty file (0 bytes)"),
    ("text_npz", ["--data", "d"], 2, "d/reach-v3/0.npz: not a .npz archive"),
    ("truncated_npz", ["--data", "d"], 2, "d/reach-v3/0.npz: not a .npz archive"),
    ("no_actions", ["--data", "d"], 2, "0.npz: missing array 'actions'"),
    ("object_array", ["--data", "d"], 2, "0.npz: not a readable .npz episode"),
    ("complex", ["--data", "d"], 2, "observations has dtype complex128"),
    ("3d_obs", ["--data", "d"], 2, "must be 2-D"),
    ("length_mismatch", ["--data", "d"], 2, "must share the episode length"),
    ("zero_steps", ["--data", "d"], 2, "T >= 1"),
    ("nan_obs", ["--data", "d"], 2, "0.npz: observations has non-finite values"),
    ("inf_reward", ["--data", "d"], 2, "rewards has non-finite values (NaN or inf; first at step 5)"),
    ("huge_obs", ["--data", "d"], 2, "observations has values beyond the float32 range"),
    ("short_successes", ["--data", "d"], 2, "successes has 3 entries; the episode has 12 steps"),
    ("next_obs_shape", ["--data", "d"], 2, "next_observations (12, 38) differs"),
    ("narrow_obs", ["--data", "d"], 2, "observations have 6 columns and actions 4; the reach-v3 environment has 39"),
    ("narrow_act", ["--data", "d"], 2, "actions 3; the reach-v3 environment has 39 and 4"),
    ("toy_metaworld_widths", ["--data", "d"], 2, "the toy-a environment has 6 and 2"),
    ("widths_across_tasks", ["--data", "d", "--stages", "extract"], 2, "every episode needs the same widths"),
    ("unknown_task", ["--data", "d"], 2, "task 'foo' of the dataset is not a MetaWorld v3 task"),
    ("same_number", ["--data", "d"], 2, "00.npz: same episode number as 0.npz"),
    ("task_folder_given", ["--data", "d"], 2, "give the folder above it"),
    ("no_numbered_episode", ["--data", "d"], 2, "d/reach-v3: no <i>.npz episodes"),
    ("no_numbered_episode", ["--data", "d", "--tasks", "push-v3"], 2, "no folder for task 'push-v3'"),
    ("none", ["--tasks", "toy-a", "--stages", "policy,collect"], 2, "'collect' comes before 'policy'"),
    ("none", ["--tasks", "toy-a", "--stages", "collect,policy"], 2,
     "the policy stage needs the skill checkpoint, which a new run makes in the extract stage"),
    ("none", ["--stages", "extract,fly"], 2, "unknown 'fly'"),
    ("none", ["--methods", "goskill,bc"], 2, "unknown 'bc'"),
    ("none", ["--run-dir", "nowhere"], 2, "does not exist"),
    ("out_not_empty", ["--tasks", "toy-a", "--out", "o"], 2, "o: directory is not empty"),
    # run folders (--run-dir): state, stage record, data and checkpoints checked before the first stage runs
    ("corrupt_state", ["--run-dir", "r"], 2, "r/pipeline.json: unreadable goskill state"),
    ("state_bad_seed", ["--run-dir", "r"], 2, "seed 'x' is not an integer"),
    ("state_bad_type", ["--run-dir", "r"], 2, "r/pipeline.json: configuration field 'H' is 'ten'; expected int"),
    ("state_bad_value", ["--run-dir", "r"], 2, "r/pipeline.json: configuration field 'H': must be >= 1"),
    ("state_unknown_key", ["--run-dir", "r"], 2, "r/pipeline.json: unknown keys ['x']"),
    ("state_missing", ["--run-dir", "r"], 2, "pipeline.json (the resume state) is missing"),
    ("other_command", ["--run-dir", "r"], 2, "a run folder of `negmerge`, not of goskill"),
    ("corrupt_stages", ["--run-dir", "r"], 2, "r/stages.json: unreadable stage record"),
    ("task_data_gone", ["--run-dir", "r"], 2, "r/data: no folder for task 'toy-b'"),
    ("collect_unfinished", ["--run-dir", "r", "--stages", "extract"], 2, "the collect stage has not finished"),
    ("collected", ["--run-dir", "r", "--stages", "policy"], 2, "skill.safetensors: missing; the policy stage needs it"),
    ("collected", ["--run-dir", "r", "--stages", "extract,evaluate", "--methods", "goskill"], 2,
     "skill_enhanced.safetensors: missing; the evaluate stage needs it"),
    ("no_high_level", ["--run-dir", "r", "--stages", "evaluate", "--methods", "goskill_noenh"], 2,
     "high_level.safetensors: missing"),
    ("truncated_ckpt", ["--run-dir", "r", "--stages", "evaluate"], 2, "corrupt or truncated safetensors file"),
    ("nan_ckpt", ["--run-dir", "r", "--stages", "evaluate", "--methods", "mtbc"], 2,
     "mtbc.safetensors: tensor 'net.0.bias' has non-finite values"),
    ("run", ["--run-dir", "r", "--stages", "policy,extract"], 2, "'extract' comes before 'policy'"),
    ("run", ["--run-dir", "r", "--stages", "baselines"], 2, "running baselines again would leave evaluate"),
    ("run", ["--run-dir", "r", "--stages", "collect,evaluate"], 2, "running collect again would leave extract"),
    ("run", ["--run-dir", "r", "-H", "4"], 2, "--horizon: cannot change 5 to 4: the extract stage"),
    ("run", ["--run-dir", "r", "--stages", "evaluate", "--max-steps", "30"], 2,
     "--max-steps: cannot change 20 to 30: the collect stage"),
    ("run", ["--run-dir", "r", "--tasks", "toy-c"], 2, "a resumed run keeps its tasks (toy-a, toy-b)"),
    ("collected", ["--run-dir", "r", "--episodes", "8"], 2, "--episodes: cannot change 4 to 8: the collect stage"),
    ("user_data_run", ["--run-dir", "r", "--stages", "collect"], 2, "this run reads a user dataset"),
    ("user_data_gone", ["--run-dir", "r"], 2, "gone: the dataset this run was started on is gone"),
]


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("setup,args,code,text", [pytest.param(*row, id=f"{row[0]}:{' '.join(row[1][:4])}")
                                                  for row in BAD_INPUTS])
def test_bad_input_catalogue(setup, args, code, text, toy_runs, tmp_path, monkeypatch, check_bad_input):
    """Exit code, exactly one `Error:` line naming the problem, no traceback, nothing on stdout, and no file
    written or changed (a run folder given with --run-dir is left as it was)."""
    from click.testing import CliRunner

    from icmltools.commands.cli import cli

    monkeypatch.chdir(tmp_path)
    SETUPS[setup](toy_runs)
    before = _snapshot(tmp_path)
    paths = check_bad_input.snapshot(tmp_path)
    res = CliRunner().invoke(cli, ["goskill", "-q", "--threads", "1", *args])
    check_bad_input(res, code, text, root=tmp_path, before=paths)
    assert _snapshot(tmp_path) == before


def _nan_after(fn, n: int):
    """`fn`, returning NaN from its (n+1)-th call on (a loss that turns non-finite mid-training)."""
    calls = []

    def wrapped(*a, **k):
        calls.append(1)
        out = fn(*a, **k)
        return out * float("nan") if len(calls) > n else out
    return wrapped


def test_a_loss_that_turns_non_finite_fails_the_stage_and_saves_nothing_of_it(toy_runs, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from icmltools.commands.cli import cli
    from icmltools.goskill import train as TR

    monkeypatch.chdir(tmp_path)
    _copy(toy_runs, "c")
    before = _snapshot(tmp_path)
    before.pop("r/config.json")                        # the command records each call's parameters there
    monkeypatch.setattr(TR, "_masked_mse", _nan_after(TR._masked_mse, 2))
    res = CliRunner().invoke(cli, ["goskill", "-q", "--threads", "1", "--run-dir", "r", "--stages", "extract"])
    assert res.exit_code == 1, res.stderr
    assert res.stderr.strip() == ("Error: extract: the training loss became nan at step 3 of 5; nothing of this "
                                  "stage was saved (hint: check the data for extreme values, or try another "
                                  "seed or smaller sizes)")
    after = _snapshot(tmp_path)
    assert after.pop("r/config.json") and after == before   # no checkpoint, no stage record, no result
    # baselines: MT-BC trains fine, MT-BC-RTG's loss turns NaN -> neither checkpoint is written
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(TR.F, "mse_loss", _nan_after(TR.F.mse_loss, 2 + 1))
    res = CliRunner().invoke(cli, ["goskill", "-q", "--threads", "1", "--run-dir", "r", "--stages", "baselines"])
    assert res.exit_code == 1 and "baselines (mtbc_rtg): the training loss became nan at step 2 of 2" in res.stderr
    after = _snapshot(tmp_path)
    assert after.pop("r/config.json") and after == before


def _interrupt(tmp_path, args, ready, group=False):
    """Start `icml goskill ARGS` in a subprocess, send SIGINT once `ready()` holds (to its whole process group
    with `group`, as a terminal's Ctrl-C does); returns (exit code, stderr, seconds from the signal to exit)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("ICML_")}
    env["ICML_RUNS_DIR"] = str(tmp_path / "runs")
    p = subprocess.Popen([sys.executable, "-m", "icmltools", "goskill", "--threads", "1", *args], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=group,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.perf_counter()
    while not ready():
        assert p.poll() is None, p.communicate()[1].decode()[-2000:]
        assert time.perf_counter() - t0 < 120, "never got ready"
        time.sleep(0.1)
    time.sleep(0.5)
    t1 = time.perf_counter()
    os.killpg(p.pid, signal.SIGINT) if group else p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL) if group else p.kill()
        p.communicate()
        raise AssertionError("still running 60 s after Ctrl-C") from None
    assert out == b"" and "Traceback" not in err.decode(), err.decode()[-2000:]
    return p.returncode, err.decode(), time.perf_counter() - t1


@pytest.mark.slow
def test_ctrl_c_keeps_finished_stages_to_resume_and_nothing_else(tmp_path):
    """Decision (docs/goskill.md): Ctrl-C in a new run keeps its folder only if a stage finished there (resume it
    with --run-dir); the interrupted stage leaves nothing; with no finished stage the folder is removed."""
    r = tmp_path / "r"
    code, err, dt = _interrupt(tmp_path, ["--tasks", "toy-a,toy-b", "--out", "r", "--extract-iters", "1000000"],
                               lambda: (r / "stages.json").exists())
    assert code == 130 and dt < 15, err
    assert err.strip() == "Error: interrupted: the partial run is kept in r (resume from it)"
    assert json.loads((r / "stages.json").read_text()).keys() == {"collect"}
    assert sorted(p.name for p in r.iterdir()) == ["config.json", "data", "dataset.json", "pipeline.json",
                                                   "stages.json"]
    res = _run_cli_quiet(["--run-dir", str(r), *SMALL[6:]])
    doc = json.loads(res.stdout)["result"]
    assert doc["stages_run"] == list(STAGES[1:]) and doc["stages_done"] == list(STAGES)
    # interrupted while collecting: nothing finished, the folder goes
    code, err, dt = _interrupt(tmp_path, ["--tasks", "toy-a,toy-b", "--out", "c", "--episodes", "100000"],
                               lambda: any((tmp_path / "c").glob("*/*/*.npz")))
    assert code == 130 and dt < 15 and err.strip() == "Error: interrupted (nothing was written)", err
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_ctrl_c_from_a_terminal_stops_parallel_collection_at_once(tmp_path):
    """A terminal's Ctrl-C reaches the workers too: they ignore it, the parent stops and ends them at once. It
    used to wait for the pool, whose workers went on to run the task already queued for them in full (23 s for
    three MetaWorld tasks on two workers; here: minutes)."""
    code, err, dt = _interrupt(tmp_path, ["--tasks", "toy-a,toy-b,toy-c", "--workers", "2", "--episodes", "100000",
                                          "--out", "c"], lambda: any((tmp_path / "c").glob("*/*/*.npz")), group=True)
    assert code == 130 and dt < 15 and err.strip() == "Error: interrupted (nothing was written)", (dt, err)
    import time

    time.sleep(1)
    assert not (tmp_path / "c").exists()
