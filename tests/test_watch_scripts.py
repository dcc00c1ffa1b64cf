"""The training scripts that ``hookcli watch`` is tested and benchmarked on
(``tests/watch_scripts/``), and their plain-PyTorch reference figures (``--ref``).

The scripts run in this process (``main(argv)``, the RNG restored after each) so the
fast tests stay fast; torchrun and ``torch.compile`` run in processes of their own.
Checked here, without hookcli:

- each script runs to the end; ``--ref`` changes nothing (the printed per-step losses,
  as ``float.hex``, and the sha256 of the final weights and buffers are identical
  with and without it); two runs with the same seed are identical;
- the reference figures equal an independent recomputation taken at the same point
  by global optimizer step hooks installed by the test: the total grad norm against
  ``clip_grad_norm_(..., inf)``, per-module grad norms, weight norms and update
  ratios from concatenated tensors, the learning rates, and the loss against the
  values ``Tensor.backward`` was called on (summed over a step's backwards);
- goes_nan.py turns non-finite exactly at the step and module its reference claims,
  in both phases, as found by global module hooks (forward: the first module whose
  output is non-finite from finite inputs; backward: the first whose grad_input is
  non-finite from a finite grad_output);
- ddp_nan.py under torchrun (2 ranks, gloo): rank 1 alone goes NaN at the step it
  claims, and each rank writes its own reference.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

SCRIPTS = Path(__file__).resolve().parent / "watch_scripts"
TORCHRUN = Path(sys.executable).with_name("torchrun")
TIMEOUT = 120  # seconds: a hung launch fails the test

_LOADED: dict[str, ModuleType] = {}


def script(name: str) -> ModuleType:
    """The script as a module (its folder on sys.path for ``reference_figures``)."""
    if name not in _LOADED:
        if str(SCRIPTS) not in sys.path:
            sys.path.insert(0, str(SCRIPTS))
        spec = importlib.util.spec_from_file_location(
            f"watch_script_{name}", SCRIPTS / f"{name}.py"
        )
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[name] = module
    return _LOADED[name]


def run(name: str, *args: str) -> str:
    """Run a script's ``main`` here; its stdout. The global RNG is left as it was."""
    out = io.StringIO()
    with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(out):
        assert script(name).main(list(args)) == 0
    return out.getvalue()


def printed_losses(stdout: str) -> list[str]:
    """The hex of every loss printed on the ``step K loss X (HEX)`` lines."""
    return [
        part.rstrip(")").lstrip("(")
        for line in stdout.splitlines()
        if line.startswith("step ")
        for part in line.split()
        if part.startswith("(")
    ]


