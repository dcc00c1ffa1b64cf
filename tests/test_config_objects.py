"""Models as public codebases write them, built from the command line with no Python glue
(issue 29): config objects from ``-k config.n_layer=2`` / ``--kwargs-file``, configs held in
a ``--weights`` checkpoint, files inside packages and loose files with sibling imports,
modules that read ``sys.argv`` when imported, models that change the working folder, and
``settings.kwargs`` / ``settings.weights`` with ``diff`` flagging them.

Runs from the repository root are in-process (``tests.conftest.invoke``); those from
another working folder, and the module that reads ``sys.argv`` when imported, are a
subprocess ``python -m hookcli ...``. Figures are checked against the model built here
directly (``sum(p.numel())``, output shapes from calling it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import invoke
from tests.fixtures import configmodels as cm

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
CM = "tests/fixtures/configmodels.py"


def hookcli(*args: str, cwd: Path = ROOT, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """The command's exit status and streams: in-process from the repository root, else
    (``cwd`` elsewhere, or ``fresh``) ``python -m hookcli`` started in ``cwd``."""
    if cwd == ROOT and Path.cwd() == ROOT and not fresh:
        r = invoke(*args)
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HOOKCLI_NO_CONFIG": "1"},
    )


def report(*args: str, cwd: Path = ROOT) -> dict[str, Any]:
    r = hookcli(*args, "-f", "json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def root_output(doc: dict[str, Any]) -> list[list[int]]:
    return next(row["output_shapes"] for row in doc["layers"] if row["name"] == "")


# -- -k dotted keys and dict literals ----------------------------------------------------


def test_a_dataclass_config_from_dotted_keys() -> None:
    doc = report(
        "inspect", f"{CM}:GPT", "-k", "config.n_layer=2", "-k", "config.vocab_size=100",
        "-i", "int64:1x8:0..100",
    )  # fmt: skip
    expected = cm.GPT(cm.GPTConfig(n_layer=2, vocab_size=100))
    assert doc["totals"]["params"] == numel(expected)
    logits, loss = expected(torch.zeros(1, 8, dtype=torch.long))
    assert root_output(doc)[0] == list(logits.shape) and loss is None
    assert doc["settings"]["kwargs"] == {"config": {"n_layer": 2, "vocab_size": 100}}


def test_a_dict_literal_is_the_same_config() -> None:
    dotted = report("params", f"{CM}:GPT", "-k", "config.n_layer=1", "-k", "config.n_embd=8")
    literal = report("params", f"{CM}:GPT", "-k", 'config={"n_layer": 1, "n_embd": 8}')
    expected = numel(cm.GPT(cm.GPTConfig(n_layer=1, n_embd=8)))
    assert dotted["totals"]["params"] == literal["totals"]["params"] == expected


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ("config=GPTConfig(n_layer=2)", "-k config=GPTConfig(n_layer=2)"),
        ("config.n_layer=two", "-k config.n_layer=two"),
    ],
)
def test_a_value_that_is_no_literal_is_a_usage_error_naming_the_key(item: str, named: str) -> None:
    r = hookcli("params", f"{CM}:GPT", "-k", item)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr and "not a Python literal" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_unknown_field_names_the_closest() -> None:
    r = hookcli("params", f"{CM}:GPT", "-k", "config.n_layr=2")
    assert r.returncode == 2
    assert "'n_layr'" in r.stderr and "did you mean n_layer" in r.stderr


def test_missing_fields_of_a_config_without_defaults_are_named() -> None:
    r = hookcli("params", f"{CM}:Whisper", "-k", "dims.n_mels=8")
    assert r.returncode == 2
    assert "ModelDimensions needs n_audio_ctx" in r.stderr and "n_text_layer" in r.stderr


def _mingpt(**fields: Any) -> cm.MinGPT:
    """minGPT as its projects build it: the default config, filled in, passed to GPT."""
    config = cm.MinGPT.get_default_config()
    for key, value in fields.items():
        setattr(config, key, value)
    return cm.MinGPT(config)


def test_minGPT_get_default_config_is_the_start() -> None:
    """minGPT's unannotated ``GPT(config)``: ``GPT.get_default_config()`` (a CfgNode) is
    the start, the -k fields are set on it, a text field takes text (model_type)."""
    doc = report(
        "inspect", f"{CM}:MinGPT", "-k", "config.model_type=gpt-nano", "-k", "config.vocab_size=20",
        "-k", "config.block_size=6", "-i", "int64:2x5:0..20",
    )  # fmt: skip
    torch.manual_seed(0)
    expected = _mingpt(model_type="gpt-nano", vocab_size=20, block_size=6)
    assert doc["totals"]["params"] == numel(expected)
    logits, loss = expected(torch.zeros(2, 5, dtype=torch.long))
    assert root_output(doc)[0] == list(logits.shape) and loss is None
    doc = report(
        "params", f"{CM}:MinGPT", "-k", "config.model_type=None", "-k", "config.n_layer=1",
        "-k", "config.n_head=2", "-k", "config.n_embd=8", "-k", "config.vocab_size=20",
        "-k", "config.block_size=6",
    )  # fmt: skip
    kw = {"n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 20, "block_size": 6}
    assert doc["totals"]["params"] == numel(_mingpt(model_type=None, **kw))
    r = hookcli("params", f"{CM}:MinGPT", "-k", "config.n_layers=2")
    assert r.returncode == 2 and "did you mean n_layer" in r.stderr, r.stderr
    assert "get_default_config()" in r.stderr


# -- unannotated config parameters: inference and --config-class ---------------------------

TWO_CONFIGS = """
from dataclasses import dataclass
from torch import nn


