"""Every command's --format json output validates against the shipped JSON Schema.

The schema (hookcli/schema/report.schema.json) is written by hand from the
reference (docs/reference.md), not generated from the code, so a key that
changes type or goes missing in any command fails here. Adding a command is one
line in CASES; test_every_command_has_a_case makes sure nobody forgets.
"""

from __future__ import annotations

import copy
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import hookcli.schema
from tests.conftest import invoke

ROOT = Path(__file__).resolve().parent.parent

# (id, command line, expected exit status), one line each. "{old}" / "{new}" stand
# for two saved inspect reports (seed 0 and seed 1), for commands that read reports.
HOOKS = "pre,forward,backward-pre,backward,tensor"
CASES: list[tuple[str, str, int]] = [
    ("inspect", "inspect sample_models:LeNet", 0),
    ("inspect-all-hooks", f"inspect sample_models:LSTMModel --hooks {HOOKS}", 0),
    ("inspect-containers", "inspect sample_models.causal_lm:TinyCausalLM", 0),
    ("inspect-meta", "inspect sample_models:TinyTransformer --device meta", 0),
    ("inspect-failed", "inspect tests.fixtures.broken:RaisesInMiddle", 4),
    (
        "inspect-columns",
        "inspect sample_models:LeNet --columns kernel_size,groups,param_percent,mult_adds,trainable",
        0,
    ),
    (
        "inspect-no-forward",
        "inspect tests.fixtures.inputs_models:NeedsInt --no-forward --columns trainable,groups",
        0,
    ),
    ("inspect-pruned", "inspect tests.fixtures.inputs_models:pruned_net -i 2x10", 0),
    ("params-lazy", "params tests.fixtures.inputs_models:lazy_mlp", 0),
    (
        "stats-inputs-from",
        "stats tests.fixtures.inputs_models:Odd "
        "--inputs-from tests.fixtures.inputs_models:odd_inputs",
        0,
    ),
    ("grads", "grads sample_models:LeNet --per-param --fail-on nan,inf,unused,zero-grad", 0),
    ("grads-containers", "grads sample_models.causal_lm:TinyCausalLM -d 2", 0),
    ("grads-nan", "grads sample_models:NaNModel --fail-on nan,inf", 1),
    ("buffers", "buffers sample_models:BNMLP --steps 2", 0),
    ("params", "params sample_models:TiedEmbeddingLM --frozen body", 0),
    ("registrations", "registrations sample_models:TiedEmbeddingLM", 0),
    ("trace", "trace sample_models:Net --backward", 0),
    ("stats", "stats sample_models:NaNModel --backward --fail-on nan,inf,dead", 1),
    ("stats-all-hooks", f"stats sample_models:LeNet --hooks {HOOKS}", 0),
    ("features", "features sample_models:LeNet -l conv* -l fc3 --out {tmp}/feats.pt", 0),
    ("models", "models --source samples", 0),
    ("ablate", "ablate sample_models:LeNet -l conv* -l fc1 --metric kl", 0),
    ("ablate-grad", "ablate sample_models:LeNet -l conv* -b 2 --op mean --grad-op scale:0.5", 0),
    ("diff", "diff {old} {new}", 1),
    (
        "compare",
        "compare sample_models:LeNet --vs dtype=bfloat16 --backward --fail-on divergence",
        1,
    ),
    ("compare-meta", "compare sample_models:LeNet --vs dtype=float16 --device meta", 0),
    ("cost", "cost sample_models:LeNet --backward --max-flops 1G", 0),
    ("cost-meta", "cost sample_models.causal_lm:TinyCausalLM --device meta -d 2", 0),
    ("profile", "profile sample_models:LeNet --backward --warmup 0 --repeat 2 --max-ms fc*:1e6", 0),
    (
        "watch",
        f"watch --every 1 --fail-on nan --out {{tmp}}/run -- {shlex.quote(sys.executable)} "
        f"{shlex.quote(str(ROOT / 'tests' / 'watch_fixtures' / 'tiny.py'))} --steps 2",
        0,
    ),
]

# Commands whose case is still to come (a command in progress on another branch).
PENDING: set[str] = set()


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = hookcli.schema.load()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def saved_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("reports")
    out = {}
    for key, seed in (("old", "0"), ("new", "1")):
        path = folder / f"{key}.json"
        result = invoke(
            "inspect", "sample_models:LeNet", "--seed", seed, "-f", "json", "-o", str(path)
        )
        assert result.exit_code == 0, result.stderr
        out[key] = str(path)
    return out


