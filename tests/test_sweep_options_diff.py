"""Issue 28's hostile sweep, option values and reports: B8, B9, R8, R9, R10, R16, R20,
R21, R24.

Each bad value is a one-line usage error (exit 2) naming the option or the file, given
before any model runs; the values hookcli reads are checked against exact arithmetic
(``fractions``) and the verdicts against the comparison they stand for.
"""

from __future__ import annotations

import inspect as pyinspect
import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookcli
from hookcli.ablate.checks import parse_gates
from hookcli.cost.sizes import parse_count, parse_size
from hookcli.errors import UnknownOptionError, UsageError
from tests.conftest import invoke, invoke_json

MODEL = "sample_models:LeNet"


def one_line_usage_error(result: Any, *needles: str) -> str:
    """Exit 2, no report, one stderr line holding every needle; that line."""
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.stdout[-300:])
    assert result.stdout == "", "the error came after the run"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- B8, R10: --max-memory and --max-flops ------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-memory", "1e400"),
        ("--max-flops", "1e400"),
        ("--max-memory", "9.3e18"),  # over 2**63 - 1 bytes
        ("--max-flops", "1.0000001e24"),
        ("--max-memory", "1e99999999999"),
    ],
)
def test_sizes_past_the_limits_are_usage_errors(option: str, value: str) -> None:
    line = one_line_usage_error(invoke("cost", MODEL, option, value), option, value)
    assert "too large" in line


@pytest.mark.parametrize(
    ("memory", "flops"),
    [("1e400", "1e400"), (10**5000, 10**5000), (2**63, 10**24 + 1)],
    ids=["text", "huge", "one-over"],
)
def test_the_api_refuses_sizes_past_the_limit(memory: Any, flops: Any) -> None:
    model, x = nn.Linear(2, 2), torch.randn(1, 2)
    with pytest.raises(UsageError, match=r"^max_memory .*too large"):
        hookcli.cost(model, x, max_memory=memory)
    with pytest.raises(UsageError, match=r"^max_flops .*too large"):
        hookcli.cost(model, x, max_flops=flops)


# (text, exact value in bytes), the value written out here from the units' definitions.
SIZES = [
    ("4.1GiB", Fraction(41, 10) * 2**30),
    ("0.001KiB", Fraction(1024, 1000)),
    ("1.5 gib", Fraction(3, 2) * 2**30),
    ("2.5e3kB", Fraction(2500) * 1000),
    ("8191PiB", Fraction(8191) * 2**50),
    ("1e18", Fraction(10**18)),
    ("0", Fraction(0)),
    (str(2**63 - 1), Fraction(2**63 - 1)),
]


@pytest.mark.parametrize(("text", "exact"), SIZES)
def test_sizes_are_read_exactly_and_given_as_the_whole_bytes_below(
    text: str, exact: Fraction
) -> None:
    assert parse_size(text) == math.floor(exact)


def test_counts_are_read_exactly() -> None:
    assert parse_count("4.1G") == 41 * 10**8
    assert parse_count("1.2T") == 12 * 10**11
    assert parse_count("1e24") == 10**24
    assert parse_count("0.0015k") == 1  # 1.5 FLOPs: a count > 1.5 is a count > 1


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_size, "0.5B"),
        (parse_size, "1.5"),
        (parse_size, "0.0001KiB"),  # 0.1024 bytes
        (parse_count, "0.5"),
        (parse_count, "0.0004k"),
    ],
)
def test_a_fraction_of_a_byte_or_a_flop_is_refused(parse: Any, text: str) -> None:
    with pytest.raises(UsageError, match="fraction of a"):
        parse(text)


def test_half_a_byte_is_refused_before_the_run() -> None:
    one_line_usage_error(invoke("cost", MODEL, "--max-memory", "0.5B"), "--max-memory", "0.5B")


