"""The charts of the html page: one entry per command in ``CHARTS``, each drawn from the
report's JSON (the same dict the page embeds) as inline SVG by matplotlib's SVG backend.

matplotlib is the optional ``plot`` extra: without it the page keeps everything but the
pictures, and says what to install in their place. Text goes into the SVG as ``<text>``
elements, which the SVG writer escapes; every name goes through ``label``, which escapes
``$``, so that a module name is never read as mathtext.

A chart function takes the report dict and the reports embedded beside it (``diff``: the
``old`` and ``new`` it compared) and returns its sections. Adding a command's chart is one
entry in ``CHARTS``.

``watch``'s entry reads the per-step series from a ``steps`` list of the report, one
object per logged step (docs/html.md#the-watch-chart)::

    {"step": 10, "loss": 2.31, "grad_norm": 0.84, "model": "model",
     "modules": {"encoder.0": {"grad_norm": 0.12}, ...}}

``loss`` and ``grad_norm`` may be null (not logged) or "nan"/"inf"; ``modules`` is present
on the steps that logged per-module figures; ``model`` tells the models of a run apart
(the chart draws the first).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hookcli.errors import printable
from hookcli.fmt import fmt_bytes, fmt_norm_type, number

MATPLOTLIB_NOTE = (
    "Charts need matplotlib, which is not installed: pip install 'hookcli[plot]' "
    "(the table and the report above are complete without it)."
)
BLUE, ORANGE, RED, GREY, GREEN, PURPLE, BROWN, PINK = (
    "#4878d0",
    "#ee854a",
    "#d62728",
    "#8c8c8c",
    "#6acc64",
    "#956cb4",
    "#8c613c",
    "#dc7ec0",
)
MAX_LABELLED = 120  # bars with a label each; past this, every k-th
MAX_RANKED = 60  # ablate's and diff's ranked bars
MAX_CELLS = 4_000  # watch's heatmap: past this, every k-th logged step


@dataclass(frozen=True)
class Section:
    """One chart of the page: an inline SVG, a widget the page script fills, or a note."""

    key: str
    title: str
    svg: str | None = None
    widget: str | None = None
    note: str | None = None


Report = Mapping[str, Any]
ChartFn = Callable[[Report, Mapping[str, Report]], list[Section]]


# -- values ---------------------------------------------------------------------------


def positive(value: Any) -> float | None:
    v = number(value)
    return v if v is not None and math.isfinite(v) and v > 0 else None


def label(text: Any, limit: int = 48) -> str:
    """A name as chart text: printable, ``$`` escaped (so never read as mathtext), long
    ones cut at the front (the tail of a dotted name says the most)."""
    s = printable(str(text)).replace("$", r"\$")  # a dollar sign, never mathtext
    if len(s) > limit:
        s = "\u2026" + s[-(limit - 1) :]
    return s


def value_text(value: Any, none: str = "-") -> str:
    """A figure as a hover text reads it: 12,345 / 0.1235 / 1.235e-05 / nan; ``none``
    for a missing one."""
    from hookcli.fmt import fmt_number

    v = number(value)
    if v is None:
        return none
    return fmt_number(int(v) if isinstance(value, int) else v)


def row_label(row: Mapping[str, Any]) -> str:
    name = row.get("name")
    name = name if isinstance(name, str) and name else "(root)"
    call = row.get("call")
    return f"{name}#{call}" if isinstance(call, int) and call else name


# -- drawing ----------------------------------------------------------------------------


@contextmanager
def figure(key: str, width: float, height: float) -> Iterator[Any]:
    """A matplotlib Figure (no pyplot, no global backend) with the page's style."""
    import matplotlib
    from matplotlib.figure import Figure

    style: Any = {  # (matplotlib types the keys as a Literal of every rcParam)
        "svg.fonttype": "none",  # text as <text>, not glyph paths: small, searchable
        "svg.hashsalt": f"hookcli-{key}",  # ids stable per chart, distinct across charts
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.titlesize": 10,
        "axes.titleweight": "bold",
        "legend.fontsize": 8,
        "legend.frameon": False,
    }
    with matplotlib.rc_context(style):
        fig: Any = Figure(figsize=(width, height), dpi=72, layout="constrained")
        fig.hookcli_tips = []  # the hover texts ``tip`` gives, written in by ``to_svg``
        yield fig


@dataclass(frozen=True)
class Tip:
    """The hover texts of one drawn artist: ``gid`` its SVG group; ``titles`` one per mark
    (a bar: one; a scatter, a line's markers, a mesh: one per point or cell, in order);
    ``series`` the legend entry its marks belong to."""

    gid: str
    titles: tuple[str, ...]
    series: str


def mark_nonfinite(ax: Any, xs: Sequence[float], titles: Sequence[str]) -> None:
    """NaN/Inf values as red crosses along the top of ``ax``, each with its hover title."""
    top = ax.get_ylim()[1]
    marks = ax.scatter(xs, [top] * len(xs), marker="X", color=RED, s=30, label="NaN/Inf")
    tip(marks, titles, "NaN/Inf")


