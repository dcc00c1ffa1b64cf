"""Reading the steps files of a run, one per process (rank), into one picture.

No torch: the parent (``hookcli watch``) reads what the monitors wrote. A file cut
short (a killed process) is read up to its last whole line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def nonfinite_kind(value: float | None) -> str | None:
    """``"nan"``, ``"inf"`` (either sign), or None for a finite value or none."""
    if value is None or math.isfinite(value):
        return None
    return "nan" if math.isnan(value) else "inf"


@dataclass
class Process:
    """What one process wrote: its start record, models, steps and events."""

    path: Path
    start: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> model record
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # label -> steps
    events: list[dict[str, Any]] = field(default_factory=list)  # nonfinite records
    stops: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    end: dict[str, Any] | None = None
    skipped: dict[str, int] = field(default_factory=dict)  # label -> skipped iterations
    discarded: list[dict[str, Any]] = field(default_factory=list)  # their records

    @property
    def rank(self) -> int | None:
        rank = self.start.get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def name(self) -> str:
        """``rank 1``, or ``pid 123`` for a process that is not a rank."""
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"pid {self.start.get('pid', '?')}"

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "start":
            self.start = record
        elif kind == "model":
            self.models[str(record.get("model"))] = record
            self.steps.setdefault(str(record.get("model")), [])
        elif kind == "step":
            self.steps.setdefault(str(record.get("model")), []).append(record)
        elif kind == "nonfinite":
            self.events.append(record)
        elif kind == "stop":
            self.stops.append(record)
        elif kind == "skipped":
            label = str(record.get("model"))
            self.skipped[label] = self.skipped.get(label, 0) + 1
            self.discarded.append(record)
            # a non-finite loss written as its backward began (--stop-on) belonged to
            # this iteration, not to a step
            after = record.get("after")
            self.events = [
                e
                for e in self.events
                if not (str(e.get("model")) == label and e.get("step") == (after or 0) + 1)
            ]
        elif kind == "error":
            self.errors.append(str(record.get("message")))
        elif kind == "end":
            self.end = record


def read_lines(
    lines: Iterable[str], process: Process, on_step: Callable[[dict[str, Any]], None] | None = None
) -> None:
    """Add every whole JSON line to ``process`` (a torn last line is skipped), and hand
    each step record to ``on_step`` as it is added."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            process.add(record)
            if on_step is not None and record.get("kind") == "step":
                on_step(record)


def step_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("steps*.jsonl"))


def read_run(folder: Path) -> list[Process]:
    """Every process that wrote a steps file under ``folder``, by rank, then pid."""
    out = []
    for path in step_files(folder):
        process = Process(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            read_lines(f, process)
        if process.start or process.steps:
            out.append(process)
    return sorted(out, key=lambda p: (p.rank is None, p.rank or 0, p.start.get("pid") or 0))


def read_records(records: Iterable[dict[str, Any]]) -> list[Process]:
    """One process from records held in memory (the Python API)."""
    process = Process(Path("<memory>"))
    for record in records:
        process.add(record)
    return [process] if process.start or process.steps else []


@dataclass(frozen=True)
class First:
    """The first non-finite value of a run: which process, model and step, the phase and
    the origin module (``exact``: seen in the outputs/grads, not guessed)."""

    process: str
    rank: int | None
    model: str
    step: int
    what: str
    phase: str | None
    module: str | None
    exact: bool
    found_by: str
    searched: bool = False  # --nan-origin was on in that process

    def text(self, several: bool, models: int) -> str:
        word = "NaN" if self.what == "nan" else "Inf"
        where = f" on {self.process}" if several else ""
        of = f" of {self.model}" if models > 1 else ""
        phase = f" in the {self.phase} pass" if self.phase else ""
        if self.module is None and self.searched:
            origin = (
                "; no module made it (--nan-origin saw every module's inputs and outputs "
                "finite: it arose outside the modules, in the loss or its targets)"
                if self.phase == "forward"
                else "; origin module not found (--nan-origin saw no module's input "
                "gradient turn non-finite)"
            )
        elif self.module is None:
            origin = "; origin module not known (run with --nan-origin to find it)"
        elif self.found_by == "input":
            into = "the model's input" if self.module == "" else f"the input of {self.module}"
            origin = f"; it came in with {into} (no module made it: the batch held it)"
        elif self.exact:
            origin = f"; first produced by {self.module or '(root)'}"
        else:
            origin = (
                f"; first parameter gradients holding it (in backward order): "
                f"{self.module or '(root)'} (an estimate: --nan-origin finds the exact module)"
            )
        return f"first {word} at step {self.step}{of}{where}{phase}{origin}"


def firsts(processes: list[Process], what: str) -> list[First]:
    """The first ``what`` ("nan"/"inf") of each process and model, earliest first: by
    step, then the forward pass before the backward, then rank."""
    found = []
    for p in processes:
        for e in p.events:
            if e.get("what") != what:
                continue
            found.append(
                First(
                    process=p.name,
                    rank=p.rank,
                    model=str(e.get("model")),
                    step=int(e.get("step") or 0),
                    what=what,
                    phase=e.get("phase"),
                    module=e.get("module"),
                    exact=bool(e.get("exact")),
                    found_by=str(e.get("found_by") or ""),
                    searched=bool(p.start.get("nan_origin")),
                )
            )
    return sorted(found, key=lambda f: (f.step, f.phase != "forward", f.rank or 0))


def finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]
