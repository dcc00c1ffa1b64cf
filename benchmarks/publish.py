"""Write the benchmark tables of README.md and docs/performance.md from one run's figures.

Usage: ``python benchmarks/publish.py [benchmarks/last-run.json]`` (``make bench-docs``
runs every benchmark, then this). Each page holds its table between
``<!-- bench:begin -->`` and ``<!-- bench:end -->``; nothing else on the page is touched.
The table says when, with which torch and on what machine the figures were taken, and
that the machine was busy when its load average was above half its cores.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
# The README shows the headline figures; docs/performance.md every recorded one.
README_KEYS = (
    "inspect",
    "inspect_floor",
    "grads",
    "grads_floor",
    "stats_1t",
    "stats_floor_1t",
    "stats_2t",
    "stats_floor_2t",
    "stats_rss",
    "cost_b8",
    "llama_7b_time_full",
    "llama_7b_rss_full",
    "mlp_time_full",
    "mlp_time",
    "ablate_one",
    "ablate_all",
    "profile",
    "fsdp",
)


def _value(r: dict[str, Any]) -> str:
    unit = r.get("unit", "x")
    if unit == "s":
        return f"{r['value']:.2f} s"
    if unit == "%":
        return f"{r['value']:.1f}%"
    if unit == "us":
        return f"{r['value']:.1f} us"
    return f"{r['value']:.2f}"


def table(data: dict[str, Any], keys: tuple[str, ...] | None) -> str:
    m = data["machine"]
    # The benchmarks' own processes (2 threads, 2 torchrun ranks) load a 2-core machine up
    # to about 2; only a load above the cores says that other work shared it.
    busy = m["load_1min"] > (m["cores"] or 1)
    lines = [
        f"Measured by `make bench` on {data['date']}, torch {data['torch']}, Python "
        f"{data['python']}, {m['cpu']} ({m['cores']} cores, no GPU)"
        + (
            f"; the machine was shared with other work (1-minute load average up to "
            f"{m['load_1min']}), so times are noisy: ratios come from interleaved rounds."
            if busy
            else (
                f"; nothing else ran (1-minute load average up to {m['load_1min']}, "
                "the benchmarks' own processes included)."
            )
        ),
        "",
        "| what | figure | target |",
        "|---|---|---|",
    ]
    rows = data["results"]
    if keys is not None:
        by_key = {r["key"]: r for r in rows}
        rows = [by_key[k] for k in keys if k in by_key]
    for r in rows:
        lines.append(f"| {r['what']} | {_value(r)} | {r['target'] or '-'} |")
    if data.get("failed"):
        lines += ["", f"Benchmarks that failed in this run: {', '.join(data['failed'])}."]
    return "\n".join(lines)


def replace(path: Path, text: str) -> None:
    page = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(page):
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", page), encoding="utf-8")


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else ROOT / "benchmarks" / "last-run.json"
    data = json.loads(source.read_text(encoding="utf-8"))
    replace(ROOT / "README.md", table(data, README_KEYS))
    replace(ROOT / "docs" / "performance.md", table(data, None))
    print(f"README.md and docs/performance.md updated from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
