"""Choice lists, the configuration and its presets, and the paper: kept once, importable without numpy or
torch (the command imports this module at load time; `icml goskill --help` stays fast)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from icmltools.core.reference import paper

REFERENCE = paper(
    "Goal-Oriented Skill Abstraction for Offline Multi-Task Reinforcement Learning",
    "Jinmin He, Kai Li, Yifan Zang, Haobo Fu, Qiang Fu, Junliang Xing, Jian Cheng",
    arxiv="2507.06628", code="https://github.com/DarkDawn233/GoSkill")

STAGES = ("collect", "extract", "enhance", "policy", "baselines", "evaluate")
METHODS = ("goskill", "goskill_noenh", "mtbc", "mtbc_rtg")
DEFAULT_METHODS = ("goskill", "mtbc", "mtbc_rtg")
BASELINES = ("mtbc", "mtbc_rtg")
DECODERS = ("transformer", "mlp")
CONDITIONINGS = ("prompt", "task")
SPLITS = ("near", "sub")
TASK_SETS = ("mt10", "mt50")


@dataclass(frozen=True)
class GoSkillConfig:
    preset: str = "quick"
    tasks: str = "mt10"
    episodes: int = 20              # collected episodes per task (quality ramp random -> expert)
    max_steps: int = 150            # episode length for collection and evaluation
    split: str = "near"             # near = all episodes, sub = first half
    workers: int = 1
    H: int = 10                     # skill horizon (goal = s_{t+H} - s_t)
    n_codes: int = 16
    vq_dim: int = 64
    vq_decay: float = 0.8
    commitment: float = 1.0
    kmeans_init: bool = True
    enc_hidden: int = 128
    enc_layers: int = 3
    decoder: str = "transformer"    # transformer (paper) | mlp
    dec_hidden: int = 64
    dec_layers: int = 2
    dec_heads: int = 4
    hl_hidden: int = 64
    hl_layers: int = 2
    hl_heads: int = 4
    context: int = 8                # skill steps seen by the high level (paper: 20)
    prompt_len: int = 5             # skill steps of the trajectory prompt (paper: 10)
    prompt_pool: int = 3            # highest-return episodes per task used as prompts
    conditioning: str = "prompt"    # prompt | task
    dropout: float = 0.1
    lr: float = 3e-4
    weight_decay: float = 1e-4
    warmup: int = 200
    grad_clip: float = 1.0
    extract_iters: int = 500
    extract_batch: int = 64
    enhance_iters: int = 600        # official: one decoder-only step per high-level step (= policy_iters)
    enhance_per_code: int = 0       # windows per used code in a balanced batch; 0 = extract_batch // used codes
    policy_iters: int = 600
    policy_batch: int = 16
    bc_iters: int = 800
    bc_batch: int = 256
    bc_hidden: int = 256
    eval_episodes: int = 3
    envs_per_task: int = 1
    rtg_scale: float = 0.0          # 0 = 10 * max_steps (MetaWorld rewards are <= 10 per step)
    max_ep_len: int = 1000

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def scale(self) -> float:
        return float(self.rtg_scale) if self.rtg_scale > 0 else 10.0 * self.max_steps


# Each preset overrides these fields of GoSkillConfig; `quick` is the bare command.
PRESETS = {
    "quick": {},
    "cpu": dict(episodes=40, max_steps=200, context=20, prompt_len=10, enc_hidden=256, dec_hidden=128, hl_hidden=128,
                extract_iters=2000, extract_batch=64, enhance_iters=1500, policy_iters=1500, policy_batch=16,
                bc_iters=2000, eval_episodes=10, warmup=300),
    "gpu": dict(episodes=200, max_steps=500, context=20, prompt_len=10, enc_hidden=256, dec_hidden=256, dec_layers=6,
                dec_heads=8, hl_hidden=256, hl_layers=6, hl_heads=8, extract_iters=30000, extract_batch=16 * 10,
                enhance_iters=70000, policy_iters=70000, policy_batch=8 * 10,
                bc_iters=30000, bc_batch=1024, warmup=5000, eval_episodes=50, envs_per_task=10, workers=4),
}
PRESET_NAMES = tuple(PRESETS)
DEFAULT_PRESET = GoSkillConfig.preset