def _errors(validator: jsonschema.Draft202012Validator, doc: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize(("line", "code"), [pytest.param(a, c, id=i) for i, a, c in CASES])
def test_report_validates(
    line: str,
    code: int,
    validator: jsonschema.Draft202012Validator,
    saved_reports: dict[str, str],
    tmp_path: Path,
) -> None:
    args = shlex.split(line.format(tmp=tmp_path, **saved_reports))
    # hookcli's options go before a watched COMMAND's "--"
    at = args.index("--") if "--" in args else len(args)
    result = invoke(*args[:at], "--format", "json", *args[at:])
    assert result.exit_code == code, (result.exit_code, result.stderr[-500:])
    report = json.loads(result.stdout)
    assert report["command"] == args[0]
    assert _errors(validator, report) == []
    hookcli.schema.validate(report)  # the public helper agrees


def test_every_command_has_a_case() -> None:
    from hookcli.commands import COMMANDS

    covered = {line.split()[0] for _, line, _ in CASES}
    assert {name for name, _ in COMMANDS} - PENDING <= covered


def test_the_cases_exercise_what_the_schema_is_for(
    validator: jsonschema.Draft202012Validator,
) -> None:
    """Container rows, non-finite strings and an error key really occur above."""
    contained = invoke("inspect", "sample_models.causal_lm:TinyCausalLM", "-f", "json")
    rows = json.loads(contained.stdout)["layers"]
    assert any(r["called"] is False and r["output_shapes"] is None for r in rows)
    nan = json.loads(invoke("stats", "sample_models:NaNModel", "-f", "json").stdout)
    assert any(r["mean"] == "nan" for r in nan["layers"])
    failed = invoke("inspect", "tests.fixtures.broken:RaisesInMiddle", "-f", "json")
    assert isinstance(json.loads(failed.stdout)["error"], str)


# --- the schema has teeth: documents a careless producer might write are refused ---

GOOD: dict[str, Any] = {
    "schema": "hookcli.report/1",
    "command": "inspect",
    "model": {"spec": "sample_models:Net", "class": "Net"},
    "settings": {"device": "cpu", "dtype": "float32", "mode": "eval", "seed": 0},
    "inputs": [{"name": "x", "shape": [1, 1, 4, 4], "dtype": "float32"}],
    "layers": [
        {
            "name": "",
            "type": "Net",
            "depth": 0,
            "call": 0,
            "called": True,
            "input_shapes": [[1, 1, 4, 4]],
            "output_shapes": [[1, 3]],
            "params": 47,
            "own_params": 0,
            "trainable_params": 47,
            "grad_norm": "nan",
            "mean": "-inf",
            "nan": 3,
        },
        {
            "name": "blocks",
            "type": "ModuleList",
            "depth": 1,
            "call": 0,
            "called": False,
            "input_shapes": None,
            "output_shapes": None,
            "params": 20,
            "own_params": 0,
            "trainable_params": 20,
            "custom_column": {"anything": [1, 2]},
        },
    ],
    "totals": {"params": 47, "loss": "inf"},
    "checks": [{"name": "nan", "passed": False, "detail": "NaN", "layers": ["fc"]}],
}


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *parents, last = path.split("/")
    node: Any = out
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is KeyError:
        del node[int(last) if last.isdigit() else last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return out


def test_a_good_document_passes(validator: jsonschema.Draft202012Validator) -> None:
    assert _errors(validator, GOOD) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("schema", "hookcli.report/2"),
        ("checks", KeyError),
        ("model/class", KeyError),
        ("settings/mode", "training"),
        ("inputs/0/shape", "1x1x4x4"),
        ("layers/0/params", KeyError),
        ("layers/0/depth", -1),
        ("layers/0/call", 0.5),
        ("layers/0/output_shapes", [["1", 3]]),
        ("layers/0/output_shapes", None),  # only a container row has no shapes
        ("layers/1/output_shapes", [[1, 3]]),  # a container row ran no forward
        ("layers/0/grad_norm", "NaN"),  # non-finite numbers are spelled nan, inf, -inf
        ("layers/0/nan", 1.5),
        ("totals/params", "47"),
        ("checks/0/passed", "no"),
        ("error", None),
    ],
)
def test_a_bad_document_fails(
    path: str, value: Any, validator: jsonschema.Draft202012Validator
) -> None:
    assert _errors(validator, _set(GOOD, path, value)) != []


def test_a_command_list_is_required() -> None:
    doc = _set(GOOD, "command", "buffers")
    with pytest.raises(jsonschema.ValidationError, match="'buffers' is a required property"):
        hookcli.schema.validate(doc)
    doc["buffers"] = [{"name": "b", "module": "", "shape": [1], "dtype": "float32"}]
    with pytest.raises(jsonschema.ValidationError, match="required property"):
        hookcli.schema.validate(doc)


def test_the_schema_ships_as_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]["hookcli.schema"]
    assert hookcli.schema.FILENAME in data or "*.json" in data
    on_disk = (ROOT / "hookcli" / "schema" / hookcli.schema.FILENAME).read_text()
    assert hookcli.schema.text() == on_disk
    assert hookcli.schema.load()["properties"]["schema"]["const"] == hookcli.schema.SCHEMA_ID