def tip(artists: Any, titles: Sequence[str], series: str) -> None:
    """Give every mark of ``artists`` (a bar container or list of patches: one title
    each; a scatter, a line with markers or a mesh: one title per point or cell) its
    hover text, written into the SVG as a ``<title>`` by ``to_svg``."""
    many = isinstance(artists, (list, tuple)) or hasattr(artists, "patches")
    items = list(getattr(artists, "patches", artists)) if many else [artists]
    get_figure = getattr(items[0], "get_figure", None) if items else None
    fig = get_figure() if get_figure is not None else None  # None: not drawn on a figure
    tips = getattr(fig, "hookcli_tips", None)
    if tips is None:
        return
    pairs: list[tuple[Any, tuple[str, ...]]]
    if many:
        pairs = [(a, (t,)) for a, t in zip(items, titles, strict=True)]
    else:
        pairs = [(items[0], tuple(titles))]
    for artist, texts in pairs:
        gid = f"hookcli-tip-{len(tips)}"
        artist.set_gid(gid)
        tips.append(Tip(gid, texts, series))


_MARK = re.compile(r"<(use|path)\b([^>]*?)\s*/>")
_GROUP = re.compile(r"<g\b|</g>")
_TIPPED = re.compile(r'<g id="(hookcli-tip-\d+)">')
_DEFS = re.compile(r"<defs>.*?</defs>", re.S)


def _group_end(text: str, start: int) -> int:
    """The index just past the ``</g>`` that closes the ``<g`` opened at ``start``."""
    depth = 0
    for m in _GROUP.finditer(text, start):
        depth += 1 if m.group(0) == "<g" else -1
        if depth == 0:
            return m.end()
    return len(text)


def _titled(body: str, tip: Tip) -> str:
    """One tipped group: a one-mark tip titles the group, a many-mark tip each ``<use>``
    (points) or, where there is none, each ``<path>`` outside ``<defs>`` (mesh cells)."""
    from html import escape

    series = escape(tip.series)
    opening = f'<g id="{tip.gid}">'
    if len(tip.titles) == 1 and "<use" not in body:
        head = f'<g id="{tip.gid}" class="mark" data-series="{series}">'
        return head + f"<title>{escape(printable(tip.titles[0]))}</title>" + body[len(opening) :]
    kind = "use" if "<use" in body else "path"
    hidden = _DEFS.sub(lambda m: "\0" * len(m.group(0)), body)  # same offsets
    titles = iter(tip.titles)
    pieces, last = [], 0
    for m in _MARK.finditer(hidden):
        if m.group(1) != kind:
            continue
        title = next(titles, None)
        if title is None:
            break
        pieces.append(body[last : m.start()])
        pieces.append(
            f'<{kind} class="mark" data-series="{series}"{body[m.start(2) : m.end(2)]}>'
            f"<title>{escape(printable(title))}</title></{kind}>"
        )
        last = m.end()
    pieces.append(body[last:])
    return "".join(pieces)


