"""What `icml kpass` calls: transform (stream), check (the estimator checks), demo (the trade-off)."""
from __future__ import annotations

from icmltools.core.errors import BadInputError

from .options import (
    ANSWER_REWARD,
    ESTIMATORS,
    OBJECTIVES,
    ON_ERROR,
    PKPO_ESTIMATORS,
    SCALES,
    DemoConfig,
    TransformConfig,
)


def validate_transform(cfg: TransformConfig) -> None:
    checks = (("objective", OBJECTIVES), ("estimator", ESTIMATORS), ("scale", SCALES), ("on_error", ON_ERROR),
              ("answer_reward", ANSWER_REWARD))
    for name, allowed in checks:
        if getattr(cfg, name) not in allowed:
            raise BadInputError(f"unknown {name} {getattr(cfg, name)!r}", param=name)
    if cfg.estimator in PKPO_ESTIMATORS and cfg.objective != "pass":
        raise BadInputError(f"{cfg.estimator} is defined for the pass objective only", param="estimator")
    if cfg.k is not None and cfg.k < 2:
        raise BadInputError(f"must be at least 2, got {cfg.k}", param="k")


def open_streams(in_path: str, out_path: str):
    """(reader, input name, sink); call before the run guards stdout (the sink may be a copy of fd 1)."""
    from .stream import open_input, open_output

    reader, name = open_input(in_path)
    return reader, name, open_output(out_path)


def transform(cfg: TransformConfig, reader, name: str, sink) -> dict:
    from .stream import transform as run

    validate_transform(cfg)
    return run(cfg, reader, name, sink)


def check(seed: int, quick: bool) -> dict:
    from .checks import run_checks

    return run_checks(seed, quick)


def demo(cfg: DemoConfig, seed: int, progress=None) -> dict:
    from .demo import run_demo

    out = run_demo(cfg, seed, progress)
    return {"config": {"task": cfg.task, "steps": cfg.steps, "k": cfg.k, "batch": cfg.batch, "lr": cfg.lr,
                       "reps": cfg.reps, "runs": list(cfg.runs)}, **out}


def plot(result: dict, path) -> None:
    """pass@1 / pass@k / maj@k curves of the first repetition, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icmltools.core.jsonio import atomic_path

    curves = result["reps"][0]["curves"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    k = result["config"]["k"]
    for ax, key, title in zip(axes, ("pass1", "passk", "majk"), ("pass@1", f"pass@{k}", f"maj@{k}")):
        for name, cv in curves.items():
            ax.plot([p["step"] for p in cv], [p[key] for p in cv], label=name)
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
