"""Write the benchmark tables of README.md and docs/performance.md from one run's figures.

Usage: ``python benchmarks/publish.py [benchmarks/last-run.json]`` (``make bench-docs``
runs every benchmark, then this). Each page holds its table between
``<!-- bench:begin -->`` and ``<!-- bench:end -->``; nothing else on the page is touched.

The table's header names the machine every figure in it comes from: the date, the CPU
model and cores, torch's version and default thread count (a column gives each figure's
own), Python, and the load average as the run measured it (at its start and end).
Each figure's target comes from ``benchmarks.common.TARGETS``, and its status
(met or NOT MET) is printed and shown as measured; a figure that has a noise row (the
same reference run twice: ``KEY_again``, which reads 1 on a steady machine) and whose
margin to its target is smaller than that row's distance from 1 is "within noise"
instead, neither met nor missed. Figures of the same benchmarks
measured on another CPU kind (``benchmarks/other-runs/*.json``, a run's JSON kept, or
figures reported from another machine) sit in a column beside them, headed by that
machine; a file from the same CPU model as this run is left out.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import TARGETS, target_bound, verdict  # noqa: E402

OTHER_RUNS = ROOT / "benchmarks" / "other-runs"
# Keys that runs before the current benchmarks wrote for the same measurement.
RENAMED = {"profile": "profile_overhead"}
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
# The README shows the headline figures; docs/performance.md every recorded one.
README_KEYS = (
    "inspect_vs_floor",
    "inspect",
    "inspect_floor",
    "inspect_vs_noop_floor",
    "grads_vs_floor",
    "grads",
    "grads_floor",
    "grads_vs_outputs_floor",
    "stats_vs_floor_1t",
    "stats_1t",
    "stats_floor_1t",
    "stats_vs_floor_2t",
    "stats_2t",
    "stats_floor_2t",
    "stats_rss",
    "cost_vs_flopcounter_b1",
    "cost_vs_flopcounter_b8",
    "cost_b1",
    "cost_b8",
    "llama_7b_time_full",
    "llama_7b_rss_full",
    "mlp_time_full",
    "mlp_time",
    "ablate_one",
    "ablate_all",
    "profile_whole",
    "profile_overhead",
    "ddp",
    "fsdp",
    "watch_gpt",
    "watch_gpt_every50",
    "watch_gpt_again",
    "watch_resnet18",
    "watch_resnet18_every50",
    "watch_resnet18_again",
    "watch_inproc_resnet18",
    "watch_inproc_resnet18_every50",
    "watch_inproc_resnet18_again",
    "help_s",
)


def _value(r: dict[str, Any]) -> str:
    unit = r.get("unit", "x")
    if unit == "s":
        return f"{r['value']:.2f} s"
    if unit == "%":
        return f"{r['value']:.1f}%"
    if unit == "us":
        return f"{r['value']:.1f} us"
    if unit == "ms":
        return f"{r['value']:.2f} ms"
    if unit == "MB":
        return f"{r['value']:.0f} MB"
    return f"{r['value']:.3f}"


def target(r: dict[str, Any]) -> str:
    """Today's target for the figure (``TARGETS``), whatever the run recorded."""
    return TARGETS.get(r["key"], "-")


WITHIN_NOISE = "within noise"


def noise_row(r: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The figure's noise row: ``watch_gpt`` and ``watch_gpt_every50`` -> ``watch_gpt_again``
    (``_cuda`` kept at the end)."""
    m = re.fullmatch(r"(.+?)(_every\d+)?(_cuda|_mps|_xpu)?", r["key"])
    if m is None:
        return None
    key = f"{m.group(1)}_again{m.group(3) or ''}"
    return next((x for x in results if x["key"] == key), None)


def status(r: dict[str, Any], results: list[dict[str, Any]] | None = None) -> str:
    """met / NOT MET as measured; "within noise" where the figure's margin to its bound
    is smaller than its noise row's distance from 1 (a verdict the run cannot give)."""
    found = verdict(float(r["value"]), target(r))
    bound = target_bound(target(r))
    noise = noise_row(r, results or [])
    if (
        found
        and bound is not None
        and noise is not None
        and abs(float(r["value"]) - bound[1]) < abs(float(noise["value"]) - 1.0)
    ):
        return WITHIN_NOISE
    return found


def _cpu(data: dict[str, Any]) -> str:
    return str(data.get("machine", {}).get("cpu", "unknown CPU"))


def other_runs(data: dict[str, Any], folder: Path = OTHER_RUNS) -> list[dict[str, Any]]:
    """The kept figures of other CPU models than this run's, oldest first."""
    runs = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        other = load(path)
        if _cpu(other) != _cpu(data):
            other["file"] = (
                path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
            )
            runs.append(other)
    return runs


def _describe(other: dict[str, Any]) -> str:
    m = other.get("machine", {})
    when = other.get("source") or f"`make bench` on {other.get('date', '?')}"
    return (
        f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores), torch {other.get('torch', '?')}, "
        f"{when} (`{other['file']}`)"
    )