def with_titles(text: str, tips: Sequence[Tip]) -> str:
    """The SVG with each tip's marks given ``class="mark"``, ``data-series`` (the series'
    name) and a ``<title>`` (the value on hover)."""
    by_gid = {t.gid: t for t in tips}
    if not by_gid:
        return text
    pieces, last = [], 0
    for m in _TIPPED.finditer(text):
        if m.start() < last or m.group(1) not in by_gid:
            continue
        end = _group_end(text, m.start())
        pieces.append(text[last : m.start()])
        pieces.append(_titled(text[m.start() : end], by_gid[m.group(1)]))
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def to_svg(fig: Any) -> str:
    """The figure as an ``<svg>`` element to inline: no XML prolog, no date; every mark
    given by ``tip`` has its ``<title>``."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    text = text[start:] if start >= 0 else text
    text = with_titles(text, getattr(fig, "hookcli_tips", ()))
    width = re.search(r'<svg[^>]*\swidth="([\d.]+)pt"', text)
    if width and float(width.group(1)) > 1100:  # many bars: scroll, do not shrink
        text = text.replace("<svg ", '<svg class="wide" ', 1)
    return text


def chart(
    key: str, title: str, width: float, height: float, draw: Callable[[Any], None]
) -> Section:
    """A Section holding the SVG ``draw`` makes on a fresh figure, or the note saying why
    there is none."""
    try:
        with figure(key, width, height) as fig:
            draw(fig)
            return Section(key, title, svg=to_svg(fig))
    except ImportError:
        return Section(key, title, note=MATPLOTLIB_NOTE)
    except Exception as err:  # a chart hookcli cannot draw must not cost the report
        from hookcli.streams import progress

        progress(f"hookcli: note: the {key} chart was not drawn: {printable(str(err))}")
        return Section(key, title, note=f"This chart could not be drawn: {printable(str(err))}")


def bar_width(n: int) -> float:
    """Figure width (inches) for ``n`` bars side by side."""
    return min(max(7.5, 0.16 * n + 2.0), 60.0)


def set_bar_labels(ax: Any, labels: Sequence[str]) -> None:
    n = len(labels)
    if n <= MAX_LABELLED:
        ax.set_xticks(
            range(n), [label(s) for s in labels], rotation=90, fontsize=7 if n > 40 else 8
        )
        return
    step = math.ceil(n / MAX_LABELLED)
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [label(labels[i]) for i in ticks], rotation=90, fontsize=6)


def log_bars(
    ax: Any,
    values: Sequence[Any],
    color: str,
    name: str,
    unused: Sequence[bool] = (),
    labels: Sequence[str] = (),
) -> None:
    """Bars on a log axis; zero, NaN/Inf and unused (no value) get markers instead; each
    with its ``labels`` entry and value on hover."""
    n = len(values)
    xs = range(n)
    pos = [positive(v) for v in values]
    shown = [(i, v) for i, v in zip(xs, pos, strict=True) if v is not None]
    finite = [v for _, v in shown]
    low = min(finite) if finite else 1e-8
    high = max(finite) if finite else 1.0
    bottom, top = low / 10.0, high * 10.0
    names = list(labels) or [str(i) for i in xs]
    if shown:
        bars = ax.bar(
            [i for i, _ in shown], [v for _, v in shown], color=color, width=0.8, label=name
        )
        tip(bars, [f"{names[i]}: {name} {value_text(v)}" for i, v in shown], name)
    zero = [i for i in xs if number(values[i]) == 0.0]
    bad = [i for i in xs if (v := number(values[i])) is not None and not math.isfinite(v)]
    missing = [i for i in xs if number(values[i]) is None or (unused and unused[i])]
    groups = (
        (zero, bottom, "v", ORANGE, "zero"),
        (bad, top, "X", RED, "nan / inf"),
        (missing, bottom, "o", GREY, "unused (no grad)"),
    )
    for idx, y, marker, col, text in groups:
        if idx:
            dots = ax.scatter(
                idx, [y] * len(idx), marker=marker, color=col, s=36, zorder=3, label=text
            )
            tip(dots, [f"{names[i]}: {name} {value_text(values[i], text)}" for i in idx], text)
    ax.set_yscale("log")
    ax.set_ylim(bottom / 3.0, top * 3.0)
    ax.set_xlim(-0.8, max(n - 0.2, 0.8))
    ax.grid(True, axis="y", alpha=0.3)


# -- grads ------------------------------------------------------------------------------


def grads_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """Gradient flow: grad norm and grad/weight of every module with parameters of its own,
    in forward order, on log axes; zero, NaN/Inf and unused marked."""
    rows = [
        r
        for r in data.get("layers") or []
        if isinstance(r, Mapping) and (r.get("own_params") or 0) > 0 and not r.get("call")
    ]
    title = "Gradient flow: modules with parameters of their own, forward order"
    if not rows:
        return [Section("gradflow", title, note="No module has parameters of its own.")]
    if all(r.get("grad_norm") is None for r in rows) and not any(
        r.get("unused_params") for r in rows
    ):
        return [Section("gradflow", title, note="No gradient values in this report (meta?).")]
    totals = data.get("totals") or {}
    shown = {r.get("name") for r in rows}
    idle: list[
        Mapping[str, Any]
    ] = []  # modules whose parameters got no gradient because their forward never ran
    for param in totals.get("unused_params") or []:
        owner = str(param).rpartition(".")[0]
        if owner not in shown:
            shown.add(owner)
            idle.append({"name": owner, "grad_norm": None, "unused_params": [param]})
    rows = rows + idle
    labels = [row_label(r) + (" (not run)" if r in idle else "") for r in rows]
    unused = [bool(r.get("unused_params")) and r.get("grad_norm") is None for r in rows]
    grad = [r.get("grad_norm") for r in rows]
    ratio = []
    for r in rows:
        value = r.get("grad_weight_ratio")
        if value is None:
            g, w = number(r.get("grad_norm")), positive(r.get("weight_norm"))
            value = g / w if g is not None and w else None
        ratio.append(value)

    def draw(fig: Any) -> None:
        top, low = fig.subplots(2, 1, sharex=True)
        log_bars(top, grad, BLUE, "grad norm", unused, labels)
        top.set_ylabel("grad norm (L2)")
        parts = [f"{k} {_short(totals[k])}" for k in ("loss", "grad_norm") if k in totals]
        top.set_title("grad norm per module" + (f" ({', '.join(parts)})" if parts else ""))
        top.legend(loc="upper right")
        log_bars(low, ratio, PURPLE, "grad / weight", unused, labels)
        low.set_ylabel("grad norm / weight norm")
        low.set_title("grad / weight per module")
        set_bar_labels(low, labels)

    return [chart("gradflow", title, bar_width(len(rows)), 7.5, draw)]


def _short(value: Any) -> str:
    v = number(value)
    if v is None:
        return str(value)
    if not math.isfinite(v) or v == 0:
        return str(value)
    return f"{v:.4g}"


# -- stats ------------------------------------------------------------------------------


def stats_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """Per-module output statistics in forward order: |max| and std (log), mean, the
    fraction of zeros; NaN/Inf calls marked and the first one drawn as a line."""
    rows = [
        r
        for r in data.get("layers") or []
        if isinstance(r, Mapping) and ("mean" in r or "std" in r) and r.get("called", True)
    ]
    title = "Activation statistics per module call, forward order"
    if not rows or all(r.get("mean") is None for r in rows):
        return [Section("stats", title, note="No statistics in this report (meta?).")]
    labels = [row_label(r) for r in rows]
    absmax: list[Any] = []
    for r in rows:
        lo, hi = number(r.get("min")), number(r.get("max"))
        if lo is None or hi is None:
            absmax.append(None)
        elif math.isnan(lo) or math.isnan(hi):
            absmax.append("nan")
        else:
            absmax.append(max(abs(lo), abs(hi)))
    std = [r.get("std") for r in rows]
    mean = [number(r.get("mean")) for r in rows]
    zeros = [number(r.get("zero_fraction")) for r in rows]
    nonfinite = [i for i, r in enumerate(rows) if (r.get("nan") or 0) or (r.get("inf") or 0)]
    origin = (data.get("totals") or {}).get("nonfinite_origin")
    origin_at = labels.index(origin) if isinstance(origin, str) and origin in labels else None

    def draw(fig: Any) -> None:
        a, b, c = fig.subplots(3, 1, sharex=True, height_ratios=[2, 1.3, 1])
        xs = list(range(len(rows)))
        for values, col, name, marker in ((absmax, BROWN, "|max|", "^"), (std, BLUE, "std", "o")):
            pts = [(i, positive(v)) for i, v in enumerate(values)]
            pts = [(i, v) for i, v in pts if v is not None]
            if pts:
                (line,) = a.plot(
                    [i for i, _ in pts],
                    [v for _, v in pts],
                    marker=marker,
                    ms=3,
                    lw=1,
                    color=col,
                    label=name,
                )
                tip(line, [f"{labels[i]}: {name} {value_text(v)}" for i, v in pts], name)
        a.set_yscale("log")
        if nonfinite:
            mark_nonfinite(
                a,
                nonfinite,
                [
                    f"{labels[i]}: nan {rows[i].get('nan') or 0}, inf {rows[i].get('inf') or 0}"
                    for i in nonfinite
                ],
            )
        a.set_title("output |max| and std (log scale)")
        a.grid(True, axis="y", alpha=0.3)
        finite_mean = [(i, v) for i, v in enumerate(mean) if v is not None and math.isfinite(v)]
        if finite_mean:
            b.plot([i for i, _ in finite_mean], [v for _, v in finite_mean], color=GREEN, lw=1)
            dots = b.scatter(
                [i for i, _ in finite_mean], [v for _, v in finite_mean], color=GREEN, s=8
            )
            tip(dots, [f"{labels[i]}: mean {value_text(v)}" for i, v in finite_mean], "mean")
        b.axhline(0, color=GREY, lw=0.6)
        b.set_title("output mean")
        zbars = c.bar(xs, [z if z is not None else 0 for z in zeros], color=ORANGE, width=0.8)
        tip(zbars, [f"{labels[i]}: zeros {value_text(z)}" for i, z in enumerate(zeros)], "zeros")
        c.set_ylim(0, 1)
        c.set_title("fraction of zeros (1 = dead)")
        for ax in (a, b, c):
            if origin_at is not None:
                ax.axvline(origin_at, color=RED, ls="--", lw=1.2)
        if origin_at is not None:
            a.annotate(
                f"first NaN/Inf: {label(origin)}",
                (origin_at, 1),
                xycoords=("data", "axes fraction"),
                xytext=(4, -12),
                textcoords="offset points",
                color=RED,
                fontsize=8,
            )
        a.legend(loc="upper right")
        c.set_xlim(-0.8, max(len(rows) - 0.2, 0.8))
        set_bar_labels(c, labels)

    return [chart("stats", title, bar_width(len(rows)), 8.0, draw)]


# -- cost -------------------------------------------------------------------------------


def cost_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """FLOPs and memory per module (their own, so the bars add up to the totals), and the
    training step's and inference's memory broken down."""
    rows = [r for r in data.get("layers") or [] if isinstance(r, Mapping)]
    out: list[Section] = []
    per = []
    for r in rows:
        own_flops = number(r.get("own_flops")) or 0.0
        params, own = r.get("params") or 0, r.get("own_params") or 0
        pbytes = number(r.get("param_bytes")) or 0.0
        own_pbytes = pbytes * own / params if params else 0.0
        saved = number(r.get("own_saved_bytes")) or 0.0
        if own_flops > 0 or own_pbytes > 0 or saved > 0:
            per.append((row_label(r), own_flops, own_pbytes, saved))
    if per:
        labels = [p[0] for p in per]

        def draw(fig: Any) -> None:
            top, low = fig.subplots(2, 1, sharex=True)
            xs = list(range(len(per)))
            flops = top.bar(
                xs, [p[1] for p in per], color=BLUE, width=0.8, label="forward FLOPs (own)"
            )
            tip(flops, [f"{p[0]}: {value_text(p[1])} FLOPs (own)" for p in per], "FLOPs")
            top.set_ylabel("FLOPs")
            top.set_title("forward FLOPs per module (its own, outside its children)")
            top.grid(True, axis="y", alpha=0.3)
            params = [p[2] / 2**20 for p in per]
            saved = [p[3] / 2**20 for p in per]
            pbars = low.bar(xs, params, color=PURPLE, width=0.8, label="parameters")
            tip(pbars, [f"{p[0]}: parameters {_mib(p[2])}" for p in per], "parameters")
            sbars = low.bar(
                xs, saved, bottom=params, color=ORANGE, width=0.8, label="saved for backward"
            )
            tip(sbars, [f"{p[0]}: saved for backward {_mib(p[3])}" for p in per], "saved")
            low.set_ylabel("MiB")
            low.set_title("memory per module: its own parameters and saved tensors (stacked)")
            low.legend(loc="upper right")
            low.grid(True, axis="y", alpha=0.3)
            low.set_xlim(-0.8, max(len(per) - 0.2, 0.8))
            set_bar_labels(low, labels)

        title = "FLOPs and memory per module, forward order"
        out.append(chart("cost-modules", title, bar_width(len(per)), 7.5, draw))
    t = data.get("totals") or {}
    bars = memory_breakdown(t)
    if bars:

        def draw_memory(fig: Any) -> None:
            ax = fig.subplots()
            colors = {
                "params": PURPLE,
                "buffers": GREY,
                "grads": BLUE,
                "optimizer state": GREEN,
                "saved activations": ORANGE,
                "peak activations": PINK,
                "other": "#cccccc",
            }
            seen: set[str] = set()
            for y, (_, parts, total) in enumerate(bars):
                left = 0.0
                for part, value in parts:
                    mib = value / 2**20
                    bar = ax.barh(
                        y,
                        mib,
                        left=left,
                        color=colors.get(part, GREY),
                        label=None if part in seen else part,
                        height=0.6,
                    )
                    tip(bar, [f"{bars[y][0]}: {part} {_mib(value)}"], part)
                    seen.add(part)
                    left += mib
                ax.annotate(
                    fmt_bytes(total, binary=True),
                    (left, y),
                    xytext=(4, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=8,
                )
            ax.set_yticks(range(len(bars)), [b[0] for b in bars])
            ax.invert_yaxis()
            ax.set_xlabel("MiB")
            ax.legend(loc="lower right", ncols=3)
            ax.set_title("memory of one training step and of inference")

        out.append(chart("cost-memory", "Memory breakdown", 9.0, 2.6, draw_memory))
    return out


def _mib(n: float) -> str:
    """Bytes as a hover text: the byte count and render's binary size."""
    return f"{fmt_bytes(n, binary=True)} ({int(n):,} bytes)"


