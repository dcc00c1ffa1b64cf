"""``features --png``: a grid of feature maps, one panel per captured tensor.

A 4-D map ``[N, C, H, W]`` shows the first ``channels`` channels of sample 0,
each normalized to its own min..max and tiled in a square mosaic. A 2-D
``[N, F]`` or 3-D ``[N, T, F]`` output is drawn as a heat map (sample 0 for
3-D, with a colour bar); 1-D as one row. Other ranks, non-floating tensors and
empty ones are skipped. NaN/Inf pixels are left white.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hookcli.plot import require_matplotlib

PANEL_INCHES = 3.2
MAX_PANEL_COLUMNS = 3


def _normalized(channel: np.ndarray) -> np.ndarray:
    """One channel scaled to 0..1 over its finite values (a flat channel is 0.5)."""
    out = np.full(channel.shape, np.nan, dtype=np.float64)
    finite = np.isfinite(channel)
    if finite.any():
        lo, hi = channel[finite].min(), channel[finite].max()
        out[finite] = (channel[finite] - lo) / (hi - lo) if hi > lo else 0.5
    return out


def mosaic(maps: np.ndarray) -> np.ndarray:
    """``[C, H, W]`` -> one image of C normalized tiles, 1-pixel NaN gutters."""
    c, h, w = maps.shape
    cols = math.ceil(math.sqrt(c))
    rows = math.ceil(c / cols)
    out = np.full((rows * (h + 1) - 1, cols * (w + 1) - 1), np.nan)
    for i in range(c):
        r, k = divmod(i, cols)
        out[r * (h + 1) : r * (h + 1) + h, k * (w + 1) : k * (w + 1) + w] = _normalized(maps[i])
    return out


def _panel(key: str, t: Any, channels: int) -> tuple[str, np.ndarray, bool] | None:
    """(title, image, is_heatmap) for one tensor, or None when it cannot be drawn."""
    import torch

    if not t.is_floating_point() or t.numel() == 0 or t.dim() not in (1, 2, 3, 4):
        return None
    a = t.detach().to(torch.float32).cpu().numpy()
    item = f" (item 0 of {a.shape[0]})" if a.ndim >= 3 and a.shape[0] > 1 else ""
    if a.ndim == 4:
        n = min(channels, a.shape[1])
        return f"{key}: {n} of {a.shape[1]} channels{item}", mosaic(a[0, :n]), False
    if a.ndim == 3:
        return f"{key}: {a.shape[1]}x{a.shape[2]}{item}", a[0], True
    if a.ndim == 2:
        return f"{key}: {a.shape[0]}x{a.shape[1]}", a, True
    return f"{key}: {a.shape[0]}", a[None, :], True


def render_png(items: Sequence[tuple[str, Any]], channels: int = 16) -> tuple[bytes, list[str]]:
    """PNG bytes of the grid, and the keys that could not be drawn."""
    plt = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    panels = []
    skipped = []
    for key, t in items:
        p = _panel(key, t, channels)
        if p is None:
            skipped.append(key)
        else:
            panels.append(p)
    if not panels:
        return b"", skipped
    ncols = min(len(panels), MAX_PANEL_COLUMNS)
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(PANEL_INCHES * ncols, PANEL_INCHES * nrows),
        squeeze=False,
        layout="constrained",
    )
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    for ax, (title, image, heat) in zip(axes.flat, panels, strict=False):
        shown = np.ma.masked_invalid(image)
        if shown.mask.all():
            title += " (no finite value)"
        if heat:
            im = ax.imshow(shown, cmap=cmap, aspect="auto", interpolation="nearest")
            fig.colorbar(im, ax=ax, shrink=0.8)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            if image.shape[0] == 1:
                ax.set_yticks([])
        else:
            ax.imshow(shown, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_title(title, fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue(), skipped
