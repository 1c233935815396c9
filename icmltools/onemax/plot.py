"""Optional plot of the exact worst-case profiles g(E) (matplotlib, imported lazily; written atomically).

The curves come from `worstcase.plot_curves`: exact values on one common grid of E refined around every
jump, drawn as straight segments between exact vertices (a jump is a vertical segment at its E), never as
steps. Curves that coincide, wholly (ora and robust-mix; smooth and the smoothness bound) or on a stretch (sun and
smooth at r), are drawn with distinct dash patterns and widths; a curve identical to an earlier one says so
in the legend.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from icmltools.core.errors import BadInputError, MissingDependencyError
from icmltools.core.jsonio import atomic_path

_DASHES = ["-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2))]
X_LABEL = "prediction quality E = min(y/p*, p*/y)   (1 = exact prediction)"
Y_LABEL = "worst ALG/OPT among instances with quality >= E"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingDependencyError("needs matplotlib", hint="pip install 'icml-tools[plot]'", param="plot") from e
    return plt


def _format(path: Path) -> str:
    return path.suffix.lstrip(".").lower() or "png"


def check_target(path: str | Path) -> None:
    """Before any work: matplotlib is installed and it can write the file's format (by its suffix)."""
    plt = _pyplot()
    fig = plt.figure()
    try:
        known = fig.canvas.get_supported_filetypes()
    finally:
        plt.close(fig)
    fmt = _format(Path(path))
    if fmt not in known:
        raise BadInputError(f"{path}: cannot write format {fmt!r}; use a suffix among {', '.join(sorted(known))}",
                            param="plot")


def coincident_groups(curves: dict[str, np.ndarray], rtol: float = 1e-9) -> dict[str, str]:
    """{name: the first curve it coincides with (within rtol at every vertex)}; first curves map to nothing."""
    same: dict[str, str] = {}
    names = list(curves)
    for i, a in enumerate(names):
        for b in names[:i]:
            if b not in same and np.allclose(curves[a], curves[b], rtol=rtol, atol=0):
                same[a] = b
                break
    return same


def _overlap(e: np.ndarray, a: np.ndarray, b: np.ndarray, rtol: float = 1e-9) -> float:
    """Length of the E-range on which two polylines coincide (segments whose both ends agree)."""
    eq = np.isclose(a, b, rtol=rtol, atol=0)
    return float(np.sum(np.diff(e)[eq[:-1] & eq[1:]]))


def _styles(e: np.ndarray, lines: dict[str, np.ndarray]) -> dict[str, dict]:
    """Line style per curve so that curves sharing a stretch of the plot (fully or in part: sun and smooth at r,
    ora and robust-mix everywhere) stay distinguishable: a greedy colouring of the overlap graph gives each
    curve a rank, rank 0 is drawn wide and solid at the bottom, higher ranks thinner, dashed and on top."""
    names = list(lines)
    rank: dict[str, int] = {}
    touches = {n: False for n in names}
    for i, a in enumerate(names):
        taken = set()
        for b in names[:i]:
            if _overlap(e, lines[a], lines[b]) >= 0.01:
                taken.add(rank[b])
                touches[a] = touches[b] = True
        rank[a] = min(k for k in range(len(names) + 1) if k not in taken)
    widths = [3.8, 2.4, 1.5, 1.0]
    return {n: {"linestyle": _DASHES[rank[n] % len(_DASHES)], "zorder": 2 + rank[n],
                "linewidth": widths[min(rank[n], 3)] if touches[n] else 1.8} for n in names}


def figure(curves: dict, theta_note: str = ""):
    """The matplotlib figure of `worstcase.plot_curves` output (returned for tests; `plot_profiles` saves it)."""
    plt = _pyplot()
    e = np.asarray(curves["error"])
    lines = dict(curves["curves"])
    lines["bound max(r, c E^s*)"] = np.asarray(curves["bound"])
    same = coincident_groups(lines)
    styles = _styles(e, lines)
    fig, ax = plt.subplots(figsize=(7.2, 4.8))
    for name, g in lines.items():
        label = name + (f"  (same curve as {same[name]})" if name in same else "")
        kw = dict(styles[name], label=label)
        if name.startswith("bound"):
            kw["color"] = "black"
        ax.plot(e, g, **kw)
    lowest = min(float(np.min(g)) for g in lines.values())
    if lowest < 0.02:
        ax.set_yscale("log")
    ax.set_xlim(0.0, 1.005)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL + (" (log scale)" if lowest < 0.02 else ""))
    theta = f"theta = {curves['theta']:.6g}" + (f": {theta_note}" if theta_note else "")
    ax.set_title(f"one-max search: exact worst-case profiles, r = {curves['robustness']:.4g}, "
                 f"c = {curves['consistency']:.4g}\n{theta}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_profiles(curves: dict, path: str | Path, theta_note: str = "") -> Path:
    """Write the figure of `worstcase.plot_curves(...)` to `path` (format from the suffix, PNG without one)."""
    plt = _pyplot()
    fig = figure(curves, theta_note)
    path = Path(path)
    try:
        with atomic_path(path, suffix=".tmp" + path.suffix) as tmp:
            fig.savefig(tmp, dpi=120, format=_format(path))
    finally:
        plt.close(fig)
    return path