def memory_breakdown(t: Mapping[str, Any]) -> list[tuple[str, list[tuple[str, float]], float]]:
    """(bar, [(part, bytes)], total) for the training step and inference, as cost's table
    adds them up; an ``other`` part where the parts fall short of the total."""
    out = []
    t = {**t, **(t.get("memory_parts") or {})}  # cost keeps its sums of parts there
    specs = (
        (
            "training step",
            "train_step_bytes",
            (
                ("params", "param_bytes"),
                ("buffers", "buffer_bytes"),
                ("grads", "grad_bytes"),
                ("optimizer state", "optimizer_state_bytes"),
                ("saved activations", "saved_bytes"),
            ),
        ),
        (
            "inference",
            "inference_bytes",
            (
                ("params", "param_bytes"),
                ("buffers", "buffer_bytes"),
                ("peak activations", "peak_activation_bytes"),
            ),
        ),
    )
    for name, total_key, parts in specs:
        total = number(t.get(total_key))
        if total is None or not math.isfinite(total):
            continue
        values = [(p, number(t.get(k)) or 0.0) for p, k in parts]
        values = [(p, v) for p, v in values if v > 0]
        rest = total - sum(v for _, v in values)
        if rest > 0.005 * total:
            values.append(("other", rest))
        out.append((name, values, total))
    return out