def ran_by(data: dict[str, Any], folder: Path = ROOT / "benchmarks") -> str:
    """How the run was made: ``make bench`` where every benchmark ran, else the runner
    with the names it was given."""
    every = {p.stem for p in folder.glob("bench_*.py")}
    # those that started (their machine line), and those that failed, even before it
    ran = {c.get("bench") for c in data.get("benchmarks", [])} | set(data.get("failed", []))
    if not ran or every <= ran:
        return "`make bench`"
    names = " ".join(sorted(n.removeprefix("bench_") for n in ran if n))
    left = ", ".join(sorted(every - ran))
    return f"`python benchmarks/run.py {names}` (every benchmark but {left})"


def conditions(m: dict[str, Any]) -> str:
    """The load on the machine as the run measured it (``benchmarks/run.py``: the
    1-minute load average at the start, after each benchmark, and at the end), named as
    such: the benchmarks' own processes are in it, and whether other work ran is not
    inferred from it."""
    if "load_1min_start" in m and "load_1min_end" in m:
        return (
            f"1-minute load average {m['load_1min_start']} at the start and "
            f"{m['load_1min_end']} at the end (highest between benchmarks "
            f"{m['load_1min']}), as measured, the benchmarks' own processes included"
        )
    return (
        f"1-minute load average up to {m['load_1min']} between benchmarks, as measured, "
        "the benchmarks' own processes included"
    )


def header(data: dict[str, Any]) -> str:
    m = data["machine"]
    threads = m.get("threads")
    gpu = m.get("gpu") or "no GPU"
    return (
        f"Measured by {ran_by(data)} on {data['date']} on **{m['cpu']}** "
        f"({m['cores']} cores, {gpu}), torch {data['torch']} "
        + (
            f"with {threads} threads by default (the threads column gives each figure's)"
            if threads
            else "(thread counts not recorded by this run)"
        )
        + f", Python {data['python']}; {conditions(m)}."
    )


def table(
    data: dict[str, Any], keys: tuple[str, ...] | None, others: list[dict[str, Any]] | None = None
) -> str:
    others = other_runs(data) if others is None else others
    lines = [header(data)]
    if others:
        lines += [
            "",
            "Beside them, the same figures measured on another CPU (for comparison; the "
            "status column judges this machine's figures only): "
            + "; ".join(f"[{i + 1}] {_describe(o)}" for i, o in enumerate(others))
            + ".",
        ]
    extra = "".join(f" {o['machine'].get('cpu', '?')} [{i + 1}] |" for i, o in enumerate(others))
    lines += [
        "",
        f"| what | threads | figure | target | status |{extra}",
        "|---|---|---|---|---|" + "---|" * len(others),
    ]
    rows = data["results"]
    if keys is not None:
        by_key = {r["key"]: r for r in rows}
        rows = [by_key[k] for k in keys if k in by_key]
    beside = [{r["key"]: r for r in o.get("results", [])} for o in others]

    def same(b: dict[str, dict[str, Any]], r: dict[str, Any]) -> bool:
        # the same measurement: a key whose sentence changed (a floor that reads more
        # than it did) times something else, and is listed below the table instead
        return r["key"] in b and b[r["key"]]["what"] == r["what"]

    for r in rows:
        cells = "".join(f" {_value(b[r['key']]) if same(b, r) else '-'} |" for b in beside)
        threads = r.get("threads")
        lines.append(
            f"| {r['what']} | {threads if threads is not None else '-'} | {_value(r)} | "
            f"{target(r)} | {status(r, data['results']) or '-'} |{cells}"
        )
    if keys is None:  # the full table: what another machine measured that this run did not
        shown = {r["key"]: r for r in rows}
        for i, (o, b) in enumerate(zip(others, beside, strict=True)):
            rest = [r for k, r in b.items() if k not in shown or not same(b, shown[k])]
            if rest:
                lines += [
                    "",
                    f"Also measured on [{i + 1}] {o['machine'].get('cpu', '?')}: "
                    + "; ".join(f"{r['what']}: {_value(r)}" for r in rest)
                    + ".",
                ]
    if data.get("failed"):
        lines += ["", f"Benchmarks that failed in this run: {', '.join(data['failed'])}."]
    return "\n".join(lines)


def replace(path: Path, text: str) -> None:
    page = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(page):
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", page), encoding="utf-8")


def statuses(data: dict[str, Any]) -> list[str]:
    """One line per figure with a target: met or NOT MET, as measured."""
    out = []
    for r in data["results"]:
        s = status(r, data["results"])
        if s:
            noise = noise_row(r, data["results"]) if s == WITHIN_NOISE else None
            why = f", noise row {_value(noise)}" if noise is not None else ""
            out.append(f"{s:<8} {r['key']}: {_value(r)} (target {target(r)}{why}) {r['what']}")
    return out


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for r in data.get("results", []):
        r["key"] = RENAMED.get(r["key"], r["key"])
    return data


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else ROOT / "benchmarks" / "last-run.json"
    data = load(source)
    others = other_runs(data)
    replace(ROOT / "README.md", table(data, README_KEYS, others))
    replace(ROOT / "docs" / "performance.md", table(data, None, others))
    print(header(data))
    lines = statuses(data)
    for line in lines:
        print(line)
    missed = sum(1 for line in lines if line.startswith("NOT MET"))
    noisy = sum(1 for line in lines if line.startswith(WITHIN_NOISE))
    print(
        f"targets: {len(lines) - missed - noisy} of {len(lines)} met, {noisy} within noise, "
        f"on {_cpu(data)}"
    )
    print(f"README.md and docs/performance.md updated from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
