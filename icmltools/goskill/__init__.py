"""GO-Skill: goal-oriented skill abstraction for offline multi-task RL (He et al., ICML 2025).

Stages: `collect` (scripted MetaWorld experts with a random-to-expert quality ramp, or a user dataset in the
official `<task>/<i>.npz` layout), `extract` (goal encoder + VQ codebook + skill decoder, Sec. 4.1),
`enhance` (class-balanced decoder-only fine-tuning, Sec. 4.2), `policy` (return-conditioned high-level
Prompt-DT over skill steps, Sec. 4.3), `baselines` (MT-BC, MT-BC-RTG) and `evaluate` (vectorised envs).
`icmltools.goskill.pipeline.run_pipeline` chains them in a run directory.
"""
