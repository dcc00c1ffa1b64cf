"""``hookcli.watch`` on the loop shapes of issue 45, in this process, each against the
loop's own figures: closure steps (``optimizer.step(closure)``, LBFGS), the grad norm
before clipping (what ``clip_grad_norm_`` returns), GradScaler's skipped iterations and
unscaled loss, one model with two optimizers, activation statistics and the backward
NaN's module against plain hooks, and what a watched process's user sees (tracebacks,
warnings, a wrong argument)."""

from __future__ import annotations

import math
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from hookcli.watch.monitor import StopTraining
from tests.conftest import REPO


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))


def l2(tensors: list[Any]) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


def close(a: Any, b: Any, rel: float = 1e-5) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-9)


def steps(w: Any, kind: str = "step") -> list[dict[str, Any]]:
    return [r for r in w.records if r["kind"] == kind]


class Acts:
    """Plain forward hooks: each module's first output per step, its statistics."""

    def __init__(self, model: nn.Module) -> None:
        self.per_step: list[dict[str, dict[str, float]]] = [{}]
        for name, m in model.named_modules():
            m.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            if name in self.per_step[-1] or not torch.is_grad_enabled():
                return
            t = out.detach().double()
            self.per_step[-1][name] = {
                "mean": float(t.mean()),
                "std": float(t.std(unbiased=False)),
                "absmax": float(t.abs().max()),
                "zero_frac": float((t == 0).double().mean()),
            }

        return hook

    def next(self) -> None:
        self.per_step.append({})


def check_acts(record: dict[str, Any], plain: dict[str, dict[str, float]]) -> int:
    n = 0
    for name, figures in plain.items():
        got = record["modules"][name]["act"]
        for key, want in figures.items():
            assert math.isclose(got[key], want, rel_tol=1e-5, abs_tol=1e-6), (name, key)
            n += 1
    return n


@pytest.mark.parametrize("kind", ["sgd", "lbfgs"])
def test_closure_steps_carry_their_own_loss_norm_and_activations(kind: str) -> None:
    model = net()
    acts = Acts(model)
    if kind == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    else:
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    seen: list[dict[str, Any]] = []
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(4):
            first = [True]

            def closure(first: list[bool] = first) -> torch.Tensor:
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                if first[0]:  # the figures of the step: its closure's first call
                    first[0] = False
                    seen.append(
                        {"loss": loss.item(), "norm": l2([p.grad for p in model.parameters()])}
                    )
                return loss

            opt.step(closure)  # type: ignore[arg-type]
            acts.next()
    records = steps(w)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["loss"] for r in records] == [s["loss"] for s in seen]  # the last one too
    compared = 0
    for r, s, plain in zip(records, seen, acts.per_step, strict=False):
        assert close(r["grad_norm"], s["norm"]) and r["backwards"] == 1
        compared += check_acts(r, plain)  # step 1 included
    assert compared >= 4 * 3 * 4


def test_stop_on_nan_in_a_closure_step_stops_before_its_update() -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(8, 6), torch.randn(8, 1)
    before: list[torch.Tensor] = []
    with pytest.raises(StopTraining), hookcli.watch(model, opt, stop_on="nan") as w:
        for step in range(1, 6):
            before = [p.detach().clone() for p in model.parameters()]

            def closure(step: int = step) -> torch.Tensor:
                opt.zero_grad()
                scale = float("nan") if step == 3 else 1.0
                loss = nn.functional.mse_loss(model(x * scale), y)
                loss.backward()
                return loss

            opt.step(closure)
    assert [r["step"] for r in steps(w, "stop")] == [3]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_grad_norm_before_clipping_is_what_clip_grad_norm_returns() -> None:
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 6), 10 * torch.randn(16, 1)
    returned: list[float] = []
    per_module: list[float] = []
    applied: list[float] = []
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            per_module.append(l2([model[0].weight.grad, model[0].bias.grad]))
            returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
            applied.append(l2([p.grad for p in model.parameters()]))
            opt.step()
    for r, ret, mod, app in zip(steps(w), returned, per_module, applied, strict=True):
        assert ret > 0.1 and close(r["grad_norm"], ret)
        assert close(r["grad_norm_applied"], app) and close(app, 0.1, 1e-4)
        assert close(r["modules"]["0"]["grad_norm"], mod)
    report = w.report()
    assert close(report.totals["models"][0]["grad_norm_max"], max(returned))
    assert report.totals["models"][0]["clipped_steps"] == 3


