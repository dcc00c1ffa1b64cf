"""``hookcli watch`` on the training loops people use, with the published packages:
pytorch-lightning (automatic optimization, whose steps are ``optimizer.step(closure)``,
and manual), Hugging Face ``Trainer`` (with and without ``max_grad_norm``),
``accelerate launch`` with 2 CPU processes, and torchrun DDP. Each is checked against
the loop's own figures: the losses its code computed, the grad norm that
``clip_grad_norm_`` returned (or Lightning's ``on_before_optimizer_step`` saw, before it
clips), ``Trainer``'s ``log_history``; never against hookcli's own output.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.real.conftest import need

SCRIPTS = REPO / "tests" / "watch_scripts"
BIN = Path(sys.executable).parent
TIMEOUT = 240


def watch(out: Path, *command: str, options: tuple[str, ...] = ("--every", "1")) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "hookcli", "watch", "--out", str(out), *options, "--", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def steps_of(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if r["kind"] == "step"]


def close(a: Any, b: Any, rel: float = 1e-5) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-9)


def test_lightning_automatic_optimization_closure_steps(tmp_path: Path) -> None:
    need("pytorch_lightning")
    seen_file, plain_file = tmp_path / "seen.json", tmp_path / "plain.json"
    script = str(SCRIPTS / "lightning_loop.py")
    plain = subprocess.Popen(  # the unwatched run, beside the watched one
        [sys.executable, script, str(plain_file), "--steps", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    r = watch(tmp_path / "run", sys.executable, script, str(seen_file), "--steps", "5")
    _, err = plain.communicate(timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert plain.returncode == 0, err[-2000:]
    seen = json.loads(seen_file.read_text())
    # the training is not changed: the module's own losses, bit for bit
    assert [s["loss"] for s in seen] == [s["loss"] for s in json.loads(plain_file.read_text())]
    steps = steps_of(tmp_path / "run" / "steps.jsonl")
    # each step carries its own loss (step 1 too, and the last), not the one before
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert [s["loss"] for s in steps] == [s["loss"] for s in seen]
    for s, mine in zip(steps, seen, strict=True):
        assert close(s["grad_norm"], mine["grad_norm"]), (s, mine)  # before Lightning clips
        assert mine["grad_norm"] > 0.5 and close(s["grad_norm_applied"], 0.5, 1e-4)
        assert "act" in s["modules"]["net.1"]  # activation statistics, step 1 included


def test_lightning_manual_optimization(tmp_path: Path) -> None:
    need("pytorch_lightning")
    seen_file = tmp_path / "seen.json"
    command = (sys.executable, str(SCRIPTS / "lightning_loop.py"), str(seen_file), "--manual")
    r = watch(tmp_path / "run", *command, "--steps", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(seen_file.read_text())
    steps = steps_of(tmp_path / "run" / "steps.jsonl")
    assert [s["loss"] for s in steps] == [s["loss"] for s in seen]
    for s, mine in zip(steps, seen, strict=True):
        assert close(s["grad_norm"], mine["grad_norm"]), (s, mine)  # clip_grad_norm_'s return


def test_lightning_manual_optimization_gan_steps_per_optimizer(tmp_path: Path) -> None:
    """Lightning's GAN pattern (one module, two optimizers, toggle_optimizer, a
    manual_backward per optimizer): each optimizer's step is a step, with that
    backward's loss, naming its optimizer."""
    need("pytorch_lightning")
    seen_file = tmp_path / "seen.json"
    command = (sys.executable, str(SCRIPTS / "lightning_gan.py"), str(seen_file))
    r = watch(tmp_path / "run", *command, "--batches", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(seen_file.read_text())
    steps = steps_of(tmp_path / "run" / "steps.jsonl")
    assert [s["loss"] for s in steps] == [v for b in seen for v in (b["g_loss"], b["d_loss"])]
    assert [s["optimizers"] for s in steps] == [[0], [1]] * 3
    assert [s["lr"] for s in steps] == [[2e-4], [1e-3]] * 3
    assert [s["backwards"] for s in steps] == [1] * 6


def trainer_run(tmp_path: Path, max_grad_norm: str) -> tuple[list[dict], list[dict]]:
    need("transformers")
    log = tmp_path / "log.json"
    command = (sys.executable, str(SCRIPTS / "hf_trainer.py"), str(log))
    r = watch(tmp_path / "run", *command, "--max-grad-norm", max_grad_norm, "--steps", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    history = [h for h in json.loads(log.read_text()) if "grad_norm" in h]
    return history, steps_of(tmp_path / "run" / "steps.jsonl")


def test_hf_trainer_with_max_grad_norm(tmp_path: Path) -> None:
    history, steps = trainer_run(tmp_path, "0.5")
    assert [h["step"] for h in history] == [s["step"] for s in steps] == [1, 2, 3, 4]
    for h, s in zip(history, steps, strict=True):
        assert close(s["loss"], h["loss"], 1e-4), (h, s)  # Trainer's logged loss
        assert close(s["grad_norm"], h["grad_norm"]), (h, s)  # Trainer's logged grad_norm
        assert h["grad_norm"] > 0.5 and close(s["grad_norm_applied"], 0.5, 1e-4)


def test_hf_trainer_without_clipping(tmp_path: Path) -> None:
    history, steps = trainer_run(tmp_path, "0")
    assert len(history) == len(steps) == 4
    for h, s in zip(history, steps, strict=True):
        assert close(s["loss"], h["loss"], 1e-4), (h, s)
        assert close(s["grad_norm"], h["grad_norm"]), (h, s)
        assert s["grad_norm_applied"] == s["grad_norm"]


def test_accelerate_launch_two_cpu_processes(tmp_path: Path) -> None:
    need("accelerate")
    prefix = tmp_path / "seen"
    command = (
        str(BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        "0",
        str(SCRIPTS / "accelerate_loop.py"),
        str(prefix),
    )
    r = watch(tmp_path / "run", *command)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads(Path(f"{prefix}.rank{rank}.json").read_text())
        steps = steps_of(tmp_path / "run" / f"steps.rank{rank}.jsonl")
        assert [s["loss"] for s in steps] == [s["loss"] for s in seen]  # each rank's own
        for s, mine in zip(steps, seen, strict=True):
            assert close(s["grad_norm"], mine["clip"]), (rank, s, mine)
            assert close(s["grad_norm_applied"], 0.1, 1e-4)


def test_torchrun_ddp_stop_on_nan_names_rank_1(tmp_path: Path) -> None:
    """Rank 1 alone goes NaN in its forward at step 3 (``ddp_nan.py``: an all-zero row
    that ``module.encoder.norm`` divides by its norm; tests/test_watch_scripts.py checks
    that claim with plain hooks); --stop-on ends the run: the report names rank 1."""
    command = (
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(29500 + os.getpid() % 1000),
        str(SCRIPTS / "ddp_nan.py"),
        "--steps",
        "6",
        "--nan-step",
        "3",
    )
    options = ("--nan-origin", "--fail-on", "nan", "--stop-on", "nan")
    r = watch(tmp_path / "run", *command, options=options)
    assert r.returncode == 1, r.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    first = report["totals"]["first_nonfinite"]
    assert (first["rank"], first["step"], first["phase"], first["module"]) == (
        1,
        3,
        "forward",
        "module.encoder.norm",
    )
    # rank 1's own record is in its file, written before its backward's all-reduce
    rank1 = (tmp_path / "run" / "steps.rank1.jsonl").read_text()
    assert '"kind":"nonfinite"' in rank1


@pytest.mark.parametrize("fsdp", ["1", "2"])
def test_torchrun_fsdp_pre_clip_norm_is_what_clipping_returned(tmp_path: Path, fsdp: str) -> None:
    """FSDP on 2 CPU ranks (gloo): each rank holds a shard of the gradients, so only the
    clipping call knows the whole model's norm. FSDP1's own method
    ``model.clip_grad_norm_`` and, under FSDP2, ``torch.nn.utils.clip_grad_norm_`` over
    DTensor gradients: ``grad_norm`` is what the call returned in the script, per rank."""
    prefix = tmp_path / "seen"
    command = (
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(29500 + (os.getpid() + int(fsdp) * 7) % 1000),
        str(SCRIPTS / "fsdp_clip.py"),
        str(prefix),
        "--fsdp",
        fsdp,
    )
    r = watch(tmp_path / "run", *command)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "monitor stopped" not in r.stderr, r.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads(Path(f"{prefix}.rank{rank}.json").read_text())
        steps = steps_of(tmp_path / "run" / f"steps.rank{rank}.jsonl")
        assert [s["step"] for s in steps] == [1, 2, 3, 4]
        assert [s["loss"] for s in steps] == [s["loss"] for s in seen]
        for s, mine in zip(steps, seen, strict=True):
            assert mine["clip"] > 1.0  # clipped to 0.1: the applied norm is another figure
            assert close(s["grad_norm"], mine["clip"], 1e-6), (rank, s, mine)
            assert s["grad_norm_applied"] < 0.1 + 1e-4  # this rank's shard, after clipping


def test_lightning_clipping_with_another_norm_type(tmp_path: Path) -> None:
    """Lightning's automatic optimization, the module clipping in its own
    ``configure_gradient_clipping`` with the inf norm: ``grad_norm`` is what
    ``clip_grad_norm_`` returned there, ``norm_type`` says which norm."""
    need("pytorch_lightning")
    seen_file = tmp_path / "seen.json"
    command = (sys.executable, str(SCRIPTS / "lightning_loop.py"), str(seen_file))
    r = watch(tmp_path / "run", *command, "--steps", "4", "--norm-type", "inf")
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(seen_file.read_text())
    steps = steps_of(tmp_path / "run" / "steps.jsonl")
    assert [s["loss"] for s in steps] == [s["loss"] for s in seen]
    for s, mine in zip(steps, seen, strict=True):
        assert close(s["grad_norm"], mine["clip_returned"]), (s, mine)
        assert s["norm_type"] == "inf"
    assert "(inf-norm)" in r.stdout


def test_lightning_nan_in_the_batch_under_nan_origin(tmp_path: Path) -> None:
    """A NaN the batch held (step 3): --nan-origin says it came in with the input of the
    module ``training_step`` called, and never asks to be run."""
    need("pytorch_lightning")
    seen_file = tmp_path / "seen.json"
    command = (sys.executable, str(SCRIPTS / "lightning_loop.py"), str(seen_file))
    r = watch(
        tmp_path / "run",
        *command,
        "--steps",
        "4",
        "--nan-batch",
        "3",
        options=("--nan-origin", "--fail-on", "nan"),
    )
    assert r.returncode == 1, r.stderr[-3000:]
    seen = json.loads(seen_file.read_text())
    first_nan = next(i + 1 for i, s in enumerate(seen) if math.isnan(s["loss"]))
    lines = [json.loads(x) for x in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    (event,) = [x for x in lines if x["kind"] == "nonfinite" and x["what"] == "nan"]
    assert (event["step"], event["module"], event["found_by"]) == (first_nan, "net", "input")
    assert "it came in with the input of net" in r.stdout
    assert "run with --nan-origin" not in r.stdout
