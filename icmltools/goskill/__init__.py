"""GO-Skill: Jinmin He, Kai Li, Yifan Zang, Haobo Fu, Qiang Fu, Junliang Xing, Jian Cheng, "Goal-Oriented Skill
Abstraction for Offline Multi-Task Reinforcement Learning", ICML 2025, arXiv:2507.06628 (official code:
github.com/DarkDawn233/GoSkill). The record is `options.REFERENCE`.

Stages: `collect` (scripted MetaWorld experts with a random-to-expert quality ramp, or a user dataset in the
official `<task>/<i>.npz` layout), `extract` (goal encoder + VQ codebook + skill decoder, Sec. 4.1 and
Algorithm 1), `enhance` (class-balanced decoder-only fine-tuning, Sec. 4.2, Algorithm 1), `policy`
(return-conditioned high-level Prompt-DT over skill steps, Sec. 4.3, Algorithm 2), `baselines` (MT-BC,
MT-BC-RTG) and `evaluate` (vectorised envs). `icmltools.goskill.api` plans and runs them in a run folder.

Importing this package is cheap (no numpy/torch): `options` holds the choice lists and the configuration.
"""
