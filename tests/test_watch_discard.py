"""What a step is when the script decides: an iteration it discards itself (backward and
clipping ran, then ``zero_grad`` instead of ``step()``), clipping with another
``norm_type``, a NaN that was in the batch already (``--nan-origin``), the script's own
``traceback.print_exc()``, and the table row of a run with NaN weights. The oracle is
the script's own figures: its losses, what ``clip_grad_norm_`` returned, plain
autograd."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from tests.conftest import REPO

TIMEOUT = 180
WATCH = (sys.executable, "-m", "hookcli", "watch")


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def close(a: Any, b: Any, rel: float = 1e-6) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-9)


def records(w: Any, kind: str) -> list[dict[str, Any]]:
    return [r for r in w.records if r["kind"] == kind]


def guarded_loop(
    w_args: dict[str, Any], bad: dict[int, str], clear: str = "optimizer", acc: int = 1
) -> tuple[Any, list[dict[str, float]], list[dict[str, float]]]:
    """The common guard: ``gn = clip_grad_norm_(...); if gn > 1e4 or not finite:
    zero_grad(); continue``. ``bad``: iteration -> "big" or "nan" (a corrupt batch).
    ``clear``: how the script throws the gradients away. What the script saw of its
    stepped and of its discarded iterations."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stepped: list[dict[str, float]] = []
    dropped: list[dict[str, float]] = []
    with hookcli.watch(model, opt, **w_args) as w:
        for it in range(1, 9):
            losses = []
            for _ in range(acc):  # gradient accumulation: micro-batches, one step
                x, y = torch.randn(4, 8), torch.randn(4, 1)
                if bad.get(it) == "big":
                    y = y * 1e6
                elif bad.get(it) == "nan":
                    y[0, 0] = float("nan")
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                losses.append(loss.item())
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            seen = {"loss": sum(losses), "grad_norm": gn}
            if gn > 1e4 or not math.isfinite(gn):
                dropped.append(seen)
                if clear == "optimizer":
                    opt.zero_grad()
                elif clear == "model":
                    model.zero_grad()
                else:
                    for p in model.parameters():
                        p.grad = None
                continue
            opt.step()
            opt.zero_grad()
            stepped.append(seen)
    return w, stepped, dropped


@pytest.mark.parametrize("clear", ["optimizer", "model", "grad=None"])
def test_a_discarded_iteration_is_its_own_record(clear: str) -> None:
    w, stepped, dropped = guarded_loop({"every": 1}, {4: "big"}, clear)
    assert len(dropped) == 1 and dropped[0]["grad_norm"] > 1e4
    steps = records(w, "step")
    # every step carries its own loss and clip norm: nothing of the discarded batch
    assert [s["step"] for s in steps] == list(range(1, len(stepped) + 1))
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in stepped], rel=1e-6)
    for s, mine in zip(steps, stepped, strict=True):
        assert close(s["grad_norm"], mine["grad_norm"]), (s, mine)
    (skip,) = records(w, "skipped")
    assert skip["by"] == "zero_grad" and skip["after"] == 3
    assert close(skip["loss"], dropped[0]["loss"])
    assert close(skip["grad_norm"], dropped[0]["grad_norm"])  # what clip returned
    totals = w.report().totals["models"][0]
    assert totals["steps"] == len(stepped) and totals["skipped_steps"] == 1
    assert totals["skipped_by"] == {"zero_grad": 1}


def test_gradient_accumulation_is_still_one_step() -> None:
    w, stepped, dropped = guarded_loop({"every": 1}, {}, acc=3)
    assert not dropped and not records(w, "skipped")
    steps = records(w, "step")
    assert [s["backwards"] for s in steps] == [3] * len(stepped)
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in stepped], rel=1e-6)
    for s, mine in zip(steps, stepped, strict=True):
        assert close(s["grad_norm"], mine["grad_norm"])


