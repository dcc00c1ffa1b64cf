"""The tier's two sides: hookcli run from the command line, and the same model in plain PyTorch.

A package's test class (``class TestTimm(PackageChecks)``) names one `Package`: the MODEL
string, its ``-k`` and ``-i`` options as a user types them, and a ``build`` that makes the
same model here as its own documentation says to. `PackageChecks` then runs ``inspect``,
``grads``, ``cost --backward``, ``stats`` and ``profile`` once each, in a subprocess
(``python -m hookcli ... -f json``, no file of ours), and checks their figures against
plain PyTorch on the model built here with the seeding of the docs (``torch.manual_seed(N)``
right before building; inputs from a ``torch.Generator`` seeded N, in declaration order:
floats with ``randn``, integers with ``randint``):

- ``totals.params`` against ``sum(p.numel())`` over the unique parameters;
- the loss and total grad norm of ``grads`` (``--loss sum``) against autograd in float64
  (the model built in float32, then ``.double()``; the same inputs as float64);
- ``cost``'s forward and backward FLOPs against ``FlopCounterMode`` on a plain forward and
  backward;
- the module calls of ``inspect``, ``stats`` and ``profile`` against forward hooks on every
  module of a plain forward; ``stats``' root figures against the plain output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from tests.real.conftest import need

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300
# float32 against float64: the loss within this fraction of the output's L1 norm (the
# scale of a float32 sum's rounding), the grad norm within this relative error
LOSS_TOL = 1e-5
NORM_TOL = 1e-4
# the same float32 forward here and in hookcli, reduced in float64 on both sides
STATS_TOL = 1e-5
PROFILE_ARGS = ("--warmup", "1", "--repeat", "3")

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "long": torch.int64,
    "int32": torch.int32,
}


@dataclasses.dataclass(frozen=True)
class Package:
    module: str  # what ``need`` imports: the package the registry gave
    spec: str  # MODEL as typed
    build: Callable[[], nn.Module]  # the same model, built here as the package documents it
    inputs: tuple[str, ...]  # the -i SPECs as typed
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # -k KEY=repr(VALUE)
    seed: int = 0
    options: tuple[str, ...] = ()  # options every command gets
    grads_mode: str = "train"  # grads' --mode (train is grads' default)
    # swaps, for the float64 reference only, a published forward that casts to float32
    # for the exact same function computed in the tensor's own dtype
    float64_patch: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    def argv(self, command: str, *extra: str) -> list[str]:
        args = [*command.split(), self.spec]
        for key, value in self.kwargs.items():
            args += ["-k", f"{key}={value!r}"]
        for spec in self.inputs:
            args += ["-i", spec]
        return [*args, "--seed", str(self.seed), *self.options, *extra, "-f", "json"]


# -- hookcli, from the command line -----------------------------------------------------


def hookcli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m hookcli ARGV`` from the repository root, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "HOOKCLI_NO_CONFIG": "1"},
    )


def hookcli_json(argv: list[str]) -> dict[str, Any]:
    """`hookcli` with exit 0 and no traceback asserted: the report."""
    proc = hookcli(argv)
    shown = f"$ hookcli {' '.join(argv)}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, shown
    assert "Traceback" not in proc.stderr, shown
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


# -- plain PyTorch ------------------------------------------------------------------------


def draw_inputs(specs: tuple[str, ...], seed: int) -> list[torch.Tensor]:
    """The -i SPECs (``[DTYPE:]DIMS[:LOW..HIGH]``) drawn as the docs' seeding says."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        parts = spec.split(":")
        dtype = DTYPES[parts.pop(0)] if parts[0] in DTYPES else torch.float32
        shape = tuple(int(d) for d in parts[0].replace(",", "x").split("x"))
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g, dtype=dtype))
        else:
            low, high = map(int, parts[1].split("..")) if len(parts) > 1 else (0, 2)
            out.append(torch.randint(low, high, shape, generator=g).to(dtype))
    return out


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of an output structure in order (dict values in key order, dataclass
    fields in order: diffusers' ``UNet2DOutput``)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat_tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in flat_tensors(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in flat_tensors(getattr(value, f.name))]
    return []


def floats_of(value: Any) -> list[torch.Tensor]:
    return [t for t in flat_tensors(value) if t.is_floating_point()]


def built(pkg: Package) -> nn.Module:
    """The model as ``--seed N`` builds it: ``torch.manual_seed(N)`` right before."""
    need(pkg.module)
    torch.manual_seed(pkg.seed)
    return pkg.build()


def unique_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields each tensor once


def plain_forward(pkg: Package) -> tuple[Any, Counter[str]]:
    """An eval forward without autograd (as the forward-only commands run): the output and
    the module calls a forward hook on every module sees, by qualified name."""
    model = built(pkg).eval()
    calls: Counter[str] = Counter()
    names = {m: name for name, m in model.named_modules()}
    handles = [m.register_forward_hook(lambda m, a, o: calls.update([names[m]])) for m in names]
    try:
        with torch.no_grad():
            out = model(*draw_inputs(pkg.inputs, pkg.seed))
    finally:
        for h in handles:
            h.remove()
    return out, calls


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors a forward makes for itself (masks, position tables) in ``dtype`` too."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def float64_autograd(pkg: Package) -> tuple[float, float, float]:
    """`sum_loss_backward` of one forward in float64 (built in float32, then ``.double()``)."""
    model = built(pkg).double().train(pkg.grads_mode == "train")
    inputs = [x.double() if x.is_floating_point() else x for x in draw_inputs(pkg.inputs, pkg.seed)]
    with default_dtype(torch.float64), pkg.float64_patch():
        out = model(*inputs)
    return sum_loss_backward(model, out)


def sum_loss_backward(model: nn.Module, out: Any) -> tuple[float, float, float]:
    """(loss, total grad norm, L1 norm of the output) of grads' default loss (the sum of every
    floating output element), all float64, backpropagated through ``model``."""
    floats = floats_of(out)
    assert floats and all(t.dtype == torch.float64 for t in floats)
    loss = torch.stack([t.sum() for t in floats]).sum()
    loss.backward()
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    scale = sum(float(t.detach().abs().sum()) for t in floats)
    return float(loss.detach()), float(torch.cat(grads).norm()), scale


def assert_float64_close(totals: dict[str, Any], reference: tuple[float, float, float]) -> None:
    """grads' loss and total grad norm (float32) against the float64 reference."""
    loss, norm, scale = reference
    assert abs(totals["loss"] - loss) <= LOSS_TOL * scale, (totals["loss"], loss, scale)
    assert math.isclose(totals["grad_norm"], norm, rel_tol=NORM_TOL), (totals["grad_norm"], norm)


def counted_flops(pkg: Package) -> tuple[int, int]:
    """(forward, backward) FLOPs by ``FlopCounterMode`` on a plain eval forward and the
    backward of the sum loss, with PyTorch's own kernel choices (fused attention too)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = built(pkg).eval()
    inputs = draw_inputs(pkg.inputs, pkg.seed)
    with FlopCounterMode(display=False) as fc:
        out = model(*inputs)
    forward = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        torch.stack([t.sum() for t in floats_of(out)]).sum().backward()
    return forward, fc.get_total_flops()


def called_rows(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["name"] for r in rows if r.get("called", True))


# -- the checks every package goes through --------------------------------------------------


class PackageChecks:
    """Each command once per package (one subprocess each), checked against plain PyTorch.

    ``package`` names the case; a subclass whose case needs something made at run time (a
    checkpoint file, a process group) overrides the ``pkg`` fixture instead."""

    package: ClassVar[Package]

    @pytest.fixture(scope="class")
    @classmethod
    def pkg(cls) -> Package:
        need(cls.package.module)
        return cls.package

    @pytest.fixture(scope="class")
    @classmethod
    def report(cls, pkg: Package) -> Callable[..., dict[str, Any]]:
        cache: dict[tuple[str, ...], dict[str, Any]] = {}

        def run(command: str, *extra: str) -> dict[str, Any]:
            key = (command, *extra)
            if key not in cache:
                cache[key] = hookcli_json(pkg.argv(command, *extra))
            return cache[key]

        return run

    @pytest.fixture(scope="class")
    @classmethod
    def forward(cls, pkg: Package) -> tuple[Any, Counter[str]]:
        return plain_forward(pkg)

    @pytest.fixture(scope="class")
    @classmethod
    def flops(cls, pkg: Package) -> tuple[int, int]:
        return counted_flops(pkg)

    def test_inspect_params_and_calls(self, pkg: Package, report: Any, forward: Any) -> None:
        doc = report("inspect")
        assert doc["totals"]["params"] == unique_numel(built(pkg))
        out, calls = forward
        assert called_rows(doc["layers"]) == calls
        root = next(r for r in doc["layers"] if r["name"] == "")
        assert root["output_shapes"] == [list(t.shape) for t in flat_tensors(out)]

    def test_grads_against_float64_autograd(self, pkg: Package, report: Any) -> None:
        totals = report("grads", "--mode", pkg.grads_mode)["totals"]
        assert_float64_close(totals, float64_autograd(pkg))
        assert totals["params"] == unique_numel(built(pkg))

    def test_cost_flops_against_flop_counter(self, report: Any, flops: Any) -> None:
        totals = report("cost", "--backward")["totals"]
        forward, backward = flops
        assert forward > 0
        assert (totals["flops"], totals["backward_flops"]) == (forward, backward)

    def test_stats_rows_and_root_output(self, report: Any, forward: Any) -> None:
        doc = report("stats")
        out, calls = forward
        assert called_rows(doc["layers"]) == calls
        x = torch.cat([t.double().reshape(-1) for t in floats_of(out)])
        root = next(r for r in doc["layers"] if r["name"] == "")
        plain = {
            "mean": x.mean(),
            "std": x.std(),
            "min": x.min(),
            "max": x.max(),
            "mean_abs": x.abs().mean(),
        }
        atol = STATS_TOL * float(x.abs().max())
        for key, value in plain.items():
            assert math.isclose(root[key], float(value), rel_tol=STATS_TOL, abs_tol=atol), (
                key,
                root[key],
                float(value),
            )

    def test_profile_calls_and_flops(self, report: Any, forward: Any, flops: Any) -> None:
        doc = report("profile", *PROFILE_ARGS)
        _, calls = forward
        rows = {r["name"]: r["calls"] for r in doc["modules"] if r["called"]}
        assert Counter(rows) == calls
        assert doc["totals"]["calls"] == sum(calls.values())
        assert all(r["forward_ms"] >= 0 for r in doc["modules"])
        assert doc["totals"]["flops"] == flops[0]