def test_a_fractional_limit_gives_the_verdict_of_the_exact_value() -> None:
    """The train total T is a whole number of bytes: T <= T + 0.5 holds, T <= T - 0.5 does
    not, whatever whole number the limit is stored as (round() to even got it wrong)."""
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    total = hookcli.cost(model, x).totals["step_peak_bytes"]
    assert isinstance(total, int) and total > 1
    for offset, holds in ((Fraction(1, 2), True), (Fraction(-1, 2), False)):
        kib = (total + offset) / 1024  # a finite binary fraction: exact in decimal too
        text = str(Decimal(kib.numerator) / Decimal(kib.denominator)) + "KiB"
        report = hookcli.cost(model, x, max_memory=text)
        assert report.passed is holds, (text, total, [c.detail for c in report.checks])


# -- R8: ablate gates that could never fail -------------------------------------------------


@pytest.mark.parametrize("gate", ["rel_l2<nan", "rel_l2>=NaN", "rel_l2<-inf", "rel_l2>inf"])
def test_ablate_gates_that_could_never_fail_are_refused(gate: str) -> None:
    # No value of the metric makes the condition true (NaN compares false with anything).
    op = gate[len("rel_l2") :].rstrip("naNif-")
    threshold = float(gate[len("rel_l2") + len(op) :])
    values = [-math.inf, -1.0, 0.0, 1e-9, 1.0, 1e300, math.inf]
    compare = {"<": float.__lt__, "<=": float.__le__, ">": float.__gt__, ">=": float.__ge__}
    assert not any(compare[op](v, threshold) for v in values)
    with pytest.raises(UsageError, match="could never fail"):
        parse_gates([gate], ("rel_l2",))
    result = invoke("ablate", MODEL, "-l", "conv1", "--fail-on", gate)
    one_line_usage_error(result, "--fail-on", gate)


def test_ablate_infinite_gates_that_can_hold_are_kept() -> None:
    (gate,) = parse_gates(["rel_l2>=inf"], ("rel_l2",))
    assert gate.fails(math.inf) and not gate.fails(1e300)


# -- R9: options named as typed -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("grads", "--max-grad-norm"),
        ("grads", "--min-grad-norm"),
        ("stats", "--dead-threshold"),
        ("grads", "--rtol"),
        ("inspect", "--atol"),
    ],
)
def test_a_nan_bound_names_the_option_as_typed(command: str, option: str) -> None:
    line = one_line_usage_error(invoke(command, MODEL, option, "nan"), option)
    python_name = option.lstrip("-").replace("-", "_")
    assert python_name not in line.replace(option, "")


def test_the_api_names_its_keywords() -> None:
    with pytest.raises(UsageError, match=r"^max_grad_norm must be a finite number"):
        hookcli.grads(nn.Linear(2, 2), torch.randn(1, 2), max_grad_norm=math.nan)


# -- R24: --columns naming nothing --------------------------------------------------------------


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_columns_naming_nothing_are_refused(value: str) -> None:
    one_line_usage_error(invoke("inspect", MODEL, "--columns", value), "--columns")


def test_columns_still_work() -> None:
    report = invoke_json("inspect", MODEL, "--columns", "groups")
    conv1 = next(r for r in report["layers"] if r["name"] == "conv1")
    assert conv1["groups"] == 1


# -- B9, R16: malformed reports ------------------------------------------------------------------

