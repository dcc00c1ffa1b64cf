"""Modern models at any size, whole process, as ratios against plain scripts.

1. ``hookcli inspect MODEL --device meta`` for the Llama-2-7B- and 70B-shaped
   plain-PyTorch decoders (``sample_models.decoder``) against a plain script that
   builds the same model under ``torch.device("meta")`` and prints torchinfo's
   summary of it. Targets: time <= 1.0x, peak RSS <= 1.0x.
2. ``hookcli inspect hf:llama --device meta`` (7B) against a plain script that
   builds the same transformers model on meta and prints it with its parameter
   count. torchinfo cannot be the baseline here: its summary of a transformers
   Llama on meta stops at the first layer (transformers' mask code calls
   ``.item()``), so the plain script does what can be done without a forward.
3. More than 5,000 module calls: a 5,000-layer Linear+ReLU MLP (10,001 calls) on
   the CPU, ``hookcli inspect`` against a plain script that builds it and runs one
   forward (target <= 1.15x), and ``hf:llama -k num_hidden_layers=400`` on meta
   (5,204 calls). The per-call overhead is measured in process.

Runs are interleaved (plain, hookcli, hookcli with HOOKCLI_FULL_EXIT=1, plain, ...)
and the medians reported. Peak RSS is the high-water mark of the command's largest
process, teardown included: ``ru_maxrss`` from ``wait4`` in a small launcher that
forks the command (forked from the benchmark itself, the command would inherit the
benchmark's resident set as its starting high-water mark), or VmHWM polled from /proc
while it runs, whichever is larger. For the ``hookcli`` command, whose guarding parent
forks the process that does the work, the parent's private pages are added.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import benchmark, record, rounds, smoke  # noqa: E402

REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))

TORCHINFO = """
import torch, torchinfo
from sample_models.decoder import {factory}
with torch.device("meta"):
    model = {factory}()
ids = torch.zeros(1, 128, dtype=torch.long, device="meta")
print(torchinfo.summary(model, input_data=[ids], device="meta", depth=3, verbose=0))
"""
HF_PLAIN = """
import os
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import AutoConfig, AutoModel
config = AutoConfig.for_model("llama", use_cache=False{extra})
with torch.device("meta"):
    model = AutoModel.from_config(config)
