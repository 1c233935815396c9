"""Optional plot: rounds to eps against the coupling (noisy game: final error against the off-diagonal noise), one line per method and K (matplotlib, lazily)."""
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
    if "sigma_off" in rows[0]:
        _noise_panel(ax, rows)
    else:
        _rounds_panel(ax, rows)
    ax.set_title(f"dsgda: {result['config']['game']}, eps = {result['config']['eps']:g}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    path = Path(path)
    with atomic_path(path, suffix=".tmp" + path.suffix) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path


def _label(method, K):
    return method + (f" K={K}" if K > 1 else "")


def _noise_panel(ax, rows):
    """Noisy game: final error against the off-diagonal noise level."""
    for key in sorted({(r["method"], r["K"], r["coupling"]) for r in rows}, key=str):
        pts = [(r["sigma_off"], r["final_rel_err"]) for r in rows
               if (r["method"], r["K"], r["coupling"]) == key and r["final_rel_err"] is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=_label(*key[:2]) + f" c={key[2]:g}")
    ax.set_yscale("log")
    ax.set_xlabel("off-diagonal noise sigma")
    ax.set_ylabel("mean ||x - x*|| / ||x0 - x*||, last rounds")


def _rounds_panel(ax, rows):
    """Deterministic games: rounds to eps against the coupling."""
    for key in sorted({(r["method"], r["K"], r.get("sigma_off")) for r in rows}, key=str):
        pts = [(r["coupling"], r["rounds_to_eps"]) for r in rows
               if (r["method"], r["K"], r.get("sigma_off")) == key and r["rounds_to_eps"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=_label(key[0], key[1]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("coupling c = ||C||_2 (dirac-gan: lambda)")
    ax.set_ylabel("communication rounds to eps")