HEAD = '{"schema": "hookcli.report/1", "command": "grads"'
MALFORMED = {
    "totals-list": (HEAD + ', "totals": [1]}', "'totals' is a list, not an object"),
    "layers-string": (HEAD + ', "layers": "notalist"}', "'layers' is a string, not a list"),
    "row-number": (HEAD + ', "layers": [{"name": "a"}, 3]}', "'layers[1]' is a number"),
    "settings-null": (HEAD + ', "settings": null}', "'settings' is null"),
    "dtype-list": (HEAD + ', "settings": {"dtype": ["float32"]}}', "'settings.dtype'"),
    "check-name": (HEAD + ', "checks": [{"name": ["x"], "passed": true}]}', "'checks[0].name'"),
    "input-shape": (HEAD + ', "inputs": [{"name": "x", "shape": 3}]}', "'inputs[0].shape'"),
    "command-number": ('{"schema": "hookcli.report/1", "command": 5}', "'command' is a number"),
    "deep-100000": ("[" * 100_000 + "]" * 100_000, "nest more than 100 deep"),
    "deep-in-a-key": (
        HEAD + ', "totals": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",
        "nest more than 100 deep",
    ),
    "deep-500": (
        HEAD + ', "totals": {"x": ' + "[" * 500 + "]" * 500 + "}}",
        "100 deep in 'totals'",
    ),
    "digits": (HEAD + ', "totals": {"x": ' + "1" * 5000 + "}}", "too many digits"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_diff_refuses_a_malformed_report_in_one_line(tmp_path: Path, case: str) -> None:
    text, why = MALFORMED[case]
    path = tmp_path / f"{case}.json"
    path.write_text(text, encoding="utf-8")
    one_line_usage_error(invoke("diff", str(path), str(path)), str(path), why)


@pytest.mark.parametrize("case", ["totals-list", "layers-string", "deep-100000", "deep-500"])
def test_a_malformed_baseline_is_refused_before_the_run(tmp_path: Path, case: str) -> None:
    text, why = MALFORMED[case]
    path = tmp_path / f"{case}.json"
    path.write_text(text, encoding="utf-8")
    result = invoke("grads", MODEL, "--baseline", str(path))
    one_line_usage_error(result, str(path), why)


def test_the_api_refuses_a_deep_dict() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    report = {"schema": "hookcli.report/1", "command": "grads", "totals": {"x": deep}}
    with pytest.raises(UsageError, match="nest more than 100 deep"):
        hookcli.diff(report, report)
    with pytest.raises(UsageError, match="JSON cannot"):
        hookcli.diff({**report, "totals": {"x": {1, 2}}}, report)


def test_a_well_formed_report_still_equals_itself(tmp_path: Path) -> None:
    report = invoke_json("grads", MODEL)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    assert invoke("diff", str(path), str(path)).exit_code == 0
    assert invoke("grads", MODEL, "--baseline", str(path)).exit_code == 0


# -- R20: models --filter with nothing close ---------------------------------------------------


def test_a_filter_matching_nothing_ends_its_note_cleanly() -> None:
    result = invoke("models", "--source", "samples", "--filter", "zzz*")
    assert result.exit_code == 0
    (note,) = [ln for ln in result.stderr.splitlines() if "--filter" in ln]
    assert note.rstrip() == "hookcli: note: --filter 'zzz*' matches no model name"


# -- R21: the Python API's unknown keywords --------------------------------------------------------

API = [hookcli.inspect, hookcli.grads, hookcli.stats, hookcli.cost, hookcli.profile]


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x)


@pytest.mark.parametrize("fn", API, ids=lambda f: f.__name__)
def test_an_unknown_keyword_is_a_usage_error_naming_it(fn: Any) -> None:
    model = Counted()
    with pytest.raises(UnknownOptionError) as info:
        fn(model, torch.randn(1, 2), bogus=1)
    err = info.value
    assert isinstance(err, UsageError) and isinstance(err, TypeError)
    assert f"hookcli.{fn.__name__}()" in str(err) and "'bogus'" in str(err)
    keywords = [
        n for n, p in pyinspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY
    ]
    assert str(err).endswith("its options: " + ", ".join(keywords))
    assert model.calls == 0  # refused before the model ran


def test_a_near_miss_is_suggested_and_diff_checks_its_call() -> None:
    with pytest.raises(UsageError, match="did you mean 'max_grad_norm'"):
        hookcli.grads(nn.Linear(2, 2), torch.randn(1, 2), max_norm=1.0)
    with pytest.raises(UsageError, match="'bogus'"):
        hookcli.diff({}, {}, bogus=1)
    with pytest.raises(UnknownOptionError, match="missing a required argument: 'new'"):
        hookcli.diff({})  # type: ignore[call-arg]
    with pytest.raises(TypeError):  # code that caught Python's own TypeError still does
        hookcli.inspect(nn.Linear(2, 2), torch.randn(1, 2), bogus=1)