print(model)
print(sum(p.numel() for p in model.parameters()))
"""
MLP_PLAIN = """
import torch
from benchmarks.deep_mlp import deep_mlp
torch.manual_seed(0)
model = deep_mlp().eval()
x = torch.randn((1, 64), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    print(model(x).shape)
"""


# A small process that starts the measured one and waits for it: ``wait4`` gives the
# kernel's own high-water mark of the measured tree's largest process, teardown
# included (a peak that polling /proc can miss when it comes in the last milliseconds
# before exit). The measured process is forked from the launcher, not from the
# benchmark, whose resident set a child forked from it would inherit as its starting
# high-water mark.
_LAUNCHER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
took = time.perf_counter() - start
sys.stderr.write(f"\\n{MARK} {usage.ru_maxrss} {took}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""
_MARK = "__bench_modern_child__"


def _run(argv: list[str], extra_env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one command's process tree; stdout discarded.

    The peak is the tree's largest process's high-water mark (``wait4``'s ``ru_maxrss``,
    or VmHWM read while it runs, whichever is larger) plus the private pages of every
    other process of the tree (the guarding parent of the ``hookcli`` command)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(extra_env or {})}
    launcher = [sys.executable, "-c", _LAUNCHER.replace("{MARK}", _MARK), *argv]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(launcher, cwd=ROOT, env=env, stdout=out, stderr=subprocess.PIPE)
        largest = others = 0
        while proc.poll() is None:
            big, private = _tree_peak(proc.pid)
            largest, others = max(largest, big), max(others, private)
            time.sleep(0.02)
        err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err[-500:]}")
    _, maxrss_kib, took = next(
        line.split() for line in reversed(err.splitlines()) if line.startswith(_MARK)
    )
    return float(took), max(largest, int(maxrss_kib) * 1024) + others


def _field(path: str, *names: str) -> int:
    """The sum of ``names`` (kB lines) in a /proc file, in bytes; 0 once the process is gone."""
    total = 0
    try:
        for line in Path(path).read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in names:
                total += int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the `hookcli` command is a guarding parent and the
    child that runs the command)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
    return found


def _tree_peak(launcher: int) -> tuple[int, int]:
    """Below ``launcher``: the largest process's peak so far (VmHWM), and the memory each
    other process of the tree holds alone (its private pages): the guarding parent's own
    cost, not the pages it shares with its child."""
    pids = _tree(launcher)[1:]
    if not pids:
        return 0, 0
    peaks = {p: _field(f"/proc/{p}/status", "VmHWM") for p in pids}
    big = max(peaks, key=lambda p: peaks[p])
    private = sum(
        _field(f"/proc/{p}/smaps_rollup", "Private_Clean", "Private_Dirty")
        for p in pids
        if p != big
    )
    return peaks[big], private


FULL_EXIT = {"HOOKCLI_FULL_EXIT": "1"}


def compare(name: str, plain: list[str], hooked: list[str]) -> dict[str, float]:
    """Interleaved runs; medians of time and peak RSS; ratios hooked/plain.

    hookcli runs twice per round: as shipped (it leaves with ``os._exit`` once the
    report is out, skipping torch's teardown), and with an ordinary interpreter
    shutdown (``HOOKCLI_FULL_EXIT=1``), which is what the plain scripts pay.
    """
    runs = {"plain": (plain, None), "hookcli": (hooked, None), "full exit": (hooked, FULL_EXIT)}
    times: dict[str, list[float]] = {key: [] for key in runs}
    peaks: dict[str, list[int]] = {key: [] for key in runs}
    _run(plain)  # warm the page cache
    for _ in range(rounds(REPEATS)):
        for key, (argv, env) in runs.items():
            t, rss = _run(argv, env)
            times[key].append(t)
            peaks[key].append(rss)
    t = {key: statistics.median(v) for key, v in times.items()}
    r = {key: statistics.median(v) for key, v in peaks.items()}
    # Like for like first: the plain script and hookcli with HOOKCLI_FULL_EXIT=1 both pay
    # the interpreter's teardown; then hookcli as shipped (os._exit after the report).
    print(
        f"{name:<44} plain {t['plain']:6.2f} s {r['plain'] / 2**30:5.2f} GiB | hookcli, "
        f"full exit {t['full exit']:6.2f} s {r['full exit'] / 2**30:5.2f} GiB, time x"
        f"{t['full exit'] / t['plain']:.2f}, RSS x{r['full exit'] / r['plain']:.2f} | as "
        f"shipped: {t['hookcli']:6.2f} s {r['hookcli'] / 2**30:5.2f} GiB, time x"
        f"{t['hookcli'] / t['plain']:.2f}, RSS x{r['hookcli'] / r['plain']:.2f}",
        flush=True,
    )
    out = {
        "time_full": t["full exit"] / t["plain"],
        "rss_full": r["full exit"] / r["plain"],
        "time": t["hookcli"] / t["plain"],
        "rss": r["hookcli"] / r["plain"],
    }
    return out


def per_call_overhead(repeats: int = 5) -> None:
    """In process: (``hookcli.inspect(model, x)`` - bare) / calls for the 5,000-layer MLP."""
    import torch

    import hookcli
    from benchmarks.common import interleave
    from benchmarks.deep_mlp import deep_mlp

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model = deep_mlp().eval()
    x = torch.randn(1, 64)

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    calls = 0

    def inspect() -> None:
        nonlocal calls
        calls = len(hookcli.inspect(model, x).layers)

    try:
        res = interleave({"bare": bare, "inspect": inspect}, rounds(repeats))
    finally:
        torch.set_num_threads(before)
    b, h = res["bare"]["wall"], res["inspect"]["wall"]
    print(
        f"per call (in process, 1 thread, {calls} calls): bare {b * 1e6 / calls:.1f} us, "
        f"hookcli.inspect {h * 1e6 / calls:.1f} us, overhead {(h - b) * 1e6 / calls:.1f} us "
        f"(x{res['inspect']['ratio']:.2f}, the Report included)",
        flush=True,
    )


def torch_teardown() -> None:
    """What the interpreter's shutdown of a process that imported torch costs: ``python -c
    "import torch"`` against the same ending in ``os._exit(0)``, interleaved, medians."""
    py = sys.executable
    runs = {
        "exit": [py, "-c", "import torch"],
        "os._exit": [py, "-c", "import os, torch; os._exit(0)"],
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    peaks: dict[str, list[int]] = {k: [] for k in runs}
    _run(runs["exit"])  # warm the page cache
    for _ in range(rounds(REPEATS)):
        for key, argv in runs.items():
            took, rss = _run(argv)
            times[key].append(took)
            peaks[key].append(rss)
    t = {k: statistics.median(v) for k, v in times.items()}
    r = {k: statistics.median(v) / 1e6 for k, v in peaks.items()}
    print(
        f"python -c 'import torch': {t['exit']:.2f} s, peak RSS {r['exit']:.0f} MB; ending "
        f"in os._exit(0): {t['os._exit']:.2f} s, {r['os._exit']:.0f} MB",
        flush=True,
    )
    record("torch_exit_s", t["exit"], what='`python -c "import torch"`', unit="s")
    record(
        "torch_os_exit_s",
        t["os._exit"],
        what='`python -c "import os, torch; os._exit(0)"` (no interpreter teardown)',
        unit="s",
    )
    record(
        "torch_teardown_mb",
        r["exit"] - r["os._exit"],
        what="peak RSS that the interpreter's teardown adds to `import torch`",
        unit="MB",
    )


@benchmark
def main() -> None:
    py = sys.executable
    hook = [py, "-m", "hookcli", "inspect"]
    for factory in ("llama_7b",) if smoke() else ("llama_7b", "llama_70b"):
        r = compare(
            f"{factory} (file model) on meta vs torchinfo",
            [py, "-c", TORCHINFO.format(factory=factory)],
            [*hook, f"sample_models.decoder:{factory}", "--device", "meta", "-d", "3"],
        )
        what = f"`inspect` {factory} on meta vs torchinfo, whole process"
        record(f"{factory}_time_full", r["time_full"], what=what + ", full exit: time")
        record(
            f"{factory}_rss_full",
            r["rss_full"],
            what=what + ", full exit: peak RSS",
        )
        record(f"{factory}_time", r["time"], what=what + ", as shipped: time")
        record(f"{factory}_rss", r["rss"], what=what + ", as shipped: peak RSS")
    if not smoke():
        compare(
            "hf:llama (7B) on meta vs build + print",
            [py, "-c", HF_PLAIN.format(extra="")],
            [*hook, "hf:llama", "--device", "meta", "-d", "3"],
        )
        compare(
            "hf:llama 400 layers (5,204 calls) on meta",
            [py, "-c", HF_PLAIN.format(extra=", num_hidden_layers=400")],
            [*hook, "hf:llama", "-k", "num_hidden_layers=400", "--device", "meta", "-f", "json"],
        )
    r = compare(
        "5,000-layer MLP (10,001 calls) on cpu",
        [py, "-c", MLP_PLAIN],
        [*hook, "benchmarks.deep_mlp:deep_mlp", "-i", "1x64", "-f", "json"],
    )
    what = "`inspect` of a 5,000-layer MLP vs build + one forward, whole process"
    record("mlp_time_full", r["time_full"], what=what + ", full exit")
    record("mlp_time", r["time"], what=what + ", as shipped")
    per_call_overhead()
    torch_teardown()


if __name__ == "__main__":
    main()