def test_a_nan_in_a_discarded_batch_is_not_the_next_steps() -> None:
    w, stepped, dropped = guarded_loop({"fail_on": "nan", "stop_on": "nan"}, {4: "nan"})
    assert math.isnan(dropped[0]["loss"]) and len(stepped) == 7  # the run was not stopped
    assert all(math.isfinite(s["loss"]) for s in records(w, "step"))
    assert not records(w, "stop")
    # (under stop_on a NaN loss is written as its backward begins: the skipped record
    # after it says it was not a step's)
    assert all(e["step"] == 4 for e in records(w, "nonfinite"))
    (skip,) = records(w, "skipped")
    assert skip["loss"] == "nan" and skip["after"] == 3
    report = w.report()
    (check,) = [c for c in report.checks if c.name == "nan"]
    assert check.passed and "1 skipped iteration(s) held NaN, the first after step 3" in (
        check.detail
    )


def test_exploding_names_a_discarded_iteration_without_failing() -> None:
    w, _, dropped = guarded_loop({"max_grad_norm": 1e4}, {4: "big"})
    report = w.report()
    (check,) = [c for c in report.checks if c.name == "exploding"]
    assert check.passed and "had a grad norm above 10000, the first after step 3" in check.detail
    assert dropped[0]["grad_norm"] > 1e4


@pytest.mark.parametrize("norm_type", [math.inf, 1.0, 3.0])
def test_grad_norm_is_what_clip_grad_norm_returns_for_any_norm_type(norm_type: float) -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    returned, per_module = [], []
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(3):
            loss = ((model(torch.randn(4, 8)) - torch.randn(4, 1)) ** 2).mean() * 10
            loss.backward()
            per_module.append(
                math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model[0].parameters()))
            )
            returned.append(
                float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, norm_type))
            )
            opt.step()
            opt.zero_grad()
    steps = records(w, "step")
    for s, ret, mod in zip(steps, returned, per_module, strict=True):
        assert close(s["grad_norm"], ret), (s["grad_norm"], ret)
        assert s["norm_type"] == ("inf" if math.isinf(norm_type) else norm_type)
        assert s["clipped"] is (ret > 0.1)
        assert close(s["modules"]["0"]["grad_norm"], mod)  # per module: L2, as documented
    label = "inf" if math.isinf(norm_type) else f"{norm_type:g}"
    assert f"({label}-norm)" in w.report().render()


def test_an_l2_clip_records_no_norm_type() -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookcli.watch(model, opt) as w:
        model(torch.randn(4, 8)).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
    (step,) = records(w, "step")
    assert "norm_type" not in step and "clipped" not in step


def test_a_clip_that_changes_nothing_is_not_a_clipped_step() -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    returned = []
    with hookcli.watch(model, opt) as w:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
            opt.step()
            opt.zero_grad()
    steps = records(w, "step")
    assert [s["grad_norm"] for s in steps] == returned  # what the call returned
    assert all(s["grad_norm_applied"] == s["grad_norm"] for s in steps)
    assert w.report().totals["models"][0]["clipped_steps"] == 0