# -- profile ----------------------------------------------------------------------------


@dataclass
class Frame:
    """One module in the icicle: its inclusive and self time, and its children."""

    name: str
    total: float
    self_time: float | None
    children: list[Frame]


def frames(rows: Sequence[Mapping[str, Any]], total_key: str, self_key: str) -> list[Frame]:
    """The modules as a tree by their dotted names (the root ``""`` above all)."""
    by_name: dict[str, Frame] = {}
    order: list[str] = []
    for r in rows:
        name = r.get("name")
        total = positive(r.get(total_key))
        if not isinstance(name, str) or total is None or name in by_name:
            continue
        by_name[name] = Frame(name, total, positive(r.get(self_key)), [])
        order.append(name)
    roots: list[Frame] = []
    for name in order:
        parent = None
        p = name
        while "." in p and parent is None:
            p = p.rpartition(".")[0]
            parent = by_name.get(p)
        if parent is None and name != "" and "" in by_name:
            parent = by_name[""]
        (parent.children if parent is not None else roots).append(by_name[name])
    return roots


def icicle(
    ax: Any,
    roots: Sequence[Frame],
    unit: str,
    fmt: Callable[[float], str] | None = None,
    own: str = "self",
) -> int:
    """Draw the frames as an icicle (root on top; children left-heavy, inside their
    parent); the colour is self / inclusive (``own``: what the self part is called);
    each area has its figures on hover (``fmt``: a value with its unit). Returns the
    depth drawn."""
    show = fmt or (lambda v: f"{v:.3g} {unit}")
    from matplotlib import colormaps

    cmap = colormaps["YlOrRd"]
    deepest = 0
    span = sum(r.total for r in roots) or 1.0

    def place(frame: Frame, left: float, width: float, depth: int) -> None:
        nonlocal deepest
        deepest = max(deepest, depth)
        share = frame.self_time / frame.total if frame.self_time is not None else 0.0
        area = ax.barh(
            depth,
            width,
            left=left,
            height=0.92,
            color=cmap(0.15 + 0.8 * min(max(share, 0.0), 1.0)),
            edgecolor="white",
            linewidth=0.5,
        )
        mine = show(frame.self_time) if frame.self_time is not None else show(0)
        tip(area, [f"{frame.name or '(root)'}: {show(frame.total)} ({own} {mine})"], "module")
        if width / span > 0.06:
            text = f"{label(frame.name or '(root)', 28)} {show(frame.total)}"
            ax.text(
                left + width / 2,
                depth,
                text,
                ha="center",
                va="center",
                fontsize=7,
                clip_on=True,
                color="white" if share > 0.55 else "black",
            )
        kids = sorted(frame.children, key=lambda f: -f.total)
        scale = min(1.0, width / (sum(k.total for k in kids) or 1.0))
        x = left
        for k in kids:
            place(k, x, k.total * scale, depth + 1)
            x += k.total * scale

    x = 0.0
    for r in sorted(roots, key=lambda f: -f.total):
        place(r, x, r.total, 0)
        x += r.total
    ax.set_ylim(deepest + 0.6, -0.6)
    ax.set_xlim(0, x)
    ax.set_yticks(range(deepest + 1), [f"depth {d}" for d in range(deepest + 1)], fontsize=7)
    ax.set_xlabel(unit)
    return deepest


