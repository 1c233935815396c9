"""Vectorised evaluation: one batch of environments (envs_per_task per task) stepped in lock-step, the policy
called once per step for the whole batch. Success = success at any time within the episode (MetaWorld's
protocol); return = the undiscounted episode return."""
from __future__ import annotations

import numpy as np
import torch

from icmltools.core.seed import derive

from .models import BCPolicy, HighLevelPolicy, SkillModel


class BCAgent:
    def __init__(self, policy: BCPolicy, mean, std, targets, scale, device):
        self.p, self.mean, self.std, self.targets, self.scale, self.device = policy.eval(), mean, std, targets, scale, device

    def reset(self, task_ids: np.ndarray):
        self.task = torch.as_tensor(task_ids, device=self.device)
        self.acc = np.zeros(len(task_ids))
        self.tids = task_ids

    @torch.no_grad()
    def act(self, obs: np.ndarray, t: int) -> np.ndarray:
        s = torch.as_tensor((obs - self.mean) / self.std, dtype=torch.float32, device=self.device)
        rtg = torch.as_tensor((self.targets[self.tids] - self.acc) / self.scale, dtype=torch.float32,
                              device=self.device)
        return self.p(s, self.task, rtg).cpu().numpy()

    def observe(self, rewards: np.ndarray):
        self.acc += rewards


