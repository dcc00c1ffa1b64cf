"""``grads --plot FILE.png``: the gradient-flow chart, one bar per parameterized layer.

Bars follow the forward order of the layers that own trainable parameters,
with their grad_norm on a log axis. A layer whose gradient is zero gets a
marker at the bottom of the axis, a non-finite one a marker at the top, an
unused one (no gradient at all) a grey marker; the legend says which is which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookcli.errors import UsageError
from hookcli.plot import require_matplotlib


@dataclass(frozen=True)
class FlowPoint:
    """One layer of the chart: its label and grad_norm (None: no gradient arrived)."""

    label: str
    grad_norm: float | None


def check_plot_path(path: Path) -> None:
    """Exit 2 before any work when ``path`` cannot take the chart: not a ``.png`` name (the
    chart is PNG bytes), or a path ``-o`` would refuse too (``atomic.check_target``)."""
    from hookcli.atomic import check_target

    if str(path) != "-" and path.suffix.lower() != ".png":
        raise UsageError(
            f"--plot {path}: the chart is a PNG; give a file name ending in .png, e.g. flow.png"
        )
    check_target(path, "--plot")


def plot_gradflow(points: Sequence[FlowPoint], path: Path, title: str) -> Path:
    """Draw the chart and save it as a PNG at ``path``; exit 2 if it cannot be written."""
    from hookcli.atomic import atomic_write

    plt = require_matplotlib()
    n = len(points)
    width = min(max(6.0, 0.22 * n + 2.0), 40.0)
    fig, ax = plt.subplots(figsize=(width, 4.8), dpi=100)
    try:
        _draw(ax, points, title)
        fig.tight_layout()
        # atomically, as -o: a failed write leaves no half chart and any old file as it was
        atomic_write(path, lambda f: fig.savefig(f, format="png"), "--plot")
    finally:
        plt.close(fig)
    return path


def _draw(ax: Any, points: Sequence[FlowPoint], title: str) -> None:
    xs = list(range(len(points)))
    finite = [p.grad_norm for p in points if p.grad_norm is not None and math.isfinite(p.grad_norm)]
    positive = [v for v in finite if v > 0]
    low = min(positive) if positive else 1e-8
    high = max(positive) if positive else 1.0
    bottom = low / 10.0  # zero-grad markers sit here
    top = high * 10.0  # non-finite markers sit here
    heights = [
        p.grad_norm
        if p.grad_norm is not None and math.isfinite(p.grad_norm) and p.grad_norm > 0
        else 0.0
        for p in points
    ]
    shown = [i for i, h in enumerate(heights) if h > 0]
    labelled = bool(shown)
    if shown:
        ax.bar(shown, [heights[i] for i in shown], color="#4878d0", width=0.8, label="grad_norm")
    groups = {
        "zero": ([i for i, p in enumerate(points) if p.grad_norm == 0.0], bottom, "v", "#ee8866"),
        "nan / inf": (
            [
                i
                for i, p in enumerate(points)
                if p.grad_norm is not None and not math.isfinite(p.grad_norm)
            ],
            top,
            "X",
            "#d62728",
        ),
        "unused (no grad)": (
            [i for i, p in enumerate(points) if p.grad_norm is None],
            bottom,
            "o",
            "#999999",
        ),
    }
    for label, (idx, y, marker, color) in groups.items():
        if idx:
            labelled = True
            ax.scatter(
                idx,
                [y] * len(idx),
                marker=marker,
                color=color,
                s=60,
                zorder=3,
                label=label,
            )
    for i, p in enumerate(points):
        g = p.grad_norm
        if g is not None and (g == 0.0 or not math.isfinite(g)):
            text = "0" if g == 0.0 else "nan" if math.isnan(g) else "inf"
            y = bottom if g == 0.0 else top
            ax.annotate(
                text, (i, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7
            )
    ax.set_yscale("log")
    ax.set_ylim(bottom / 3.0, top * 3.0)
    ax.set_xlim(-0.8, max(len(points) - 0.2, 0.8))
    ax.set_xticks(xs)
    fontsize = 8 if len(points) <= 40 else 6 if len(points) <= 100 else 4
    ax.set_xticklabels([p.label for p in points], rotation=90, fontsize=fontsize)
    ax.set_ylabel("grad norm (L2, log scale)")
    ax.set_xlabel("layers with parameters, forward order")
    ax.set_title(title)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    if labelled:
        ax.legend(loc="upper right", fontsize=8)
