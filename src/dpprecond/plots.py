"""Figures shared by the CLI, the benchmarks and the experiment reports (matplotlib, Agg).

One function draws every line figure of the project, so the PCA sweeps and the federated
accuracy curves look alike. Files are written only where the caller says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Series", "line_figure"]

#: name -> (x values, y mean, y spread or None)
Series = Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float] | None]]


def line_figure(panels: Mapping[str, Series], path: str | os.PathLike, *, xlabel: str,
                ylabel: str, logx: bool = False, logy: bool = False,
                ncols: int | None = None, suptitle: str | None = None) -> Path:
    """Write one PNG with a panel per entry of ``panels`` and a line per series.

    Parameters
    ----------
    panels : mapping of panel title -> mapping of series name -> (x, y, spread)
        ``spread`` (e.g. a standard deviation over seeds) is drawn as a band.
    path : path-like
        Output PNG file (parent directories are created).
    xlabel, ylabel : str
        Axis labels (shared by all panels).
    logx, logy : bool
        Logarithmic axes.
    ncols : int, optional
        Panels per row (default: up to 3).
    suptitle : str, optional
        Figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = max(1, len(panels))
    ncols = ncols or min(3, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
    # one colour per series name across all panels (panels may hold different series)
    names = list(dict.fromkeys(name for series in panels.values() for name in series))
    # ten strong colours, then the light shades of tab20
    tab10, tab20 = plt.get_cmap("tab10"), plt.get_cmap("tab20")
    palette = [tab10(i) for i in range(10)] + [tab20(i) for i in range(1, 20, 2)]
    colour = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    handles: dict[str, Any] = {}
    for ax, (title, series) in zip(axes.ravel(), panels.items(), strict=False):
        for name, (x, y, spread) in series.items():
            x_arr, y_arr = np.asarray(x, float), np.asarray(y, float)
            (line,) = ax.plot(x_arr, y_arr, marker="o", ms=3, label=name, color=colour[name])
            handles.setdefault(name, line)
            if spread is not None:
                s = np.asarray(spread, float)
                ax.fill_between(x_arr, y_arr - s, y_arr + s, alpha=0.2, color=colour[name])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    fig.legend([handles[m] for m in names], names, loc="lower center",
               ncol=max(1, min(len(names), 6)), fontsize=8, bbox_to_anchor=(0.5, 0.0))
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    legend_rows = -(-len(names) // 6)
    bottom = max(0.06, 0.075 * legend_rows / nrows)  # room for the legend below the panels
    fig.tight_layout(rect=(0, bottom, 1, 0.97 if suptitle else 1))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
