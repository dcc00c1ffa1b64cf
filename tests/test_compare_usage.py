"""`hookcli compare`'s refusals and notes found by a hostile sweep: each bad use is exit 2
(or 3 for a bad weights file) with one line naming the option the user wrote, and no output
path may replace a file the run reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import invoke

M = "tests.test_compare_models"
MODELS = Path(__file__).with_name("test_compare_models.py")


def one_line(result) -> str:  # type: ignore[no-untyped-def]
    err = result.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# -- F: an output that names an input file ----------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "compare"])
def test_output_naming_the_model_file_is_refused_and_the_file_kept(
    tmp_path: Path, command: str
) -> None:
    victim = tmp_path / "victim.py"
    shutil.copy(MODELS, victim)
    before = victim.read_bytes()
    extra = ["--vs", "amp=bf16"] if command == "compare" else []
    result = invoke(command, f"{victim}:MLPNet", *extra, "-i", "4x16", "-o", str(victim))
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert "a file this run reads" in one_line(result)
    assert victim.read_bytes() == before


def test_output_naming_weights_kwargs_or_b_files_is_refused(tmp_path: Path) -> None:
    import torch

    from tests.test_compare_models import MLPNet

    weights = tmp_path / "w.pt"
    torch.save(MLPNet().state_dict(), weights)
    kw = tmp_path / "k.json"
    kw.write_text("{}")
    b_file = tmp_path / "b.py"
    shutil.copy(MODELS, b_file)
    cases = [
        (["--vs", f"weights={weights}", "--junit", str(weights)], weights),
        (["--vs", "amp=bf16", "--b-kwargs-file", str(kw), "-o", str(kw)], kw),
    ]
    for extra, target in cases:
        before = target.read_bytes()
        result = invoke("compare", f"{M}:MLPNet", "-i", "4x16", *extra)
        assert result.exit_code == 2, (extra, result.exit_code, result.stderr)
        assert str(target) in one_line(result)
        assert target.read_bytes() == before
    before = b_file.read_bytes()
    result = invoke("compare", f"{M}:MLPNet", f"{b_file}:MLPNet", "-i", "4x16", "-o", str(b_file))
    assert result.exit_code == 2 and "MODEL B" in one_line(result)
    assert b_file.read_bytes() == before


# -- A, B, C: what --vs quantize / compile cannot do ------------------------------------------


def test_quantize_dynamic_on_a_model_without_linear_is_refused() -> None:
    pytest.importorskip("transformers")
    # transformers' GPT-2 writes its projections as Conv1D: nothing for torch.ao to quantize
    small = ["-k", "n_layer=1", "-k", "n_head=2", "-k", "n_embd=16", "-k", "vocab_size=32"]
    result = invoke(
        "compare", "hf:gpt2", *small, "--vs", "quantize=dynamic", "-i", "int64:1x4:0..32"
    )
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert "quantize=dynamic: the model has no nn.Linear to quantize" in one_line(result)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--dtype", "float16"], "needs float32"),
        (["--dtype", "bfloat16"], "needs float32"),
        (["--vs", "dtype=float16"], "needs float32"),
        (["--backward"], "has no backward"),
    ],
)
def test_quantize_dynamic_refuses_half_and_backward_up_front(extra: list[str], says: str) -> None:
    result = invoke("compare", f"{M}:MLPNet", "--vs", "quantize=dynamic", *extra, "-i", "4x16")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_line(result)
    assert says in line and "quantize=dynamic" in line and "fc1" not in line


def test_compile_with_an_unknown_backend_lists_the_backends() -> None:
    import torch._dynamo

    result = invoke("compare", f"{M}:MLPNet", "--vs", "compile=nosuchbackend", "-i", "4x16")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_line(result)
    assert "--vs compile=nosuchbackend" in line
    assert all(name in line for name in torch._dynamo.list_backends())


# -- D: the message names the option the user wrote --------------------------------------------


def test_vs_amp_on_meta_names_vs_amp() -> None:
    result = invoke("compare", f"{M}:MLPNet", "--vs", "amp=bf16", "--device", "meta", "-i", "4x16")
    assert result.exit_code == 2 and one_line(result).startswith("hookcli: error: --vs amp=bf16:")


def test_vs_device_that_is_not_there_names_vs_device() -> None:
    import torch

    missing = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    result = invoke("compare", f"{M}:MLPNet", "--vs", f"device={missing}", "-i", "4x16")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert f"--vs device={missing}" in one_line(result) and "--device" not in one_line(result)


@pytest.mark.parametrize("side", ["a", "b"])
def test_a_bad_side_kwargs_file_names_its_own_option(tmp_path: Path, side: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{bug")
    result = invoke(
        "compare", f"{M}:MLPNet", f"{M}:MLPNet", f"--{side}-kwargs-file", str(bad), "-i", "4x16"
    )
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert f"--{side}-kwargs-file {bad}" in one_line(result)


def test_a_missing_vs_weights_file_is_a_build_error_as_weights_is(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent.pt"
    plain = invoke("inspect", f"{M}:MLPNet", "--weights", str(missing), "-i", "4x16")
    result = invoke("compare", f"{M}:MLPNet", "--vs", f"weights={missing}", "-i", "4x16")
    assert plain.exit_code == 3
    assert result.exit_code == 3, (result.exit_code, result.stderr)
    assert f"--vs weights={missing}" in one_line(result)


# -- E: --map rules that match nothing --------------------------------------------------------

PAIR = [f"{M}:MLPNet", "tests.test_compare:Renamed", "-i", "4x16"]


@pytest.mark.parametrize(("rule", "says"), [("=first", "left side is empty"),
                                            ("fc1=", "right side is empty")])  # fmt: skip
def test_a_map_rule_with_an_empty_side_is_refused(rule: str, says: str) -> None:
    result = invoke("compare", *PAIR, "--map", rule)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_line(result)
    assert says in line and repr(rule) in line


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ("nothing=matches", "its left side matches no module A called"),
        ("fc1=nosuch", "its right side matches no module B called"),
    ],
)
def test_a_map_rule_that_matches_no_call_is_said_in_a_note(rule: str, says: str) -> None:
    """A stale rule (or one for a branch this run does not take) is named in the report's
    notes, not refused: the run goes on with the other rules and methods."""
    result = invoke("compare", *PAIR, "--map", rule)
    assert result.exit_code == 0, (result.exit_code, result.stderr)
    notes = [ln for ln in result.stdout.splitlines() if repr(rule) in ln]
    assert len(notes) == 1 and says in notes[0], result.stdout


def test_a_map_rule_that_matches_is_used_and_root_still_maps() -> None:
    from tests.conftest import invoke_json

    report = invoke_json("compare", *PAIR, "--map", "fc1=first", "--map", "(root)=(root)")
    pairs = {r["name"]: r["partner"] for r in report["calls"]}
    assert pairs["fc1"] == "first"


# -- G: --fail-on '' and --print-map with what it cannot do -------------------------------------


@pytest.mark.parametrize("command", [["compare", f"{M}:MLPNet", "--vs", "amp=bf16"], ["grads"]])
def test_an_empty_fail_on_is_refused(command: list[str]) -> None:
    args = command if command[0] == "compare" else [*command, f"{M}:MLPNet"]
    result = invoke(*args, "-i", "4x16", "--fail-on", "")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert "--fail-on" in one_line(result)


@pytest.mark.parametrize(
    ("extra", "says"),
    [(["--fail-on", "divergence"], "cannot be checked"), (["-f", "json"], "not -f json")],
)
def test_print_map_refuses_fail_on_and_formats(extra: list[str], says: str) -> None:
    result = invoke("compare", *PAIR, "--print-map", *extra)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert says in one_line(result)


# -- G: a --vs setting that changes nothing says so ----------------------------------------------


@pytest.mark.parametrize(
    ("vs", "mode", "idle"),
    [
        ("dtype=float32", "eval", True),
        ("dtype=float64", "eval", False),
        ("seed=3", "eval", True),
        ("seed=3", "train", False),
        ("device=cpu", "eval", True),
    ],
)
def test_a_vs_setting_that_changes_nothing_is_noted(vs: str, mode: str, idle: bool) -> None:
    result = invoke("compare", f"{M}:MLPNet", "--vs", vs, "--mode", mode, "-i", "4x16")
    assert result.exit_code == 0, (result.exit_code, result.stderr)
    noted = f"--vs {vs} changes nothing here" in result.stdout
    assert noted is idle, result.stdout[:600]


# -- H: the tolerance line names the default used for the value not given ----------------------


@pytest.mark.parametrize(("given", "other"), [("--rtol", "atol"), ("--atol", "rtol")])
def test_tolerance_line_names_the_default_used(given: str, other: str) -> None:
    import torch
    from torch.testing._comparison import default_tolerances

    rtol, atol = default_tolerances(torch.float32)  # assert_close's own table
    result = invoke("compare", f"{M}:MLPNet", "--vs", "dtype=float64", given, "0.1", "-i", "4x16")
    assert result.exit_code == 0, (result.exit_code, result.stderr)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("Tolerance:"))
    expected = {"rtol": rtol, "atol": atol}[other]
    assert f"{given[2:]} 0.1 (given)" in line
    assert f"{other} {expected} (float32's default)" in line and "None" not in line


def test_an_unreadable_vs_weights_file_is_exit_3_naming_vs_weights(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a checkpoint\n")
    plain = invoke("inspect", f"{M}:MLPNet", "--weights", str(garbage), "-i", "4x16")
    result = invoke("compare", f"{M}:MLPNet", "--vs", f"weights={garbage}", "-i", "4x16")
    assert plain.exit_code == 3
    assert result.exit_code == 3, (result.exit_code, result.stderr)
    assert one_line(result).startswith(f"hookcli: error: --vs weights={garbage}: ")


def test_quantize_dynamic_on_a_model_built_in_half_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "half.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Half(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc1 = nn.Linear(16, 4).half()\n\n"
        "    def forward(self, x):\n"
        "        return self.fc1(x)\n"
    )
    result = invoke("compare", f"{model}:Half", "--vs", "quantize=dynamic", "-i", "float16:4x16")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    line = one_line(result)
    assert "needs float32" in line and "float16" in line and "fc1" not in line


def test_print_map_says_a_rule_that_matched_no_call_on_stderr() -> None:
    result = invoke("compare", *PAIR, "--map", "fc1=nosuch", "--print-map")
    assert result.exit_code == 0, result.stderr
    assert "'fc1=nosuch': its right side matches no module B called" in result.stderr
    assert result.stdout.startswith("# --map rules")


# -- I: compare's --help and the --vs values with nothing after '=' -----------------------------


def test_compare_help_says_no_baseline() -> None:
    """compare has no --baseline: its --annotate and --junit carry its checks alone."""
    result = invoke("compare", "--help")
    assert result.exit_code == 0
    assert "--baseline" not in result.stdout and "baseline" not in result.stdout.lower()
    assert "--annotate" in result.stdout and "--junit" in result.stdout


@pytest.mark.parametrize("vs", ["compile=", "weights=", "dtype="])
def test_a_vs_setting_with_an_empty_value_is_refused(vs: str) -> None:
    result = invoke("compare", f"{M}:MLPNet", "--vs", vs, "-i", "4x16")
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert repr(vs) in one_line(result)
