"""Where the monitor's records go: a list in memory (the Python API) or one steps file
per process (``hookcli watch``), one ``write`` per line."""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from typing import Any

from hookcli.watch.config import WatchConfig


def _rank() -> tuple[int | None, int | None, int | None]:
    """(rank, world size, local rank) from torchrun's or Slurm's environment."""
    env = os.environ

    def num(*keys: str) -> int | None:
        for key in keys:
            with contextlib.suppress(KeyError, ValueError):
                return int(env[key])
        return None

    return (
        num("RANK", "SLURM_PROCID"),
        num("WORLD_SIZE", "SLURM_NTASKS"),
        num("LOCAL_RANK", "SLURM_LOCALID"),
    )


def _plain(value: Any) -> Any:
    """JSON-ready: non-finite floats as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class MemorySink:
    """Records kept in a list (the Python API)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(_plain(record))

    def close(self) -> None:
        pass


class FileSink:
    """One ``steps.jsonl`` per process under the run's folder, a line per record,
    flushed as written: a run that is killed keeps every line written before."""

    def __init__(self, config: WatchConfig) -> None:
        self.folder = config.out
        self.path: str | None = None
        self._file: Any = None
        self._lock = threading.Lock()

    def _open(self) -> Any:
        assert self.folder is not None
        os.makedirs(self.folder, exist_ok=True)
        rank = _rank()[0]
        names = ([f"steps.rank{rank}.jsonl"] if rank is not None else ["steps.jsonl"]) + [
            f"steps.pid{os.getpid()}.jsonl"
        ]
        for name in names:
            path = os.path.join(self.folder, name)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            self.path = path
            return fd
        raise FileExistsError(f"every steps file name is taken in {self.folder}")

    def write(self, record: dict[str, Any]) -> None:
        try:  # the common case: every number finite, nothing to convert
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        except ValueError:
            line = json.dumps(_plain(record), separators=(",", ":"), allow_nan=False)
        data = (line + "\n").encode()
        with self._lock:
            if self._file is None:
                self._file = self._open()
            while data:  # one write per record, no buffer a kill could lose
                data = data[os.write(self._file, data) :]

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    os.close(self._file)
                self._file = None
