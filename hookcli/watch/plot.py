"""``watch --plot FILE.png``: the run at a glance.

Per watched model, a heatmap of log10 grad norm, modules (with stepped parameters, in
model order) x logged steps; a non-finite cell is drawn in red, a module without a
gradient that step in grey. Below, the loss and the total grad norm (log scale) over
every step, one line per model. The figures are those of the first process (rank 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hookcli.fmt import number
from hookcli.plot import require_matplotlib
from hookcli.watch.merge import Process
from hookcli.watch.summary import models_of


def _grid(
    process: Process, label: str, record: dict[str, Any]
) -> tuple[list[str], list[int], list[list[float | None]]]:
    """Module names, logged steps and grad norms (rows: modules, columns: steps)."""
    names = [str(m.get("name", "")) for m in record.get("modules") or [] if m.get("stepped")]
    steps = [s for s in process.steps.get(label, []) if "modules" in s]
    grid = [[number((s["modules"].get(n) or {}).get("grad_norm")) for s in steps] for n in names]
    return names, [int(s["step"]) for s in steps], grid


def plot_run(processes: Sequence[Process], path: Path, title: str) -> Path:
    """Draw the chart and save it as a PNG at ``path`` (atomically, as ``-o``)."""
    from hookcli.atomic import atomic_write

    plt = require_matplotlib()
    import numpy as np

    models = models_of(processes)
    panels = []
    for label, record in models:
        owner = next((p for p in processes if label in p.steps), None)
        if owner is not None:
            panels.append((label, owner, *_grid(owner, label, record)))
    heights = [max(2.0, 0.16 * len(p[2]) + 1.2) for p in panels] + [2.2, 2.2]
    n_rows = max(1, max((len(p[2]) for p in panels), default=1))
    width = 11.0 if n_rows < 60 else 14.0
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(width, sum(heights) + 0.6),
        dpi=100,
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    axes = [a[0] for a in axes]
    try:
        for ax, (label, _, names, steps, grid) in zip(axes, panels, strict=False):
            values = np.array(
                [
                    [
                        math.log10(v) if v is not None and math.isfinite(v) and v > 0 else np.nan
                        for v in row
                    ]
                    for row in grid
                ]
                or [[np.nan]],
                dtype=float,
            )
            cmap = plt.get_cmap("viridis").copy()
            cmap.set_bad("#bbbbbb")
            image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap=cmap)
            for i, row in enumerate(grid):
                for j, v in enumerate(row):
                    if v is not None and not math.isfinite(v):
                        ax.add_patch(
                            plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color="#d62728", zorder=2)
                        )
            fig.colorbar(image, ax=ax, label="log10 grad norm", pad=0.01)
            ax.set_yticks(range(len(names)))
            size = 7 if len(names) <= 40 else 5 if len(names) <= 100 else 3
            ax.set_yticklabels([n or "(root)" for n in names], fontsize=size)
            ticks = list(range(len(steps)))
            if len(ticks) > 20:
                stride = math.ceil(len(ticks) / 20)
                ticks = ticks[::stride]
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(steps[t]) for t in ticks], fontsize=7)
            ax.set_xlabel("step (logged steps: the first, then every --every)")
            ax.set_title(f"{label}: per-module grad norm (red: NaN/Inf, grey: no gradient)")
        loss_ax, grad_ax = axes[len(panels)], axes[len(panels) + 1]
        for label, owner, *_ in panels:
            records = owner.steps.get(label, [])
            xs = [int(s["step"]) for s in records]
            loss_ax.plot(xs, [_nan(s.get("loss")) for s in records], label=label, linewidth=1)
            grad_ax.plot(xs, [_nan(s.get("grad_norm")) for s in records], label=label, linewidth=1)
        last = max(
            (int(r["step"]) for label, owner, *_ in panels for r in owner.steps.get(label, [])),
            default=1,
        )
        for label, owner, *_ in panels:
            bad = [e for e in owner.events if e.get("model") == label]
            if bad:  # where the first NaN/Inf came: the lines stop there
                step = min(int(e["step"]) for e in bad)
                for ax in (loss_ax, grad_ax):
                    ax.axvline(step, color="#d62728", linestyle="--", linewidth=1)
                    ax.annotate(
                        f"first NaN/Inf ({label})" if len(panels) > 1 else "first NaN/Inf",
                        (step, 1.0),
                        xycoords=("data", "axes fraction"),
                        xytext=(3, -10),
                        textcoords="offset points",
                        color="#d62728",
                        fontsize=7,
                    )
        for ax in (loss_ax, grad_ax):
            ax.set_xlim(0.5, max(last, 1) + 0.5)
        loss_ax.set_ylabel("loss")
        grad_ax.set_ylabel("total grad norm")
        grad_ax.set_xlabel("step")
        if any(_positive(line.get_ydata()) for line in grad_ax.get_lines()):
            grad_ax.set_yscale("log")
        for ax in (loss_ax, grad_ax):
            ax.grid(True, alpha=0.3)
            if len(panels) > 1:
                ax.legend(fontsize=7)
        fig.suptitle(f"hookcli watch {title}", fontsize=9)
        fig.tight_layout()
        atomic_write(path, lambda f: fig.savefig(f, format="png"), "--plot")
    finally:
        plt.close(fig)
    return path


def _nan(value: Any) -> float:
    v = number(value)
    return math.nan if v is None else v


def _positive(values: Any) -> bool:
    return any(math.isfinite(v) and v > 0 for v in values)
