"""Optional plot: rounds to eps against the coupling, one line per method and K (matplotlib, lazily)."""
from __future__ import annotations

from pathlib import Path

from icmltools.core.errors import BadInputError, MissingDependencyError
from icmltools.core.jsonio import atomic_path


def plot_rounds(result: dict, path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingDependencyError("needs matplotlib", hint="pip install matplotlib", param="plot") from e
    rows = [r for r in result["results"] if r["coupling"] is not None]
    if not rows:
        raise BadInputError("a plot needs the coupling sweep of a built-in game", param="plot")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key in sorted({(r["method"], r["K"], r.get("sigma_off")) for r in rows}, key=str):
        pts = [(r["coupling"], r["rounds_to_eps"]) for r in rows
               if (r["method"], r["K"], r.get("sigma_off")) == key and r["rounds_to_eps"]]
        if pts:
            label = key[0] + (f" K={key[1]}" if key[1] > 1 else "")
            ax.plot(*zip(*pts), marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("coupling c = ||C||_2")
    ax.set_ylabel("communication rounds to eps")
    ax.set_title(f"dsgda: {result['config']['game']}, eps = {result['config']['eps']:g}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    path = Path(path)
    with atomic_path(path, suffix=".tmp" + path.suffix) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