def test_grad_scaler_skipped_iterations_are_their_own_records() -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # a scale near float32's largest: the scaled gradients overflow, the scaler skips,
    # backs off 16x, steps, grows 16x again, ...
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=2.0**124, growth_factor=16.0, backoff_factor=1 / 16, growth_interval=1
    )
    x, y = torch.randn(16, 6), 1000 * torch.randn(16, 1)
    done: list[float] = []
    skipped: list[float] = []
    with hookcli.watch(model, opt, every=1) as w:
        for _ in range(8):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scale = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            (skipped if scaler.get_scale() < scale else done).append(loss.item())
    assert skipped and done
    assert [r["loss"] for r in steps(w)] == done  # unscaled, as the script computed it
    assert [r["loss"] for r in steps(w, "skipped")] == skipped
    assert all(r["backwards"] == 1 for r in steps(w))
    assert w.report().totals["models"][0]["skipped_steps"] == len(skipped)


def test_two_optimizers_over_one_model_are_one_model() -> None:
    model = net()
    sgd = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(model[2].parameters(), lr=1e-2)
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    losses, norms = [], []
    with hookcli.watch(model, every=1) as w:
        for _ in range(3):
            sgd.zero_grad()
            adam.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss.item())
            norms.append(l2([p.grad for p in model.parameters()]))
            head = [p.detach().clone() for p in model[2].parameters()]
            sgd.step()
            adam.step()
    assert {r["model"] for r in w.records if r["kind"] == "model"} == {"Sequential"}
    records = steps(w)
    assert [r["loss"] for r in records] == losses
    assert all(close(r["grad_norm"], n) for r, n in zip(records, norms, strict=True))
    assert len(records[-1]["lr"]) == 2
    assert [r["optimizers"] for r in records] == [[0, 1]] * 3  # both took every step
    ratio = l2([p - h for p, h in zip(model[2].parameters(), head, strict=True)]) / l2(head)
    assert close(records[-1]["modules"]["2"]["update_ratio"], ratio, 1e-4)
    rows = w.report().layers
    assert sorted(r.data["name"] for r in rows) == ["", "0", "1", "2"]


def test_a_backward_nan_is_named_as_plain_backward_hooks_name_it() -> None:
    class Length(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.pow(2).sum(-1, keepdim=True).sqrt()

    class Shift(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = nn.Parameter(torch.randn(4))

        def forward(self, x):
            return x + self.b

    def build() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(Shift(), Length(), nn.Linear(1, 1))

    def batch(model: nn.Sequential) -> torch.Tensor:
        x = torch.randn(8, 4)
        shift: Any = model[0]
        x[0] = -shift.b.detach()  # a zero row: sqrt at 0, an infinite gradient, NaN
        return x

    good = torch.randn(8, 4)
    # plain: the first module (in backward order) whose input grad is non-finite while
    # the grad of its output is finite
    plain = build()
    found: list[str] = []
    for name, m in plain.named_modules():
        if name:

            def hook(m: nn.Module, gin: Any, gout: Any, name: str = name) -> None:
                bad_in = any(g is not None and not torch.isfinite(g).all() for g in gin)
                bad_out = any(g is not None and not torch.isfinite(g).all() for g in gout)
                if bad_in and not bad_out:
                    found.append(name)

            m.register_full_backward_hook(hook)
    plain(batch(plain)).sum().backward()
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookcli.watch(model, opt, nan_origin=True) as w:
        for k in (1, 2):
            opt.zero_grad()
            model(good if k == 1 else batch(model)).sum().backward()
            opt.step()
    (event,) = [r for r in w.records if r["kind"] == "nonfinite"]
    assert found and (event["step"], event["phase"]) == (2, "backward")
    assert event["module"] == found[0] and event["exact"]


def test_watch_refuses_what_is_not_a_model() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module"):
        hookcli.watch("notamodel")  # type: ignore[arg-type]


def test_an_error_in_the_training_has_no_monitor_frames() -> None:
    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    model = net()
    with pytest.raises(ValueError, match="boom") as info, hookcli.watch(model):
        Boom.apply(model(torch.randn(2, 6))).sum().backward()
    files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert not [f for f in files if "hookcli" in f], files


SCRIPT = """
import torch
class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()
    @staticmethod
    def backward(ctx, g):
        raise ValueError("boom")
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 3)).sum().backward()
opt.step()
Boom.apply(model(torch.randn(2, 3))).sum().backward()
"""


def test_a_watched_scripts_traceback_is_the_unwatched_one(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(SCRIPT)
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    watched = subprocess.run(
        [
            sys.executable,
            "-m",
            "hookcli",
            "watch",
            "--out",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            str(script),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == watched.returncode == 1

    def frames(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("  File ")]

    assert frames(plain.stderr) and frames(watched.stderr) == frames(plain.stderr)


def test_torch_compile_under_watch_adds_no_warning() -> None:
    model = net()
    compiled = torch.compile(model, backend="eager")
    with warnings.catch_warnings(record=True) as caught, hookcli.watch(model, every=1):
        compiled(torch.randn(4, 6)).sum().backward()
    assert not [w for w in caught if "global hooks" in str(w.message)]
