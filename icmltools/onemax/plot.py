"""Optional plot of the worst-case profiles g(e) (matplotlib, imported lazily; written atomically)."""
from __future__ import annotations

from pathlib import Path

from icmltools.core.errors import MissingDependencyError
from icmltools.core.jsonio import atomic_path


def plot_profiles(report: dict, path: str | Path) -> Path:
    """Ratio (ALG/OPT) against prediction error E for each algorithm, with the smoothness bound."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingDependencyError("needs matplotlib", hint="pip install 'icml-tools[plot]'",
                                     param="plot") from e
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for alg in report["algorithms"]:
        xs = [p["error"] for p in alg["profile"]]
        ys = [p["ratio"] for p in alg["profile"]]
        ax.step(xs, ys, where="post", label=alg["name"])
    b = report["smoothness_bound"]
    ax.plot([p["error"] for p in b], [p["ratio"] for p in b], "k--", lw=1, label="max(r, c E^s*)")
    ax.set_xlabel("prediction quality E = min(y/p*, p*/y)")
    ax.set_ylabel("worst-case ALG/OPT over instances with error >= E")
    ax.set_title(f"one-max search, theta = {report['theta']:g}, r = {report['target_robustness']:.4f}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path = Path(path)
    with atomic_path(path, suffix=".tmp" + path.suffix) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