@dataclass
class SmallConfig:
    n_layer: int = 1
    width: int = 4


@dataclass
class WideConfig:
    n_layer: int = 1
    width: int = 8
    heads: int = 2


class Net(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.h = nn.Sequential(*[nn.Linear(config.width, config.width) for _ in range(config.n_layer)])

    def forward(self, x):
        return self.h(x)


def default_wide():
    return WideConfig(width=6)
"""


def test_the_class_whose_fields_hold_the_keys_is_inferred(tmp_path: Path) -> None:
    (tmp_path / "two.py").write_text(TWO_CONFIGS)
    doc = report(
        "params", "two.py:Net", "-k", "config.heads=4", "-k", "config.n_layer=3", cwd=tmp_path
    )
    assert doc["totals"]["params"] == 3 * (8 * 8 + 8)  # WideConfig: the one with `heads`


def test_an_ambiguous_config_names_the_candidates_and_the_option(tmp_path: Path) -> None:
    (tmp_path / "two.py").write_text(TWO_CONFIGS)
    r = hookcli("params", "two.py:Net", "-k", "config.n_layer=2", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "SmallConfig" in lines[0] and "WideConfig" in lines[0]
    assert "--config-class config=SmallConfig" in lines[0]
    for option, width in (
        ("config=SmallConfig", 4),
        ("WideConfig", 8),  # PARAM left out: the one unannotated parameter
        ("config=two:WideConfig", 8),
        ("config=default_wide", 6),  # a function returning the start
    ):
        doc = report(
            "params", "two.py:Net", "-k", "config.n_layer=2", "--config-class", option, cwd=tmp_path
        )
        assert doc["totals"]["params"] == 2 * (width * width + width), option
    r = hookcli(
        "params", "two.py:Net", "-k", "config.n_layer=2", "--config-class", "Nope", cwd=tmp_path
    )
    assert r.returncode == 2 and "no 'Nope'" in r.stderr and "SmallConfig, WideConfig" in r.stderr
    r = hookcli("params", "two.py:Net", "--config-class", "cfg=SmallConfig", cwd=tmp_path)
    assert r.returncode == 2 and "no parameter 'cfg'" in r.stderr


def test_with_no_k_the_one_config_class_gives_its_defaults(tmp_path: Path) -> None:
    """``GPT(config)`` with nothing given: GPTConfig() (the class named for the model, among
    the module's three config classes); where the module's classes tie, exit 2 naming them."""
    doc = report("params", f"{CM}:GPT")
    assert doc["totals"]["params"] == numel(cm.GPT(cm.GPTConfig()))
    (tmp_path / "two.py").write_text(TWO_CONFIGS)
    r = hookcli("params", "two.py:Net", cwd=tmp_path)
    assert r.returncode == 2 and "SmallConfig, WideConfig" in r.stderr, r.stderr
    assert "--config-class config=SmallConfig" in r.stderr


def test_with_no_config_class_in_the_module_the_dict_is_passed(tmp_path: Path) -> None:
    (tmp_path / "d.py").write_text(
        "from torch import nn\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(config['width'], 2)\n"
    )
    doc = report("params", "d.py:Net", "-k", "config.width=5", cwd=tmp_path)
    assert doc["totals"]["params"] == 5 * 2 + 2
    (tmp_path / "d2.py").write_text(
        (tmp_path / "d.py").read_text()
        + "\n\nfrom dataclasses import dataclass\n\n\n@dataclass\nclass WConfig:\n    width: int = 1\n"
    )
    r = hookcli("params", "d2.py:Net", "-k", "config.width=5", cwd=tmp_path)
    assert r.returncode == 3 and "subscriptable" in r.stderr  # WConfig inferred: not a dict
    doc = report(
        "params", "d2.py:Net", "-k", "config.width=5", "--config-class", "dict", cwd=tmp_path
    )
    assert doc["totals"]["params"] == 5 * 2 + 2


def test_a_namedtuple_config_and_text_parameters() -> None:
    doc = report(
        "params", f"{CM}:mlp", "-k", "args.width=4", "-k", "args.depth=3", "-k", "act=gelu"
    )
    expected = cm.mlp(cm.MLPArgs(width=4, depth=3), act="gelu")
    assert doc["totals"]["params"] == numel(expected)
    r = hookcli("params", f"{CM}:mlp", "-k", "args.width=four")
    assert r.returncode == 2 and "-k args.width=four" in r.stderr


def test_an_unannotated_default_config_a_literal_and_an_enum() -> None:
    doc = report(
        "inspect", f"{CM}:Defaulted", "-k", "config.n_layer=3", "-k", "kind=wide",
        "-k", "norm=LAYER", "-i", "1x16",
    )  # fmt: skip
    default = cm.Defaulted.__init__.__defaults__[0]  # type: ignore[index]
    expected = cm.Defaulted(dataclasses.replace(default, n_layer=3), "wide", cm.Norm.LAYER)
    assert doc["totals"]["params"] == numel(expected)  # n_embd=8 of the default is kept
    assert root_output(doc) == [[1, 16]]
    r = hookcli("params", f"{CM}:Defaulted", "-k", "kind=tall")
    assert r.returncode == 2 and "-k kind=tall" in r.stderr


def test_a_pydantic_config() -> None:
    pytest.importorskip("pydantic")
    from tests.fixtures.pydantic_models import NetConfig, PydanticNet

    doc = report("params", "tests/fixtures/pydantic_models.py:PydanticNet", "-k", "config.width=3")
    assert doc["totals"]["params"] == numel(PydanticNet(NetConfig(width=3)))


@pytest.mark.parametrize("spec", ["resnet18", "timm:resnet18", "hf:llama"])
def test_dotted_keys_for_a_source_without_config_parameters_are_refused(spec: str) -> None:
    r = hookcli("params", spec, "-k", "config.n_layer=2")
    assert r.returncode == 2 and "dotted keys" in r.stderr


def test_a_torchvision_value_that_is_no_literal_is_refused() -> None:
    r = hookcli("params", "resnet18", "-k", "num_classes=ten")
    assert r.returncode == 2 and "-k num_classes=ten" in r.stderr


# -- --kwargs-file -------------------------------------------------------------------------

DIMS = {
    "n_mels": 8,
    "n_audio_ctx": 8,
    "n_audio_state": 8,
    "n_audio_head": 2,
    "n_audio_layer": 1,
    "n_vocab": 30,
    "n_text_ctx": 8,
    "n_text_state": 8,
    "n_text_head": 2,
    "n_text_layer": 1,
}


def _write(path: Path, data: dict[str, Any]) -> Path:
    if path.suffix == ".json":
        path.write_text(json.dumps(data))
    elif path.suffix == ".yaml":
        yaml = pytest.importorskip("yaml")
        path.write_text(yaml.safe_dump(data))
    else:
        lines = []
        for table, values in data.items():
            lines.append(f"[{table}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_a_whisper_config_from_a_kwargs_file(tmp_path: Path, suffix: str) -> None:
    cfg = _write(tmp_path / f"dims{suffix}", {"dims": DIMS})
    doc = report(
        "inspect", f"{CM}:Whisper", "--kwargs-file", str(cfg), "-k", "dims.n_text_layer=2",
        "-i", "1x8x16", "-i", "int64:1x4:0..30",
    )  # fmt: skip
    expected = cm.Whisper(cm.ModelDimensions(**{**DIMS, "n_text_layer": 2}))
    assert doc["totals"]["params"] == numel(expected)  # -k wins over the file
    out = expected(torch.zeros(1, 8, 16), torch.zeros(1, 4, dtype=torch.long))
    assert root_output(doc) == [list(out.shape)]
    assert doc["settings"]["kwargs"] == {"dims": {**DIMS, "n_text_layer": 2}}


def test_a_bad_kwargs_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    r = hookcli("params", f"{CM}:GPT", "--kwargs-file", str(bad))
    assert r.returncode == 2 and f"--kwargs-file {bad}" in r.stderr
    r = hookcli("params", f"{CM}:GPT", "--kwargs-file", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "no such file" in r.stderr


# -- configs held in a checkpoint ------------------------------------------------------------


def _nanogpt_checkpoint(path: Path, **args: Any) -> tuple[cm.GPT, dict[str, Any]]:
    model_args = {"block_size": 16, "vocab_size": 50, "n_layer": 2, "n_head": 2, "n_embd": 8,
                  "dropout": 0.0, "bias": False, **args}  # fmt: skip
    torch.manual_seed(1)
    model = cm.GPT(cm.GPTConfig(**model_args))
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}  # torch.compile'd
    training = {"batch_size": 12, "learning_rate": 6e-4, "out_dir": "out"}
    torch.save({"model": state, "model_args": model_args, "config": training}, path)
    return model, model_args


def test_a_checkpoint_config_fills_the_config_parameter(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    model, _ = _nanogpt_checkpoint(ckpt)
    r = hookcli("inspect", f"{CM}:GPT", "--weights", str(ckpt), "-i", "int64:1x8:0..50",
                "-f", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr  # GPT(config) is unannotated: GPTConfig is inferred
    assert "holds a config under 'model_args'" in r.stderr and "not used" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["totals"]["params"] == numel(model)
    weights = doc["settings"]["weights"]
    assert weights == {
        "path": str(ckpt),
        "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest(),
        "config": "model_args",
    }
    assert "kwargs" not in doc["settings"]


def test_k_wins_over_the_checkpoint_config(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    _nanogpt_checkpoint(ckpt)
    r = hookcli("params", f"{CM}:GPT", "--weights", str(ckpt), "-k", "config.n_layer=3")
    assert r.returncode == 3 and "missing keys" in r.stderr and "h.2." in r.stderr


def test_a_flat_checkpoint_config_fills_plain_parameters(tmp_path: Path) -> None:
    ckpt = tmp_path / "sized.pt"
    torch.manual_seed(0)
    model = cm.Sized(n_in=3, n_out=7)
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": {"n_in": 3, "n_out": 7}}, ckpt
    )
    doc = report("params", f"{CM}:Sized", "--weights", str(ckpt))
    assert doc["totals"]["params"] == numel(model)
    assert doc["settings"]["weights"]["config"] == "hyper_parameters"


# -- files inside packages, loose files, sys.argv, the working folder ---------------------


def test_a_file_inside_a_package_imports_relatively(tmp_path: Path) -> None:
    shutil.copytree(FIX / "pkgmodel", tmp_path / "proj" / "pkgmodel")
    doc = report("inspect", "proj/pkgmodel/model.py:Net", "-i", "1x6", cwd=tmp_path)
    from tests.fixtures.pkgmodel.model import Net

    assert doc["totals"]["params"] == numel(Net())
    assert root_output(doc) == [[1, 6]]


def test_a_loose_file_imports_its_sibling(tmp_path: Path) -> None:
    doc = report("inspect", str(FIX / "loose" / "model.py:Net"), "-i", "3x5", cwd=tmp_path)
    assert doc["totals"]["params"] == 2 * (5 * 5 + 5)
    assert root_output(doc) == [[3, 5]]


def test_argv_at_import_and_a_chdir_keep_the_command_line_paths(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIX / "argv_script.py", work / "argv_script.py")
    torch.save(torch.nn.Linear(4, 3).state_dict(), work / "w.pt")
    r = hookcli(
        "inspect", "argv_script.py:Net", "--inputs-from", "argv_script.py:inputs",
        "--weights", "w.pt", "-o", "out.json", "-f", "json", cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads((work / "out.json").read_text())  # written where hookcli started
    assert root_output(doc) == [[2, 3]]
    assert doc["settings"]["weights"]["path"] == "w.pt"


def test_a_dotted_module_is_imported_with_its_own_argv() -> None:
    r = hookcli("params", "tests.fixtures.argv_script:Net", "--seed", "1", fresh=True)
    assert r.returncode == 0, r.stderr


# -- settings and diff --------------------------------------------------------------------


def test_diff_flags_reports_whose_kwargs_or_weights_differ(tmp_path: Path) -> None:
    def save(name: str, *args: str) -> Path:
        r = hookcli("params", f"{CM}:GPT", *args, "-f", "json", "-o", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        return tmp_path / name

    one = save("one.json", "-k", "config.n_layer=1")
    two = save("two.json", "-k", "config.n_layer=2")
    r = hookcli("diff", str(one), str(two))
    assert r.returncode == 1 and "kwargs.config.n_layer" in r.stdout + r.stderr
    ckpt = tmp_path / "ckpt.pt"
    _nanogpt_checkpoint(ckpt)
    copy = tmp_path / "copy" / "ckpt.pt"
    copy.parent.mkdir()
    shutil.copy(ckpt, copy)
    a = save("a.json", "--weights", str(ckpt))
    b = save("b.json", "--weights", str(copy))
    r = hookcli("diff", str(a), str(b))
    assert r.returncode == 0, r.stdout  # one checkpoint at two paths: noted, not a difference
    _nanogpt_checkpoint(copy, dropout=0.1)  # same shapes, another config and file
    c = save("c.json", "--weights", str(copy))
    r = hookcli("diff", str(a), str(c))
    assert r.returncode == 1 and "weights.sha256" in r.stdout + r.stderr


def test_settings_validate_against_the_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import hookcli.schema

    ckpt = tmp_path / "ckpt.pt"
    _nanogpt_checkpoint(ckpt)
    doc = report("params", f"{CM}:GPT", "--weights", str(ckpt), "-k", "config.dropout=0.0")
    schema = json.loads((Path(hookcli.schema.__file__).parent / "report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    bad = {**doc, "settings": {**doc["settings"], "weights": {"path": "x", "sha256": "nope"}}}
    assert not jsonschema.Draft202012Validator(schema).is_valid(bad)