def test_nan_origin_names_the_input_that_held_it() -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hookcli.watch(model, opt, nan_origin=True, fail_on="nan") as w:
        for it in range(1, 5):
            x = torch.randn(4, 8)
            if it == 3:
                x[0, 0] = float("nan")  # the batch itself
            ((model(x) - 1) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    (event,) = [e for e in records(w, "nonfinite") if e["what"] == "nan"]
    assert (event["step"], event["phase"], event["module"]) == (3, "forward", "")
    assert event["found_by"] == "input" and event["exact"]
    text = w.report().render()
    assert "it came in with the model's input" in text and "run with --nan-origin" not in text


def test_nan_origin_never_asks_for_itself() -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hookcli.watch(model, opt, nan_origin=True, fail_on="nan") as w:
        for it in range(1, 4):
            y = torch.randn(4, 1)
            if it == 2:
                y[0, 0] = float("nan")  # the targets: no module sees it
            ((model(torch.randn(4, 8)) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    (event,) = [e for e in records(w, "nonfinite") if e["what"] == "nan"]
    assert event["step"] == 2 and event["module"] is None
    text = w.report().render()
    assert "first NaN at step 2" in text and "--nan-origin to find" not in text


def test_a_table_row_is_one_steps_figures() -> None:
    """every=2, the weights NaN from step 5 on: the row's update/weight is the last
    logged step's, not an older one beside a NaN weight norm."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookcli.watch(model, opt, every=2) as w:
        for it in range(1, 9):
            x = torch.randn(4, 8)
            if it == 5:
                x[0, 0] = float("nan")
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    assert math.isnan(float(model[0].weight.detach().sum()))  # the script's own weights
    (row,) = [r for r in w.report().layers if r.data["name"] == "0"]
    assert math.isnan(row.data["weight_norm"])
    assert math.isnan(row.data["update_ratio"])


PRINTS = """
import sys, traceback, torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(2, 2)).sum().backward(); opt.step(); opt.zero_grad()
def closure():
    model(torch.ones(1, 2)).sum().backward()
    raise ValueError("closure failed")
calls = [
    lambda: opt.step(closure),
    lambda: torch.autograd.backward(model(torch.ones(1, 2)).sum(), grad_tensors=torch.ones(3)),
    lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True),
    lambda: torch.optim.SGD([], lr=0.1),
]
for call in calls:
    model(torch.ones(1, 2)).sum().backward()
    for p in model.parameters():
        p.grad.fill_(float("nan"))
    try:
        call()
    except Exception:
        traceback.print_exc()
    opt.zero_grad()
"""


def test_the_scripts_own_print_exc_shows_no_monitor_frame(tmp_path: Path) -> None:
    script = tmp_path / "prints.py"
    script.write_text(PRINTS)
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT
    )
    watched = subprocess.run(
        [*WATCH, "--out", str(tmp_path / "run"), "--", sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert plain.returncode == 0 and watched.returncode == 0, watched.stderr[-2000:]

    def frames(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("  File ")]

    # (the command's output goes to hookcli watch's stderr)
    assert plain.stderr.count("Traceback") == watched.stderr.count("Traceback") == 4
    if sys.version_info >= (3, 11):  # (3.10 re-raises with the wrapper's own frame)
        assert frames(watched.stderr) == frames(plain.stderr)
        assert "hookcli/" not in watched.stderr


def test_the_command_records_a_discarded_iteration(tmp_path: Path) -> None:
    """The guard of a real script under ``hookcli watch``: its losses as it printed them."""
    script = tmp_path / "guard.py"
    script.write_text(
        "import torch, sys\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for it in range(1, 8):\n"
        "    x, y = torch.randn(4, 8), torch.randn(4, 1)\n"
        "    if it == 4: y[0, 0] = float('nan')\n"
        "    loss = ((m(x) - y) ** 2).mean(); loss.backward()\n"
        "    gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)\n"
        "    if not torch.isfinite(gn):\n"
        "        print('DROP', loss.item(), flush=True); opt.zero_grad(); continue\n"
        "    opt.step(); opt.zero_grad(); print('STEP', loss.item(), gn.item(), flush=True)\n"
    )
    out, report = tmp_path / "run", tmp_path / "r.json"
    r = subprocess.run(
        [
            *WATCH,
            "--fail-on",
            "nan",
            "--out",
            str(out),
            "--format",
            "json",
            "-o",
            str(report),
            "--",
            sys.executable,
            str(script),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    printed = [line.split() for line in r.stderr.splitlines() if line[:4] in ("STEP", "DROP")]
    lines = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    assert [s["loss"] for s in steps] == [float(p[1]) for p in printed if p[0] == "STEP"]
    assert [s["grad_norm"] for s in steps] == [float(p[2]) for p in printed if p[0] == "STEP"]
    (skip,) = [x for x in lines if x["kind"] == "skipped"]
    assert skip["loss"] == "nan" and [p[1] for p in printed if p[0] == "DROP"] == ["nan"]
    made = json.loads(report.read_text())
    assert made["totals"]["models"][0]["skipped_by"] == {"zero_grad": 1}
    assert [c["passed"] for c in made["checks"]] == [True]


def test_the_page_labels_a_grad_norm_of_another_norm_type() -> None:
    from hookcli.html import render_html

    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookcli.watch(model, opt) as w:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, math.inf)
            opt.step()
            opt.zero_grad()
    assert "total grad norm (inf-norm)" in render_html(w.report())


def test_a_backward_that_misses_the_model_is_not_a_discard() -> None:
    """A backward over other tensors first (the model's grads still None), then the
    model's: one step with both losses, as documented; nothing skipped."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    temperature = torch.ones(1, requires_grad=True)  # not the model's
    losses = []
    with hookcli.watch(model, opt) as w:
        for _ in range(3):
            opt.zero_grad()
            aux = (temperature * 2).sum()
            aux.backward()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(aux.item() + loss.item())
    assert not records(w, "skipped")
    assert [s["loss"] for s in records(w, "step")] == pytest.approx(losses, rel=1e-6)


def _watched(tmp_path: Path, source: str) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    """``hookcli watch`` over a script that prints ``SCRIPT {json}`` lines: the run and
    its steps.jsonl records."""
    script, out = tmp_path / "train.py", tmp_path / "run"
    script.write_text(source)
    r = subprocess.run(
        [*WATCH, "--out", str(out), "--", sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    path = out / "steps.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return r, [json.loads(line) for line in lines]


def _printed(r: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line[7:]) for line in r.stderr.splitlines() if line.startswith("SCRIPT ")]


GAN_SEPARATE = """\
import json, sys, torch, torch.nn as nn
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
oG = torch.optim.Adam(G.parameters(), 1e-3); oD = torch.optim.Adam(D.parameters(), 1e-3)
for i in range(4):
    x, z = torch.randn(4, 4), torch.randn(4, 2)
    oD.zero_grad(); dl = D(x).mean() - D(G(z).detach()).mean(); dl.backward(); oD.step()
    oG.zero_grad(); gl = -D(G(z)).mean(); gl.backward(); D.zero_grad(); oG.step()
    print("SCRIPT " + json.dumps({"dl": dl.item(), "gl": gl.item()}), file=sys.stderr, flush=True)
"""


def test_zeroing_one_model_while_one_not_yet_stepped_holds_gradients_is_no_discard(
    tmp_path: Path,
) -> None:
    """A GAN: G's backward fills D's gradients too, and ``D.zero_grad()`` before
    ``oG.step()`` clears them. On the first iteration G has not stepped yet: its
    gradients are still another model's, so nothing is discarded."""
    r, lines = _watched(tmp_path, GAN_SEPARATE)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = _printed(r)
    assert not [x for x in lines if x["kind"] == "skipped"]
    steps = [x for x in lines if x["kind"] == "step"]
    by_opt: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        by_opt.setdefault(s["opt"], []).append(s)
    d_steps, g_steps = by_opt[0], by_opt[1]  # D stepped first
    assert [s["loss"] for s in d_steps] == [p["dl"] for p in printed]
    assert [s["loss"] for s in g_steps] == [p["gl"] for p in printed]
    assert [s["backwards"] for s in steps] == [1] * 8


def test_nothing_recorded_says_a_backward_ran_and_no_step_completed(tmp_path: Path) -> None:
    """An LBFGS closure that runs its backward and raises (the script catches it): no
    step is recorded, and the reason says what did happen."""
    r, lines = _watched(
        tmp_path,
        "import json, sys, torch\n"
        "m = torch.nn.Linear(4, 1); opt = torch.optim.LBFGS(m.parameters(), max_iter=2)\n"
        "def closure():\n"
        "    opt.zero_grad(); l = m(torch.randn(4, 4)).pow(2).mean(); l.backward()\n"
        "    raise ValueError('in closure')\n"
        "try: opt.step(closure)\n"
        "except ValueError as e:\n"
        "    grads = all(p.grad is not None for p in m.parameters())\n"
        "    print('SCRIPT ' + json.dumps({'grads': grads, 'error': str(e)}), file=sys.stderr)\n",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert _printed(r) == [{"grads": True, "error": "in closure"}]  # its backward ran
    assert not [x for x in lines if x["kind"] == "step"]
    (why,) = [line for line in r.stderr.splitlines() if "none recorded a step" in line]
    assert "a backward ran" in why and "no backward" not in why
    assert "1 optimizer.step() call began and none completed" in why


GAN_ONE_MODULE = """\
import json, sys, torch, torch.nn as nn
class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
torch.manual_seed(0); m = GAN()
oG = torch.optim.Adam(m.G.parameters(), 1e-3); oD = torch.optim.Adam(m.D.parameters(), 1e-2)
def freeze(mod, f):
    for p in mod.parameters(): p.requires_grad_(not f)
for i in range(6):
    x, z = torch.randn(4, 4), torch.randn(4, 2)
    freeze(m.D, True); gl = -m.D(m.G(z)).mean(); gl.backward(); oG.step(); oG.zero_grad()
    freeze(m.D, False)
    freeze(m.G, True); dl = m.D(x).mean() - m.D(m.G(z)).mean(); dl.backward(); oD.step()
    oD.zero_grad(); freeze(m.G, False)
    print("SCRIPT " + json.dumps({"gl": gl.item(), "dl": dl.item()}), file=sys.stderr, flush=True)
"""


def test_one_module_whose_optimizers_each_have_a_backward_steps_per_optimizer(
    tmp_path: Path,
) -> None:
    """A GAN in one module, toggle_optimizer style: G's backward and step, then D's.
    Each optimizer's step is a step with its own backward's loss, and names it."""
    r, lines = _watched(tmp_path, GAN_ONE_MODULE)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = _printed(r)
    steps = [x for x in lines if x["kind"] == "step"]
    assert [s["loss"] for s in steps] == [v for p in printed for v in (p["gl"], p["dl"])]
    assert [s["optimizers"] for s in steps] == [[0], [1]] * 6
    assert [s["lr"] for s in steps] == [[1e-3], [1e-2]] * 6
    assert [s["backwards"] for s in steps] == [1] * 12
    (model,) = [x for x in lines if x["kind"] == "model"]
    assert model["optimizer"] == "Adam+Adam" and not [x for x in lines if x["kind"] == "skipped"]


def test_the_table_and_page_say_which_norm_each_grad_norm_is_in() -> None:
    """Clipping with the inf-norm: ``grad_norm`` is what the clip returned (inf-norm),
    ``grad_norm_applied`` the L2 of what ``step()`` applied; the table's totals line and
    the page's models table label each with its norm."""
    from hookcli.fmt import fmt_float
    from hookcli.html import render_html

    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookcli.watch(model, opt) as w:
        for _ in range(3):
            model(torch.randn(4, 8)).pow(2).sum().backward()
            returned = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, math.inf))
            applied = float(
                torch.linalg.vector_norm(
                    torch.cat([p.grad.flatten() for p in model.parameters()]).double()
                )
            )
            opt.step()
            opt.zero_grad()
    report = w.report()
    (line,) = [v for k, v in report.table_totals if k == "grad norm"]
    assert line.startswith(f"{fmt_float(returned)} (max ")
    assert "(inf-norm) before clipping; " in line
    assert f"; {fmt_float(applied)} as applied (L2, 3 clipped steps)" in line
    page = re.sub(r"<[^>]+>", "", render_html(report))  # the cells' text
    assert f"{fmt_float(returned)} (inf-norm)" in page and f"{fmt_float(applied)} (L2)" in page