def profile_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """Icicle charts of the forward (and backward) time per module: width = inclusive time
    (median over repeats), colour = self / inclusive."""
    rows = [r for r in data.get("modules") or [] if isinstance(r, Mapping)]
    out = []
    for phase in ("forward", "backward"):
        roots = frames(rows, f"{phase}_ms", f"{phase}_self_ms")
        if not roots:
            continue

        def draw(fig: Any, roots: list[Frame] = roots, phase: str = phase) -> None:
            from matplotlib import colormaps
            from matplotlib.cm import ScalarMappable
            from matplotlib.colors import Normalize

            ax = fig.subplots()
            icicle(ax, roots, "ms", lambda v: f"{v:.4g} ms")
            ax.set_title(f"{phase}: width = inclusive time, colour = self / inclusive")
            sm = ScalarMappable(Normalize(0, 1), colormaps["YlOrRd"])
            fig.colorbar(sm, ax=ax, label="self / inclusive", fraction=0.03, pad=0.01)

        depth = max(_depth(r) for r in roots)
        title = f"Where the {phase} time goes (icicle; median of the repeats)"
        out.append(chart(f"profile-{phase}", title, 12.0, 1.2 + 0.38 * (depth + 1), draw))
    if not out:
        out.append(Section("profile", "Profile", note="No module times in this report."))
    return out


def _depth(frame: Frame) -> int:
    return 1 + max((_depth(c) for c in frame.children), default=0)


# -- inspect ----------------------------------------------------------------------------


def inspect_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """Where the parameters are: an icicle of the module tree, each module as wide as the
    parameters of its subtree, coloured by the share that are its own."""
    rows = [r for r in data.get("layers") or [] if isinstance(r, Mapping) and not r.get("call")]
    roots = frames(rows, "params", "own_params")
    title = "Where the parameters are (icicle: width = parameters of the subtree)"
    if not roots:
        return [Section("inspect-params", title, note="The model has no parameters.")]

    def draw(fig: Any) -> None:
        from matplotlib import colormaps
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        ax = fig.subplots()
        icicle(ax, roots, "params", lambda v: f"{int(v):,} params", own="own")
        ax.set_title("parameters per module: width = subtree, colour = own / subtree")
        ax.set_xlabel("parameters")
        sm = ScalarMappable(Normalize(0, 1), colormaps["YlOrRd"])
        fig.colorbar(sm, ax=ax, label="own / subtree", fraction=0.03, pad=0.01)

    depth = max(_depth(r) for r in roots)
    return [chart("inspect-params", title, 12.0, 1.2 + 0.38 * min(depth, 40), draw)]


# -- ablate -----------------------------------------------------------------------------


def ablate_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """The ablations ranked by their effect on the output (the report's ``metric``)."""
    metric = str((data.get("settings") or {}).get("metric") or "rel_l2")
    rows = [r for r in data.get("ablations") or [] if isinstance(r, Mapping)]
    rows.sort(key=lambda r: r["rank"] if isinstance(r.get("rank"), int) else 1 << 30)
    title = f"Ablations ranked by {metric}"
    if not rows:
        return [Section("ablate", title, note="No ablations in this report.")]
    shown = rows[:MAX_RANKED]
    note = f"the first {MAX_RANKED} of {len(rows)} by rank" if len(rows) > MAX_RANKED else None

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        ys = list(range(len(shown)))
        values = [number(r.get(metric)) for r in shown]
        finite = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
        hbars = ax.barh(ys, finite, color=BLUE, height=0.7)
        tip(
            hbars,
            [f"{r.get('rank', '')}. {label(r.get('name', ''))}: {metric} {value_text(v)}"
             for r, v in zip(shown, values, strict=True)],
            metric,
        )  # fmt: skip
        bad = [
            i
            for i, (r, v) in enumerate(zip(shown, values, strict=True))
            if r.get("error") or v is None or not math.isfinite(v)
        ]
        if bad:
            marks = ax.scatter(
                [0] * len(bad),
                bad,
                marker="X",
                color=RED,
                s=30,
                zorder=3,
                label="failed / no value",
            )
            tip(
                marks,
                [f"{label(shown[i].get('name', ''))}: {shown[i].get('error') or 'no value'}"
                 for i in bad],
                "failed",
            )  # fmt: skip
            ax.legend(loc="lower right")
        ax.set_yticks(ys, [f"{r.get('rank', '')}. {label(r.get('name', ''))}" for r in shown])
        ax.invert_yaxis()
        positive_values = [v for v in finite if v > 0]
        if positive_values and max(positive_values) / min(positive_values) > 1e3:
            ax.set_xscale("log")
        ax.set_xlabel(label(metric))
        ax.grid(True, axis="x", alpha=0.3)

    section = chart("ablate", title, 9.0, 1.2 + 0.24 * len(shown), draw)
    if note:
        section = Section(section.key, section.title, section.svg, section.widget, note)
    return [section]


# -- compare ----------------------------------------------------------------------------