class GoSkillAgent:
    """Hierarchical rollout: every H steps the high level picks argmax code from the last `context` skill
    steps (with the task's trajectory prompt); the skill decoder emits the H actions of that skill."""

    def __init__(self, hl: HighLevelPolicy, skill: SkillModel, cfg, mean, std, targets, prompts, device,
                 act_dim: int):
        self.hl, self.skill, self.act_dim = hl.eval(), skill.eval(), act_dim
        self.cfg, self.mean, self.std, self.targets, self.device = cfg, mean, std, targets, device
        self.prompts = prompts  # per task: (s, codes, r, ts, mask) numpy arrays
        self.decisions = 0

    def reset(self, task_ids: np.ndarray):
        self.tids = np.asarray(task_ids)
        self.acc = np.zeros(len(task_ids))
        self.S, self.C, self.R, self.T = [], [], [], []   # skill-step history
        self.code = None
        self.in_s, self.in_a = [], []

    def _prompt(self):
        if self.cfg.conditioning != "prompt":
            return None
        ps, pc, pr, pts, pm = [np.stack(x) for x in zip(*[self.prompts[int(t)] for t in self.tids])]
        d = self.device
        pz = self.skill.vq.lookup(torch.as_tensor(pc, device=d)) * torch.as_tensor(pm, device=d)[..., None]
        return (torch.as_tensor(ps, device=d), pz, torch.as_tensor(pr, device=d), torch.as_tensor(pts, device=d),
                torch.as_tensor(pm, device=d))

    @torch.no_grad()
    def _choose(self, s: np.ndarray, t: int) -> torch.Tensor:
        cfg, d, n = self.cfg, self.device, len(self.tids)
        self.S.append(s)
        self.R.append((self.targets[self.tids] - self.acc) / cfg.scale)
        self.T.append(np.full(n, min(t // cfg.H, cfg.max_ep_len - 1)))  # skill-step index (official)
        self.C.append(np.zeros(n, dtype=np.int64))  # the current code slot comes after the state token
        L = min(len(self.S), cfg.context)
        pad = cfg.context - L
        S = np.stack(self.S[-L:], 1)
        S = np.concatenate([np.zeros((n, pad, S.shape[2]), np.float32), S], 1)
        C = np.concatenate([np.zeros((n, pad), np.int64), np.stack(self.C[-L:], 1)], 1)
        R = np.concatenate([np.zeros((n, pad)), np.stack(self.R[-L:], 1)], 1)[..., None].astype(np.float32)
        T = np.concatenate([np.zeros((n, pad), np.int64), np.stack(self.T[-L:], 1)], 1)
        M = np.concatenate([np.zeros((n, pad)), np.ones((n, L))], 1).astype(np.float32)
        Mt = torch.as_tensor(M, device=d)
        Z = self.skill.vq.lookup(torch.as_tensor(C, device=d)) * Mt[..., None]
        logits = self.hl(torch.as_tensor(S, device=d), Z, torch.as_tensor(R, device=d), torch.as_tensor(T, device=d),
                         Mt, prompt=self._prompt(), task=torch.as_tensor(self.tids, device=d))
        code = logits[:, -1].argmax(-1)
        self.C[-1] = code.cpu().numpy()
        self.decisions += 1
        return code

    @torch.no_grad()
    def act(self, obs: np.ndarray, t: int, code: torch.Tensor | None = None) -> np.ndarray:
        """One action per env. At a skill start (t % H == 0) the high level picks the code, unless `code` is
        given (diagnostics: drive the decoder with an oracle code); in between the decoder sees the in-skill
        history."""
        H, d = self.cfg.H, self.device
        s = ((obs - self.mean) / self.std).astype(np.float32)
        k = t % H
        if k == 0:
            self.code = self._choose(s, t) if code is None else code.to(d)
            self.in_s, self.in_a = [], []
        self.in_s.append(torch.as_tensor(s, device=d))
        S = torch.stack(self.in_s, 1)
        A = torch.stack(self.in_a, 1) if self.in_a else S.new_zeros(len(s), 0, self.act_dim)
        a = self.skill.act(self.code, S, A, k)
        self.in_a.append(a)
        return a.cpu().numpy()

    def observe(self, rewards: np.ndarray):
        self.acc += rewards


def evaluate(agent, backend, tasks: list[str], episodes: int, max_steps: int, seed: int, envs_per_task: int = 1,
             envs=None, progress=None, desc: str = "evaluate") -> dict:
    """Run `episodes` episodes per task; returns per-task success rate and mean return. Shared `envs` are
    rewound to their seeds first, so every method evaluated on them faces the same goals."""
    E = max(1, min(envs_per_task, episodes))
    if envs is None:
        envs = build_envs(backend, tasks, E, seed)
    slots = [(k, env) for k, row in enumerate(envs) for env in row[:E]]
    for _, env in slots:
        backend.reseed(env)
    tids = np.array([k for k, _ in slots])
    succ = [[] for _ in tasks]
    rets = [[] for _ in tasks]
    rounds = -(-episodes // E)
    for rd in range(rounds):
        obs = np.stack([backend.reset(env) for _, env in slots]).astype(np.float32)
        agent.reset(tids)
        done_s = np.zeros(len(slots), bool)
        ret = np.zeros(len(slots))
        for t in range(max_steps):
            act = agent.act(obs, t)
            rew = np.zeros(len(slots))
            nxt = []
            for i, (_, env) in enumerate(slots):
                o, r, s = backend.step(env, act[i])
                nxt.append(o)
                rew[i] = r
                done_s[i] |= s
            obs = np.stack(nxt).astype(np.float32)
            ret += rew
            agent.observe(rew)
        for j, (k, _) in enumerate(slots):
            ep_index = rd * E + _slot_rank(j, tids)
            if ep_index < episodes:
                succ[k].append(float(done_s[j]))
                rets[k].append(float(ret[j]))
        if progress:
            progress(desc, rd + 1, rounds)
    per_task = {t: {"success": float(np.mean(succ[k])), "return": float(np.mean(rets[k])), "episodes": len(succ[k])}
                for k, t in enumerate(tasks)}
    return {"success": float(np.mean([v["success"] for v in per_task.values()])),
            "return": float(np.mean([v["return"] for v in per_task.values()])), "per_task": per_task}


def _slot_rank(j: int, tids: np.ndarray) -> int:
    return int(np.sum(tids[:j] == tids[j]))


def build_envs(backend, tasks, per_task: int, seed: int):
    """`per_task` environments per task, env j of task t seeded from derive(seed, "evaluate", t, j): the goals a
    task is evaluated on depend on the seed and the task, not on the other tasks of the run."""
    return [[backend.make(t, derive(seed, "evaluate", t, j).int(31)) for j in range(per_task)] for t in tasks]
