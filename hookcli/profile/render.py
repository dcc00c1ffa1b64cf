"""The profile table's columns, notes and totals lines; the ``--plot`` bar chart."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.render import fmt_int, fmt_pct
from hookcli.report import Column

if TYPE_CHECKING:
    from hookcli.profile.plan import ProfilePlan
    from hookcli.report import Report


def fmt_ms(value: Any) -> str:
    """Milliseconds with three decimals; '-' for None."""
    return "-" if value is None else f"{float(value):.3f}"


def fmt_rate(value: Any) -> str:
    """FLOP/s with an SI prefix (12.3 G); '-' for None."""
    from hookcli.render import fmt_count

    return "-" if value is None else fmt_count(int(value))


def fmt_bytes_or_dash(value: Any) -> str:
    from hookcli.render import fmt_bytes

    return fmt_bytes(value, binary=True)


def columns(backward: bool, memory: bool) -> list[Column]:
    """The table columns."""
    from hookcli.render import fmt_count

    pct = partial(fmt_pct, scale=1, sign="")  # the rows hold percentages; the headers say %
    cols = [
        Column("name", "Module"),
        Column("type", "Type"),
        Column("calls", "Calls", fmt_int, "right"),
        Column("forward_ms", "Fwd ms", fmt_ms, "right"),
        Column("forward_iqr_ms", "IQR", fmt_ms, "right"),
        Column("forward_self_ms", "Self ms", fmt_ms, "right"),
        Column("forward_self_pct", "Self %", pct, "right"),
        Column("forward_pct", "% root", pct, "right"),
    ]
    if backward:
        cols += [
            Column("backward_ms", "Bwd ms", fmt_ms, "right"),
            Column("backward_self_ms", "Bwd self", fmt_ms, "right"),
        ]
    cols += [
        Column("flops", "FLOPs", fmt_count, "right"),
        Column("flops_per_s", "FLOP/s", fmt_rate, "right"),
    ]
    if memory:
        cols.append(Column("memory_bytes", "Peak mem", fmt_bytes_or_dash, "right"))
    return cols


def notes(plan: ProfilePlan, timer: str, rows: Sequence[dict[str, Any]] = ()) -> list[str]:
    """Header lines: how the figures were taken (and, with rows, what has no backward)."""
    from hookcli.profile.clocks import PERF_COUNTER

    out = [
        f"median of {plan.repeat} timed passes after {plan.warmup} warmup; IQR: 75th - 25th "
        f"percentile; timer {timer}; sorted by {plan.sort.value}",
        "Fwd ms: inclusive (the call and everything inside it); Self: less its child calls",
    ]
    if any(not r.get("called", True) for r in rows):
        out.append(
            "Calls 0: a container never called itself (ModuleList, ModuleDict): the time "
            "of the calls inside it"
        )
    if plan.depth is not None and any(r.get("folded") for r in rows):
        out.append(
            f"--depth {plan.depth}: Self of a row at depth {plan.depth} includes every "
            "hidden call below it (folded), so Self adds up to the root"
        )
    if plan.backward:
        missing = [r for r in rows if r.get("backward_why")]
        for r in missing[:5]:
            out.append(f"no backward time for {r['name'] or '(root)'}: {r['backward_why']}")
        if len(missing) > 5:
            out.append(f"no backward time for {len(missing) - 5} more (JSON backward_why)")
        for r in [r for r in rows if r.get("backward_self_why")][:3]:
            name = r["name"] or "(root)"
            out.append(f"no backward self time for {name}: {r['backward_self_why']}")
    if plan.sync and timer == PERF_COUNTER:
        out.append(
            "--sync changes nothing here: it is for cuda, where kernels run after the hook "
            "returns; on the cpu a module's work is done when its hook reads the clock"
        )
    return out


def overhead_line(t: dict[str, Any]) -> str:
    """The overhead with its spread over the repeats, or why no figure is shown."""
    ratio = t.get("overhead_ratio")
    low, high = t.get("overhead_ratio_min"), t.get("overhead_ratio_max")
    if ratio is None:
        return "-"
    if low is None or high is None:  # a report written before the spread was kept
        spread = ""
    elif low == high:
        spread = " (one repeat: no spread)"
    else:
        spread = f" (per repeat {low:.2f}x-{high:.2f}x)"
    if t.get("overhead_shown", True):
        return (
            f"{ratio:.3f}x{spread}: hooked forward {fmt_ms(t['profiled_forward_ms'])} ms "
            f"vs bare forward {fmt_ms(t['bare_forward_ms'])} ms (medians, same run)"
        )
    return (
        f"within the noise (per repeat {low:.2f}x-{high:.2f}x, wider than {ratio:.3f}x is "
        "from 1; raise --repeat, or use a quieter machine)"
    )


def totals_lines(t: dict[str, Any]) -> list[tuple[str, str]]:
    """The totals block."""
    from hookcli.render import fmt_count

    out = [
        (
            "Forward (root)",
            f"{fmt_ms(t['forward_ms'])} ms median (IQR {fmt_ms(t['forward_iqr_ms'])} ms)",
        ),
        ("Overhead", overhead_line(t)),
    ]
    if t.get("backward_ms") is not None:
        out.append(
            (
                "Backward",
                f"{fmt_ms(t['backward_ms'])} ms median (IQR {fmt_ms(t['backward_iqr_ms'])} ms)",
            )
        )
    rate = t["flops_per_s"]
    achieved = f"{fmt_rate(rate)}FLOP/s achieved" if rate is not None else "none counted"
    out.append(("Forward FLOPs", f"{fmt_count(t['flops'])} ({achieved})"))
    out.append(("Calls", f"{t['calls']} module calls of {t['modules']} modules per forward"))
    return out


def plot_top(report: Report, path: Path, top: int, title: str) -> Path:
    """A horizontal bar chart of the ``top`` modules by median self time, IQR as error bars."""
    from hookcli.atomic import atomic_write
    from hookcli.plot import require_matplotlib

    plt = require_matplotlib()
    rows = sorted(report.rows(), key=lambda r: -r["forward_self_ms"])[:top]
    labels = [f"{r['name'] or '(root)'} ({r['type']})" for r in rows][::-1]
    values = [r["forward_self_ms"] for r in rows][::-1]
    height = min(max(3.0, 0.32 * len(rows) + 1.5), 30.0)
    fig, ax = plt.subplots(figsize=(9.0, height), dpi=100)
    try:
        ax.barh(range(len(rows)), values, color="#4c72b0")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xlabel("median self time (ms)")
        ax.set_title(f"{title}: top {len(rows)} modules by self time", fontsize=10)
        fig.tight_layout()
        # atomically, as -o: a failed write leaves no half chart and any old file as it was
        atomic_write(path, lambda f: fig.savefig(f, format="png"), "--plot")
    finally:
        plt.close(fig)
    from hookcli.pipeline import progress

    progress(f"plot written to {path}")
    return path
