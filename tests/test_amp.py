"""``--amp bf16|fp16`` (issue 29, point 9), from the command line.

What cost counts under autocast is checked against plain PyTorch under the same
``torch.autocast``: the bytes of the tensors autograd saves, measured with
``torch.autograd.graph.saved_tensors_hooks`` (parameters, buffers and tensors kept in
attributes left out, as cost reports those on their own lines).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import run_hookcli as hookcli
from tests.conftest import run_json as report
from tests.fixtures import cost_real

ROOT = Path(__file__).resolve().parent.parent
FIX = "tests/fixtures/cost_real.py"
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


def plain_saved_bytes(name: str, dtype: torch.dtype | None) -> int:
    """The bytes autograd saves in one forward of the fixture, in plain PyTorch."""
    torch.manual_seed(0)
    model = getattr(cost_real, name)().eval()
    args = model.example_input_array
    args = args if isinstance(args, tuple) else (args,)
    keep = [*model.parameters(), *model.buffers()]
    for m in model.modules():
        keep += [
            v
            for k, v in vars(m).items()
            if isinstance(v, torch.Tensor) and k != "example_input_array"
        ]
    # held, so that no address of theirs serves another storage while the pass runs
    static = {t.untyped_storage().data_ptr() for t in keep}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in static:
            seen[st.data_ptr()] = st.nbytes()
        return t

    cast = torch.autocast("cpu", dtype=dtype) if dtype else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
        model(*args)
    return sum(seen.values())


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.parametrize("name", ["LlamaLike", "WhisperLike", "UNetLike"])
def test_cost_counts_what_autocast_saves(name: str, amp: str) -> None:
    rep = report("cost", f"{FIX}:{name}", "--amp", amp)
    assert rep["settings"]["amp"] == amp
    assert rep["totals"]["saved_bytes"] == plain_saved_bytes(name, AMP[amp])
    # parameters keep their dtype under autocast, and so does the optimizer state
    assert rep["settings"]["dtype"] == "float32"
    assert rep["totals"]["optimizer_state_dtypes"] == ["float32"]


def test_cost_without_amp_matches_plain() -> None:
    rep = report("cost", f"{FIX}:WhisperLike")
    assert "amp" not in rep["settings"]
    assert rep["totals"]["saved_bytes"] == plain_saved_bytes("WhisperLike", None)


def test_amp_outputs_in_autocast_dtype() -> None:
    """A Linear's output under bf16 autocast is bf16: half the bytes of float32."""
    plain = {r["name"]: r for r in report("cost", f"{FIX}:LlamaLike")["layers"]}
    amp = {r["name"]: r for r in report("cost", f"{FIX}:LlamaLike", "--amp", "bf16")["layers"]}
    name = "layers.0.attention.wq"
    assert amp[name]["output_bytes"] * 2 == plain[name]["output_bytes"]
    assert amp[name]["flops"] == plain[name]["flops"]  # the same work, another dtype


@pytest.mark.parametrize(
    "command",
    ["inspect", "grads", "buffers", "trace", "stats", "cost", "ablate", "profile", "features"],
)
def test_every_running_command_records_amp(command: str, tmp_path: Path) -> None:
    extra = {
        "ablate": ["--layer", "encoder.conv1"],
        "profile": ["--warmup", "0", "--repeat", "1"],
        "features": ["--layer", "encoder.conv1", "--out", str(tmp_path / "f.pt")],
    }.get(command, [])
    r = hookcli(command, f"{FIX}:WhisperLike", "--amp", "bf16", *extra)
    assert r.returncode in (0, 1), r.stderr[-1500:]
    assert "| amp bf16 |" in r.stdout.splitlines()[0] or "amp bf16" in r.stdout
    rep = report(command, f"{FIX}:WhisperLike", "--amp", "bf16", *extra)
    assert rep["settings"]["amp"] == "bf16"


def test_amp_not_on_build_only_commands() -> None:
    r = hookcli("params", f"{FIX}:WhisperLike", "--amp", "bf16")
    assert r.returncode == 2 and "--amp" in r.stderr


@pytest.mark.parametrize(
    ("command", "args", "needle"),
    [
        ("cost", ["--amp", "fp8"], "--amp must be one of bf16, fp16"),
        # cost emulates autocast on meta (tests/test_memory_autocast.py); the others refuse
        ("inspect", ["--amp", "bf16", "--device", "meta"], "autocast has no meta device"),
    ],
)
def test_amp_usage_errors(command: str, args: list[str], needle: str) -> None:
    r = hookcli(command, f"{FIX}:WhisperLike", *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_amp_refused_where_torch_disables_it() -> None:
    """A dtype torch's autocast turns itself off for (a warning, then no autocast) is an
    error naming it, not a silent float32 run."""
    from hookcli import amp
    from hookcli.errors import UsageError

    saved = dict(amp.CHOICES)
    amp.CHOICES["f64"] = "float64"  # CPU autocast supports bfloat16 and float16 only
    try:
        with pytest.raises(UsageError, match="cannot autocast cpu"):
            amp.check("f64", torch.device("cpu"))
    finally:
        amp.CHOICES.clear()
        amp.CHOICES.update(saved)


def test_amp_off_after_the_command() -> None:
    from hookcli import amp

    cpu = torch.device("cpu")
    with amp.requested("bf16"):
        amp.activate(amp.check(amp.current(), cpu), cpu)
        with amp.autocast():
            assert torch.is_autocast_enabled("cpu")
    assert amp.current() is None
    with amp.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_profile_backward_under_amp() -> None:
    """Autocast and the tensor-hooked backward together: every module still has a time."""
    rep = report("profile", f"{FIX}:UNetLike", "--amp", "bf16", "--backward",
                 "--warmup", "0", "--repeat", "1")  # fmt: skip
    assert rep["settings"]["amp"] == "bf16"
    assert all(r["backward_ms"] is not None for r in rep["modules"])