def close(a: float | None, b: float | None, rel: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


# (script, arguments): every script the fast tests run in this process
CASES = {
    "gpt_char": ("gpt_char", "--steps", "4"),
    "cnn_bn": ("cnn_bn", "--steps", "4", "--eval-every", "2"),
    "two_models": ("two_models", "--steps", "4"),
    "goes_nan_forward": ("goes_nan", "--steps", "5", "--nan-step", "4", "--phase", "forward"),
    "goes_nan_backward": ("goes_nan", "--steps", "5", "--nan-step", "4", "--phase", "backward"),
    "accumulate": ("accumulate", "--steps", "3", "--accum", "3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_runs_to_the_end_and_ref_changes_nothing(case: str, tmp_path: Path) -> None:
    name, *args = CASES[case]
    bare = run(name, *args, "--seed", "3")
    ref_file = tmp_path / "ref.json"
    with_ref = run(name, *args, "--seed", "3", "--ref", str(ref_file))
    again = run(name, *args, "--seed", "3")
    steps = int(args[args.index("--steps") + 1])
    assert len(printed_losses(bare)) == steps * (2 if name == "two_models" else 1)
    assert "weights sha256 " in bare.splitlines()[-1]
    assert with_ref == bare  # every loss bit for bit, and the final weights and buffers
    assert again == bare
    data = json.loads(ref_file.read_text())
    tracks = data["models"] if name == "two_models" else {"": data}
    for track in tracks.values():
        assert [s["step"] for s in track["steps"]] == list(range(1, steps + 1))
        for s in track["steps"]:
            assert float.fromhex(s["loss_hex"]) == s["loss"] or math.isnan(s["loss"])
    if name == "two_models":  # each model's losses are the ones printed for it
        printed = printed_losses(bare)
        assert [s["loss_hex"] for s in tracks["discriminator"]["steps"]] == printed[0::2]
        assert [s["loss_hex"] for s in tracks["generator"]["steps"]] == printed[1::2]
    else:
        assert [s["loss_hex"] for s in data["steps"]] == printed_losses(bare)


def test_the_seed_matters() -> None:
    assert printed_losses(run("gpt_char", "--steps", "2", "--seed", "0")) != printed_losses(
        run("gpt_char", "--steps", "2", "--seed", "1")
    )


# --- the reference figures against an independent recomputation --------------------


class Observer:
    """Global hooks that recompute each step's figures independently of the scripts.

    The root of an optimizer's parameters is the first module called that holds all of
    them (the outermost one called in forward); the loss of a step is the sum of the
    values ``Tensor.backward`` was called on since the previous step of any optimizer."""

    def __init__(self) -> None:
        self.called: dict[int, nn.Module] = {}
        self.pending: list[float] = []
        self.steps: dict[int, list[dict[str, Any]]] = {}
        self.roots: dict[int, nn.Module] = {}
        self._before: dict[int, torch.Tensor] = {}

    @staticmethod
    def params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p for g in opt.param_groups for p in g["params"]]

    def root(self, opt: torch.optim.Optimizer) -> nn.Module:
        want = {id(p) for p in self.params(opt)}
        return next(m for m in self.called.values() if want <= {id(p) for p in m.parameters()})

    def own(self, opt: torch.optim.Optimizer) -> Iterator[tuple[str, list[torch.Tensor]]]:
        stepped = {id(p) for p in self.params(opt)}
        for name, m in self.roots[id(opt)].named_modules():
            own = [p for p in m.parameters(recurse=False) if p.requires_grad and id(p) in stepped]
            if own:
                yield name, own

    def summed(self) -> float:
        """The step's backward values added in order from 0.0 (not ``sum``, which
        compensates its rounding from Python 3.12 on)."""
        assert self.pending, "a step with no backward"
        total = 0.0
        for v in self.pending:
            total += v
        return total

    @staticmethod
    def norm(tensors: list[torch.Tensor]) -> float:
        flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
        return float(torch.linalg.vector_norm(flat))

    def pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.roots.setdefault(id(opt), self.root(opt))
        with_grad = [p for p in self.params(opt) if p.grad is not None]
        # clip_grad_norm_ scales the grads it measures (by NaN when one is NaN): it
        # measures copies here
        shadows = []
        for p in with_grad:
            shadow = torch.empty_like(p)
            shadow.grad = p.grad.detach().clone()
            shadows.append(shadow)
        clip = torch.nn.utils.clip_grad_norm_(shadows, max_norm=float("inf"))
        row: dict[str, Any] = {
            "loss": self.summed(),
            "backwards": len(self.pending),
            "clip_grad_norm": float(clip),
            "grad_norm": self.norm([p.grad for p in with_grad]),
            "lr": [float(g["lr"]) for g in opt.param_groups],
            "modules": {},
        }
        self.pending = []
        for name, own in self.own(opt):
            grads = [p.grad for p in own if p.grad is not None]
            row["modules"][name] = {
                "grad_norm": self.norm(grads) if grads else None,
                "weight_norm": self.norm(own),
            }
        self._before = {id(p): p.detach().double().clone() for p in self.params(opt)}
        self.steps.setdefault(id(opt), []).append(row)

    def post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        row = self.steps[id(opt)][-1]
        for name, own in self.own(opt):
            before = [self._before[id(p)] for p in own]
            diff = [p.detach().double() - b for p, b in zip(own, before, strict=True)]
            w = self.norm(before)
            row["modules"][name]["update_ratio"] = self.norm(diff) / w if w > 0 else None

    @contextlib.contextmanager
    def watching(self) -> Iterator[Observer]:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        def seen(module: nn.Module, args: Any) -> None:
            self.called.setdefault(id(module), module)

        original = torch.Tensor.backward

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.pending.append(tensor.item())
            return original(tensor, *args, **kwargs)

        handles = [
            register_module_forward_pre_hook(seen),
            register_optimizer_step_pre_hook(self.pre),
            register_optimizer_step_post_hook(self.post),
        ]
        setattr(torch.Tensor, "backward", backward)  # noqa: B010
        try:
            yield self
        finally:
            setattr(torch.Tensor, "backward", original)  # noqa: B010
            for h in handles:
                h.remove()


def compare(ref: dict[str, Any], seen: list[dict[str, Any]]) -> None:
    assert len(ref["steps"]) == len(seen) > 0
    for r, s in zip(ref["steps"], seen, strict=True):
        # the same float32 values, summed alike
        assert r["loss"] == s["loss"] or (math.isnan(r["loss"]) and math.isnan(s["loss"]))
        # the observer sees the gradients at step(): after the script's clipping
        assert close(r["grad_norm_applied"], s["clip_grad_norm"], 1e-5), (r["step"], r, s)
        assert close(r["grad_norm_applied"], s["grad_norm"], 1e-9), r["step"]
        if "clip_norm" in r:  # before clipping: what the script's clip_grad_norm_ returned
            assert close(r["grad_norm"], r["clip_norm"], 1e-5), r["step"]
        else:
            assert close(r["grad_norm"], r["grad_norm_applied"], 0.0)  # NaN too
        assert r["lr"] == s["lr"]
        assert set(r["modules"]) == set(s["modules"])
        for name, figures in s["modules"].items():
            for key in ("grad_norm", "weight_norm", "update_ratio"):
                mine = r["modules"][name]
                want = (
                    mine.get("grad_norm_applied", mine["grad_norm"])
                    if key == "grad_norm"
                    else mine[key]
                )
                assert close(want, figures[key], 1e-9), (r["step"], name, key)


@pytest.mark.parametrize(
    "case", ["gpt_char", "cnn_bn", "accumulate", "two_models", "goes_nan_backward"]
)
def test_reference_figures_against_an_independent_recomputation(case: str, tmp_path: Path) -> None:
    name, *args = CASES[case]
    ref_file = tmp_path / "ref.json"
    with Observer().watching() as seen:
        watched = run(name, *args, "--seed", "1", "--ref", str(ref_file))
    assert watched == run(name, *args, "--seed", "1")  # the test's hooks only read, too
    data = json.loads(ref_file.read_text())
    by_root = {type(seen.roots[k]).__name__: v for k, v in seen.steps.items()}
    if name == "two_models":
        assert set(by_root) == {"Generator", "Discriminator"}
        compare(data["models"]["generator"], by_root["Generator"])
        compare(data["models"]["discriminator"], by_root["Discriminator"])
        return
    (steps,) = by_root.values()
    compare(data, steps)
    if name == "accumulate":  # three backwards per step, their values summed
        assert {s["backwards"] for s in steps} == {3}
    if name == "gpt_char":  # the tied head weight counts in both modules that own it
        for s in data["steps"]:
            assert s["modules"]["lm_head"]["grad_norm"] == s["modules"]["wte"]["grad_norm"]
            assert len(s["lr"]) == 2
        assert data["steps"][0]["lr"] != data["steps"][-1]["lr"]  # the scheduler moves it
    if name == "goes_nan_backward":
        assert math.isnan(data["steps"][3]["grad_norm"])


# --- goes_nan.py: the step and the module it claims -------------------------------------


def first_non_finite(*args: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run goes_nan.py with --ref under global module hooks: (its reference, the first
    (step, phase, module) found by the hooks)."""
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
        register_module_full_backward_hook,
    )
    from torch.optim.optimizer import register_optimizer_step_post_hook

    state: dict[str, Any] = {"step": 1, "root": None, "first": None}

    def tensors(values: Any) -> list[torch.Tensor]:
        values = values if isinstance(values, tuple) else (values,)
        return [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]

    def finite(values: Any) -> bool:
        return all(bool(t.isfinite().all()) for t in tensors(values))

    def name(module: nn.Module) -> str:
        return next(n for n, m in state["root"].named_modules() if m is module)

    def note(phase: str, module: nn.Module) -> None:
        if state["first"] is None:
            state["first"] = {"step": state["step"], "phase": phase, "module": name(module)}

    def pre(module: nn.Module, args: Any) -> None:
        if state["root"] is None:
            state["root"] = module

    def forward(module: nn.Module, args: Any, output: Any) -> None:
        if finite(args) and not finite(output):
            note("forward", module)

    def backward(module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        if tensors(grad_output) and finite(grad_output) and not finite(grad_input):
            note("backward", module)

    def stepped(opt: Any, a: Any, k: Any) -> None:
        state["step"] += 1

    handles = [
        register_module_forward_pre_hook(pre),
        register_module_forward_hook(forward),
        register_module_full_backward_hook(backward),
        register_optimizer_step_post_hook(stepped),
    ]
    try:
        ref_path = Path(args[args.index("--ref") + 1])
        run("goes_nan", *args)
    finally:
        for h in handles:
            h.remove()
    return json.loads(ref_path.read_text()), state["first"]


# the test's global full backward hooks on the root, whose input needs no grad
QUIET = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


@QUIET
@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("nan_step", [1, 3])
def test_goes_nan_at_the_step_and_module_it_claims(
    phase: str, nan_step: int, tmp_path: Path
) -> None:
    ref, found = first_non_finite(
        "--steps",
        str(nan_step + 1),
        "--seed",
        "2",
        "--nan-step",
        str(nan_step),
        "--phase",
        phase,
        "--ref",
        str(tmp_path / "ref.json"),
    )
    module = {"forward": "temper", "backward": "length"}[phase]
    assert found == {"step": nan_step, "phase": phase, "module": module}
    assert ref["nan"] == found
    steps = ref["steps"]
    assert all(
        math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in steps[: nan_step - 1]
    )
    at = steps[nan_step - 1]
    assert math.isfinite(at["loss"]) == (phase == "backward")
    assert math.isnan(at["grad_norm"])


@QUIET
def test_goes_nan_is_finite_before_its_step(tmp_path: Path) -> None:
    ref, found = first_non_finite(
        "--steps", "3", "--seed", "0", "--nan-step", "4", "--ref", str(tmp_path / "ref.json")
    )
    assert found is None and ref["nan"] is None


# --- processes of their own: torchrun, torch.compile, resnet18 ----------------------------


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def launch(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run in a session of its own: on a timeout the whole group goes (torchrun's ranks
    included), and the test fails."""
    with subprocess.Popen(
        cmd,
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as popen:
        try:
            out, err = popen.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.communicate()
            raise
    return subprocess.CompletedProcess(cmd, popen.returncode, out, err)


def ddp(tmp: Path, *extra: str) -> dict[int, str]:
    """Launch ddp_nan.py on 2 ranks; each rank's stdout (torchrun's per-rank log files)."""
    logs = tmp / f"logs{len(list(tmp.glob('logs*')))}"
    cmd = [str(TORCHRUN), "--nproc_per_node=2", "--standalone", f"--log-dir={logs}"]
    cmd += ["--redirects=3", str(SCRIPTS / "ddp_nan.py")]
    done = launch([*cmd, "--steps", "5", "--seed", "0", "--nan-step", "3", *extra], tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r: next(logs.rglob(f"attempt_0/{r}/stdout.log")).read_text() for r in (0, 1)}


@pytest.fixture(scope="module")
def ddp_ref(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, str]]:
    tmp = tmp_path_factory.mktemp("ddp")
    return tmp, ddp(tmp, "--ref", str(tmp / "ref.json"))


@pytest.mark.distributed
def test_ddp_rank1_alone_goes_nan(ddp_ref: tuple[Path, dict[int, str]]) -> None:
    tmp, stdout = ddp_ref
    assert sorted(p.name for p in tmp.glob("ref*.json")) == ["ref.rank0.json", "ref.rank1.json"]
    refs = [json.loads((tmp / f"ref.rank{r}.json").read_text()) for r in (0, 1)]
    losses = [[s["loss"] for s in refs[r]["steps"]] for r in (0, 1)]
    assert all(math.isfinite(v) for v in losses[0][:3] + losses[1][:2])
    assert math.isnan(losses[1][2])  # rank 1 alone, at step 3
    assert refs[1]["nan"] == {"step": 3, "phase": "forward", "module": "module.encoder.norm"}
    assert refs[0]["nan"] == {"step": 3, "phase": "backward", "module": None}
    assert math.isnan(refs[0]["steps"][2]["grad_norm"])  # the all-reduce carried it over
    assert all(math.isnan(v) for v in losses[0][3:] + losses[1][3:])
    for r in (0, 1):  # each rank's file is its own run's
        lines = stdout[r].splitlines()
        assert all(line.startswith(f"rank {r} ") for line in lines)
        printed = [line.split()[-1].strip("()") for line in lines[:-1]]
        assert [s["loss_hex"] for s in refs[r]["steps"]] == printed
        assert set(refs[r]["steps"][0]["modules"]) == {"module.encoder.proj", "module.head"}
    # DDP keeps the replicas equal: the same grad norms (reduced) and final weights
    assert [s["grad_norm"] for s in refs[0]["steps"][:2]] == [
        s["grad_norm"] for s in refs[1]["steps"][:2]
    ]
    assert stdout[0].splitlines()[-1].split()[-1] == stdout[1].splitlines()[-1].split()[-1]


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_ref_changes_nothing(ddp_ref: tuple[Path, dict[int, str]], tmp_path: Path) -> None:
    assert ddp(tmp_path) == ddp_ref[1]


def python(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = launch([sys.executable, *args], cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_accumulate_with_a_compiled_submodule(tmp_path: Path) -> None:
    cmd = [str(SCRIPTS / "accumulate.py"), "--steps", "3", "--seed", "0", "--compile"]
    bare = python(tmp_path, *cmd).stdout
    with_ref = python(tmp_path, *cmd, "--ref", str(tmp_path / "ref.json")).stdout
    backend = bare.splitlines()[0]
    assert backend in ("compile backend: inductor", "compile backend: aot_eager"), bare
    assert with_ref == bare
    data = json.loads((tmp_path / "ref.json").read_text())
    assert "blocks.1._orig_mod.fc" in data["steps"][0]["modules"]
    assert [s["loss_hex"] for s in data["steps"]] == printed_losses(bare)


@pytest.mark.slow
def test_cnn_bn_resnet18(tmp_path: Path) -> None:
    cmd = [str(SCRIPTS / "cnn_bn.py"), "--model", "resnet18", "--steps", "2", "--seed", "0"]
    cmd += ["--eval-every", "1", "--batch", "4"]
    bare = python(tmp_path, *cmd).stdout
    with_ref = python(tmp_path, *cmd, "--ref", str(tmp_path / "ref.json")).stdout
    assert with_ref == bare
    data = json.loads((tmp_path / "ref.json").read_text())
    assert {"conv1", "bn1", "layer4.1.bn2", "fc"} <= set(data["steps"][0]["modules"])
    assert [s["loss_hex"] for s in data["steps"]] == printed_losses(bare)