def compare_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """Relative L2 error of every aligned call in A's order, propagated and local side by
    side on a log axis; exact calls (error 0) marked at the bottom; the first divergence
    marked with a red line."""
    title = "Error per module: relative L2, propagated and local"
    rows = [
        r
        for r in data.get("calls") or []
        if isinstance(r, Mapping) and r.get("partner") is not None
    ]
    if not data.get("values_compared", True):
        return [Section("compare", title, note="On meta no values are compared: no chart.")]
    if not rows:
        return [Section("compare", title, note="No aligned calls in this report.")]
    first = data.get("first_divergence") or {}
    mark = next(
        (
            i
            for i, r in enumerate(rows)
            if r.get("name") == first.get("module") and r.get("call") == first.get("call")
        ),
        None,
    )

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        n = len(rows)
        series = (("rel_l2", BLUE, "propagated", -0.2), ("local_rel_l2", ORANGE, "local", 0.2))
        names = [row_label(r) for r in rows]
        values = [positive(r.get(k)) for r in rows for k, *_ in series]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        low = min(finite) if finite else 1e-8
        high = max(finite) if finite else 1.0
        bottom = low / 10.0
        for key, color, name, dx in series:
            pts = [(i + dx, positive(r.get(key))) for i, r in enumerate(rows)]
            shown = [(x, v) for x, v in pts if v is not None and math.isfinite(v)]
            if shown:
                bars = ax.bar(
                    [x for x, _ in shown], [v for _, v in shown], width=0.4, color=color, label=name
                )
                tip(
                    bars,
                    [f"{names[round(x - dx)]}: {name} {value_text(v)}" for x, v in shown],
                    name,
                )
            zeros = [i for i, r in enumerate(rows) if number(r.get(key)) == 0.0]
            if zeros:
                exact = ax.scatter(
                    [i + dx for i in zeros],
                    [bottom] * len(zeros),
                    marker="v",
                    color=color,
                    s=16,
                    zorder=3,
                )
                tip(exact, [f"{names[i]}: {name} 0 (exact)" for i in zeros], f"{name} exact")
        if mark is not None:
            ax.axvline(mark, color=RED, linewidth=1.2, label="first divergence")
        ax.set_yscale("log")
        ax.set_ylim(bottom / 3.0, high * 30.0)
        ax.set_xlim(-0.8, max(n - 0.2, 0.8))
        set_bar_labels(ax, [row_label(r) for r in rows])
        ax.set_ylabel("relative L2 (B vs A)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(loc="upper left")

    return [chart("compare", title, bar_width(2 * len(rows)), 4.2, draw)]


# -- diff -------------------------------------------------------------------------------


def diff_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """Both reports side by side (the page script draws them from the embedded reports,
    with the differences ``diff`` found highlighted), and the value differences ranked."""
    out = [
        Section(
            "side-by-side",
            "Both reports side by side (cells that differ are highlighted)",
            widget="side-by-side",
        )
    ]
    diffs = [
        d
        for d in data.get("differences") or []
        if isinstance(d, Mapping) and positive(d.get("rel_diff")) is not None
    ]
    if diffs:
        diffs.sort(key=lambda d: -(positive(d.get("rel_diff")) or 0.0))
        shown = diffs[:MAX_RANKED]

        def draw(fig: Any) -> None:
            ax = fig.subplots()
            ys = list(range(len(shown)))
            bars = ax.barh(ys, [positive(d.get("rel_diff")) for d in shown], color=RED, height=0.7)
            names = [
                label(" ".join(str(d.get(k) or "") for k in ("where", "item", "key")).strip(), 60)
                for d in shown
            ]
            tip(
                bars,
                [
                    f"{n}: {value_text(d.get('old'))} -> {value_text(d.get('new'))}"
                    f" (relative difference {value_text(d.get('rel_diff'))})"
                    for n, d in zip(names, shown, strict=True)
                ],
                "relative difference",
            )
            ax.set_yticks(ys, names)
            ax.invert_yaxis()
            ax.set_xscale("log")
            ax.set_xlabel("relative difference |new - old| / |old|")
            ax.grid(True, axis="x", alpha=0.3)

        title = "Value differences, largest relative difference first"
        out.append(chart("diff-values", title, 9.0, 1.2 + 0.24 * len(shown), draw))
    return out


# -- watch ------------------------------------------------------------------------------


def power_label(value: float, pos: Any = None) -> str:
    """A log axis' tick: 1000, 100, 10, 1, 0.1 as they read, 1e4 and 1e-2 past them."""
    if not value > 0 or not math.isfinite(value):
        return ""
    exponent = math.log10(value)
    e = round(exponent)
    if abs(exponent - e) > 1e-9:
        return f"{value:.3g}"
    return f"{10.0**e:g}" if -1 <= e <= 3 else f"1e{e}"


def log_axis(ax: Any, values: Sequence[float]) -> None:
    """A log y axis labelled at powers of ten only (``power_label``), spanning at least a
    decade: a clipped run's grad norm (1.0 on every step, or 0.999999 to 1) gets the one
    tick 1, not ten repeats of "10 x 10^-1"."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    lo, hi = min(values), max(values)
    if hi / lo < 10:  # under a decade: widen it around the values, half a decade a side
        mid = math.sqrt(lo * hi)
        half = max(math.sqrt(10.0) * 1.01, math.sqrt(hi / lo) * 1.05)
        ax.set_ylim(mid / half, mid * half)
    ax.yaxis.set_major_locator(LogLocator(base=10.0))
    ax.yaxis.set_major_formatter(FuncFormatter(power_label))
    ax.yaxis.set_minor_formatter(NullFormatter())


def watch_charts(data: Report, companions: Mapping[str, Report]) -> list[Section]:
    """Loss and total grad norm over the steps, and a modules x steps heatmap of log10
    grad norm (NaN/Inf in red), from the report's ``steps`` series."""
    steps = [s for s in data.get("steps") or [] if isinstance(s, Mapping) and "step" in s]
    if not steps:
        return [
            Section(
                "watch",
                "Training run",
                note="This report carries no per-step series (steps): nothing to draw.",
            )
        ]
    models = [s.get("model") for s in steps]
    first_model = next((m for m in models if m is not None), None)
    steps = [s for s in steps if s.get("model") in (None, first_model)]
    xs = [s["step"] for s in steps]
    out = []

    def draw_lines(fig: Any) -> None:
        a, b = fig.subplots(2, 1, sharex=True)
        for ax, key, col, log in ((a, "loss", BLUE, False), (b, "grad_norm", PURPLE, True)):
            pts = [(x, number(s.get(key))) for x, s in zip(xs, steps, strict=True)]
            fin = [(x, v) for x, v in pts if v is not None and math.isfinite(v)]
            bad = [x for x, v in pts if v is not None and not math.isfinite(v)]
            if fin:
                (line,) = ax.plot(
                    [x for x, _ in fin], [v for _, v in fin], color=col, lw=1.2, marker="o", ms=2.5
                )
                tip(line, [f"step {x}: {key} {value_text(v)}" for x, v in fin], key)
            if log and fin and all(v > 0 for _, v in fin):
                log_axis(ax, [v for _, v in fin])
            if bad:
                mark_nonfinite(
                    ax,
                    bad,
                    [
                        f"step {x}: {key} {v}"
                        for x, v in pts
                        if v is not None and not math.isfinite(v)
                    ],
                )
                ax.legend(loc="upper right")
            kinds = {fmt_norm_type(s["norm_type"]) for s in steps if s.get("norm_type") is not None}
            kind = f" ({'/'.join(sorted(kinds))}-norm)" if kinds and key != "loss" else ""
            ax.set_ylabel("loss" if key == "loss" else f"total grad norm{kind}")
            ax.grid(True, alpha=0.3)
        a.set_title("loss and total grad norm per step")
        b.set_xlabel("step")

    out.append(
        chart("watch-lines", "Loss and total grad norm over the steps", 10.0, 5.0, draw_lines)
    )
    logged = [s for s in steps if isinstance(s.get("modules"), Mapping)]
    if logged:
        order = [r.get("name") for r in data.get("layers") or [] if isinstance(r, Mapping)]
        names = [n for n in order if isinstance(n, str) and any(n in s["modules"] for s in logged)]
        for s in logged:
            names.extend(n for n in s["modules"] if n not in names)
        every = math.ceil(len(names) * len(logged) / MAX_CELLS)  # one titled quad per cell
        thinned = None
        if every > 1:
            thinned = f"one logged step in {every}, of {len(logged)} (at most {MAX_CELLS:,} cells)"
            logged = logged[::every]

        def draw_heat(fig: Any) -> None:
            import numpy as np
            from matplotlib import colormaps
            from matplotlib.cm import ScalarMappable
            from matplotlib.colors import Normalize

            # one quad per cell, coloured by hand (a value, grey: no gradient, red: NaN/Inf)
            # so that each has its own title
            values: list[list[float | None]] = [
                [
                    number(entry.get("grad_norm")) if isinstance(entry, Mapping) else None
                    for entry in (s["modules"].get(n) for s in logged)
                ]
                for n in names
            ]
            logs = [
                math.log10(v) for row in values for v in row if v and v > 0 and math.isfinite(v)
            ]
            norm = Normalize(min(logs, default=0.0), max(logs, default=1.0))
            cmap = colormaps["viridis"]
            colours, titles = [], []
            cols = [s["step"] for s in logged]
            for n, row in zip(names, values, strict=True):
                for step, v in zip(cols, row, strict=True):
                    if v is None or v <= 0:
                        colours.append((0.88, 0.88, 0.88, 1.0))
                    elif not math.isfinite(v):
                        colours.append((0.84, 0.15, 0.16, 1.0))
                    else:
                        colours.append(cmap(norm(math.log10(v))))
                    shown = "no gradient" if v is None else value_text(v)
                    titles.append(f"{n or '(root)'}, step {step}: grad norm {shown}")
            ax = fig.subplots()
            xs = np.arange(len(logged) + 1) - 0.5
            ys = np.arange(len(names) + 1) - 0.5
            mesh = ax.pcolormesh(xs, ys, np.zeros((len(names), len(logged))))
            mesh.set_array(None)
            mesh.set_facecolor(colours)
            mesh.set_edgecolor("face")
            tip(mesh, titles, "grad norm")
            ax.set_ylim(len(names) - 0.5, -0.5)
            sm = ScalarMappable(norm, cmap)
            fig.colorbar(sm, ax=ax, label="log10 grad norm", fraction=0.03, pad=0.01)
            step = max(1, math.ceil(len(cols) / 20))
            ax.set_xticks(range(0, len(cols), step), [str(c) for c in cols[::step]])
            rstep = max(1, math.ceil(len(names) / 60))
            ax.set_yticks(
                range(0, len(names), rstep),
                [label(n or "(root)") for n in names[::rstep]],
                fontsize=7,
            )
            ax.set_xlabel("step")
            ax.set_title("grad norm per module and step (grey: no gradient, red: NaN/Inf)")

        height = min(max(3.0, 0.16 * len(names) + 1.5), 30.0)
        heat = chart("watch-heatmap", "Modules x steps: log10 grad norm", 11.0, height, draw_heat)
        if thinned and heat.svg:
            heat = Section(heat.key, heat.title, heat.svg, heat.widget, f"Shown: {thinned}.")
        out.append(heat)
    return out


CHARTS: dict[str, ChartFn] = {
    "inspect": inspect_charts,
    "grads": grads_charts,
    "stats": stats_charts,
    "cost": cost_charts,
    "profile": profile_charts,
    "ablate": ablate_charts,
    "compare": compare_charts,
    "diff": diff_charts,
    "watch": watch_charts,
}


def sections(data: Report, companions: Mapping[str, Report] | None = None) -> list[Section]:
    """The charts of the report's command (none for a command without an entry)."""
    fn = CHARTS.get(str(data.get("command")))
    if fn is None:
        return []
    return fn(data, companions or {})
