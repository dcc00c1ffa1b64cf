"""inspect overhead, as ratios against bare PyTorch.

1. In one process: ``inspect``'s hooked run (session, forward, rows) on resnet50,
   batch 8, against a bare ``torch.inference_mode()`` forward; median of several
   interleaved runs. Target <= 1.10.
2. Whole process: ``hookcli inspect resnet50 --format json`` against a plain
   script that imports torch+torchvision, builds resnet50 and runs one forward.
   Target <= 1.05.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPEATS = 5
PLAIN_SCRIPT = """
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.get_model("resnet50", weights=None).eval()
x = torch.randn((1, 3, 224, 224), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    model(x)
"""


def in_process(batch: int = 8, repeats: int = REPEATS) -> tuple[float, float]:
    import torch

    from hookcli.layers import layer_rows
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare, run_session

    prepared = prepare(ModelOptions("resnet50"), RunOptions(inputs=(f"{batch}x3x224x224",)))
    model, x = prepared.model, prepared.inputs.args[0]
    model.eval()  # what inspect runs in by default (torchvision builds in train mode)

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    def hooked() -> None:
        outcome = run_session(prepared, [], mode=Mode.EVAL)
        layer_rows(outcome.records, model)

    bare()
    hooked()  # warm-up
    t_bare, t_hook = [], []
    for _ in range(repeats):
        for fn, acc in ((bare, t_bare), (hooked, t_hook)):
            start = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - start)
    return statistics.median(t_bare), statistics.median(t_hook)


def whole_process(repeats: int = 3) -> tuple[float, float, float]:
    """Medians: the plain script, hookcli, and hookcli with an ordinary interpreter
    shutdown (``HOOKCLI_FULL_EXIT=1``), interleaved."""
    hookcli = [sys.executable, "-m", "hookcli", "inspect", "resnet50", "--format", "json"]
    plain = [sys.executable, "-c", PLAIN_SCRIPT]

    def wall(cmd: list[str], full_exit: str = "") -> float:
        env = {**os.environ, "HOOKCLI_FULL_EXIT": full_exit}
        start = time.perf_counter()
        subprocess.run(
            cmd, check=True, stdout=subprocess.DEVNULL, cwd=Path(__file__).parent.parent, env=env
        )
        return time.perf_counter() - start

    wall(plain)  # warm the file cache
    t_plain, t_cli, t_full = [], [], []
    for _ in range(repeats):
        t_plain.append(wall(plain))
        t_cli.append(wall(hookcli))
        t_full.append(wall(hookcli, "1"))
    return statistics.median(t_plain), statistics.median(t_cli), statistics.median(t_full)


def help_time(repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "hookcli", "--help"], check=True, stdout=subprocess.DEVNULL
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print(f"hookcli --help: {help_time():.3f} s (target < 0.2 s)", flush=True)
    bare, hooked = in_process()
    print(
        f"inspect resnet50 b8, in process: bare {bare:.3f} s, hooked {hooked:.3f} s, "
        f"ratio {hooked / bare:.3f} (target <= 1.10)",
        flush=True,
    )
    plain, cli, full = whole_process()
    print(
        f"inspect resnet50 whole process: plain script {plain:.2f} s, hookcli {cli:.2f} s, "
        f"ratio {cli / plain:.3f} (target <= 1.05); with an ordinary shutdown "
        f"(HOOKCLI_FULL_EXIT=1) {full:.2f} s, ratio {full / plain:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
