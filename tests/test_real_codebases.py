"""Every command that takes a MODEL, on models shaped like issue 29's eight public codebases
(nanoGPT, minGPT, vit-pytorch, Whisper, llama, segment-anything, pygcn, diffusers' UNet;
nanoGPT's and minGPT's ``GPT(config)`` unannotated, as published: issue 44)
and the other shapes it names (a package with relative imports, an inference-mode forward,
a KV cache in attributes, a dataclass output), from the command line with no Python glue.

Each run is a subprocess ``python -m hookcli COMMAND MODEL ...`` from the repository root:
the model is a file path (or ``pkg/mod.py``) built with ``-k`` (config objects by dotted
keys or a dict literal); inputs are a ``.pt`` file of tensors (``--input-file``) or the
model's own ``example_input_array``. Each (model, command) pair exits as the docs say
(0, or the documented refusal) and one figure of its report is checked against plain
PyTorch on the same model built here: parameter totals against ``sum(p.numel())``
(tied weights once), the loss and total grad norm against autograd with the same loss,
module-call counts against forward hooks, output shapes and feature bytes against a plain
forward, buffers against ``named_buffers()``, registrations against
``named_parameters(remove_duplicate=False)``.

The matrix is marked slow (about 200 runs; ``make slow``); a fast test runs inspect and
grads on the three GPTs (nanoGPT's two shapes and minGPT's).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

from tests.fixtures import codebase_shapes as cs
from tests.fixtures import configmodels as cm
from tests.fixtures import cost_real as cr
from tests.fixtures import real_models as rm
from tests.fixtures.pkgmodel.model import Net as PkgNet

ROOT = Path(__file__).resolve().parent.parent
FIX = "tests/fixtures"
TIMEOUT = 300
REL = 1e-4


def hookcli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "HOOKCLI_NO_CONFIG": "1", "COLUMNS": "200"},
    )


# -- the models ---------------------------------------------------------------------------


def _ints(high: int, *shape: int, seed: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _floats(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _tokens_and_targets(vocab: int) -> list[torch.Tensor]:
    return [_ints(vocab, 2, 8, seed=1), _ints(vocab, 2, 8, seed=2)]


WHISPER_DIMS = {
    "n_mels": 8,
    "n_audio_ctx": 8,
    "n_audio_state": 16,
    "n_audio_head": 2,
    "n_audio_layer": 1,
    "n_vocab": 40,
    "n_text_ctx": 8,
    "n_text_state": 16,
    "n_text_head": 2,
    "n_text_layer": 1,
}
VIT = {
    "image_size": 32,
    "patch_size": 8,
    "num_classes": 10,
    "dim": 32,
    "depth": 2,
    "heads": 4,
    "mlp_dim": 64,
    "dim_head": 8,
}
SAM = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
SAM_OUT = 16


MINGPT = {
    "model_type": None,
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 16,
    "vocab_size": 50,
    "block_size": 8,
    "embd_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "attn_pdrop": 0.0,
}


def _mingpt_config(**fields: Any) -> Any:
    """As minGPT's projects do: ``GPT.get_default_config()``, fields set on it."""
    config = cm.MinGPT.get_default_config()
    for key, value in fields.items():
        setattr(config, key, value)
    return config


def _k(kwargs: dict[str, Any]) -> tuple[str, ...]:
    return tuple(a for key, value in kwargs.items() for a in ("-k", f"{key}={value!r}"))


@dataclasses.dataclass(frozen=True)
class Case:
    spec: str
    kwargs: tuple[str, ...]  # the -k options
    build: Callable[[], nn.Module]  # the same model, built here
    inputs: Callable[[], list[torch.Tensor]] | None  # None: the model's example_input_array
    layer: str  # for features and ablate
    loss: str | None = None  # --loss for every command that backpropagates
    loss_of: Callable[[Any], torch.Tensor] | None = None  # the same loss in plain PyTorch
    exits: tuple[tuple[str, int], ...] = ()  # commands with a documented non-zero exit
    xfail: tuple[tuple[str, str], ...] = ()  # (command, reason): known hookcli bugs


CASES: dict[str, Case] = {
    # karpathy/nanoGPT: GPT(config) (unannotated; GPTConfig in the same file) -> (logits,
    # loss), tied embedding
    "nanogpt": Case(
        f"{FIX}/real_models.py:GPT",
        ("-k", "config.n_layer=3"),
        lambda: rm.GPT(rm.GPTConfig(n_layer=3)),
        lambda: _tokens_and_targets(32),
        "transformer.h.0",
        loss="output:1",
        loss_of=lambda out: out[1],
    ),
    # the same shape in configmodels (nn.MultiheadAttention blocks), two dotted keys
    "gpt_config": Case(
        f"{FIX}/configmodels.py:GPT",
        ("-k", "config.n_layer=2", "-k", "config.vocab_size=48"),
        lambda: cm.GPT(cm.GPTConfig(n_layer=2, vocab_size=48)),
        lambda: _tokens_and_targets(48),
        "h.0",
        loss="output:1",
        loss_of=lambda out: out[1],
    ),
    # karpathy/minGPT: GPT(config), config = GPT.get_default_config() (a CfgNode) filled in
    "mingpt": Case(
        f"{FIX}/configmodels.py:MinGPT",
        _k({f"config.{k}": v for k, v in MINGPT.items()}),
        lambda: cm.MinGPT(_mingpt_config(**MINGPT)),
        lambda: _tokens_and_targets(50),
        "transformer.h.0",
        loss="output:1",
        loss_of=lambda out: out[1],
    ),
    # lucidrains/vit-pytorch: keyword-only arguments with no defaults
    "vit": Case(
        f"{FIX}/codebase_shapes.py:ViT",
        _k(VIT),
        lambda: cs.ViT(**VIT),
        lambda: [_floats(2, 3, 32, 32, seed=4)],
        "transformer",
    ),
    # openai/whisper: Whisper(dims: ModelDimensions), integer tokens beside float features
    "whisper": Case(
        f"{FIX}/real_models.py:Whisper",
        ("-k", "dims.n_text_layer=2"),
        lambda: rm.Whisper(rm.ModelDimensions(n_text_layer=2)),
        lambda: [_floats(2, 8, 16, seed=5), _ints(40, 2, 6, seed=6)],
        "decoder.blocks.0",
    ),
    # the same with a dataclass of no defaults, given as one dict literal
    "whisper_dims": Case(
        f"{FIX}/configmodels.py:Whisper",
        ("-k", f"dims={json.dumps(WHISPER_DIMS)}"),
        lambda: cm.Whisper(cm.ModelDimensions(**WHISPER_DIMS)),
        lambda: [_floats(2, 8, 16, seed=5), _ints(40, 2, 6, seed=6)],
        "encoder",
    ),
    # meta-llama/llama: Transformer(params: ModelArgs), a KV cache in plain attributes that
    # forward writes: commands running forward more than once put it back as found before
    # each pass (docs/cost.md, tests/test_forward_state.py)
    "llama": Case(
        f"{FIX}/real_models.py:Transformer",
        ("-k", "params.n_layers=2"),
        lambda: rm.Transformer(rm.ModelArgs(n_layers=2)),
        lambda: [_ints(32, 2, 8, seed=7)],
        "layers.0",
    ),
    # llama's fairscale model.py: Parameter(torch.Tensor(r, c)), a detached cache
    "llama_fairscale": Case(
        f"{FIX}/cost_real.py:LlamaLike",
        ("-k", "dim=32", "-k", "n_layers=2"),
        lambda: cr.LlamaLike(dim=32, n_layers=2),
        None,
        "layers.0",
    ),
    # facebookresearch/segment-anything: an image encoder with a normalised output
    "sam": Case(
        f"{FIX}/codebase_shapes.py:ImageEncoderViT",
        (*_k(SAM), "-k", f"out_chans={SAM_OUT}"),
        lambda: cs.ImageEncoderViT(**SAM, out_chans=SAM_OUT),
        lambda: [_floats(1, 3, 32, 32, seed=8)],
        "neck",
    ),
    # tkipf/pygcn: torch.spmm over a sparse COO adjacency (example_input_array)
    "pygcn": Case(
        f"{FIX}/cost_real.py:SparseGCN",
        ("-k", "nodes=50"),
        lambda: cr.SparseGCN(nodes=50),
        None,
        "gc1",
    ),
    # diffusers' UNet2DConditionModel: keyword-called tuple-returning blocks, dataclass out
    "diffusers": Case(f"{FIX}/cost_real.py:UNetLike", (), cr.UNetLike, None, "mid_block"),
    # a dataclass output, its own loss picked by field name
    "dataclass_lm": Case(
        f"{FIX}/real_models.py:DataclassLM",
        (),
        rm.DataclassLM,
        lambda: _tokens_and_targets(32),
        "mix",
        loss="output:loss",
        loss_of=lambda out: out.loss,
    ),
    # a file inside a package that imports its siblings relatively
    "pkgmodel": Case(
        f"{FIX}/pkgmodel/model.py:Net",
        ("-k", "depth=2"),
        lambda: PkgNet(depth=2),
        lambda: [_floats(2, 6, seed=9)],
        "0",
    ),
    # @torch.inference_mode() on forward: a command that backpropagates is refused (exit 2)
    "inference_mode": Case(
        f"{FIX}/real_models.py:InferenceModeNet",
        (),
        rm.InferenceModeNet,
        lambda: [_floats(3, 4, seed=10)],
        "fc",
        exits=(
            ("grads", 2),
            ("trace-backward", 2),
            ("stats-backward", 2),
            ("cost-backward", 2),
            ("profile-backward", 2),
        ),
    ),
}

TIMING = ("--warmup", "1", "--repeat", "2")
COMMANDS: dict[str, tuple[str, ...]] = {
    "inspect": ("inspect",),
    "grads": ("grads",),
    "buffers": ("buffers",),
    "params": ("params",),
    "registrations": ("registrations",),
    "trace": ("trace",),
    "trace-backward": ("trace", "--backward"),
    "stats": ("stats",),
    "stats-backward": ("stats", "--backward"),
    "features": ("features",),
    "cost": ("cost",),
    "cost-backward": ("cost", "--backward"),
    "profile": ("profile", *TIMING),
    "profile-backward": ("profile", "--backward", *TIMING),
    "ablate": ("ablate",),
}
NO_INPUTS = {"params", "registrations"}  # commands that build the model and run nothing
BACKPROP = {"grads", "trace-backward", "stats-backward", "cost-backward", "profile-backward"}
WITH_LAYER = {"features", "ablate"}


def command_line(case: Case, command: str, input_file: Path | None) -> list[str]:
    head, *rest = COMMANDS[command]
    args = [head, case.spec, *case.kwargs, *rest, "-f", "json"]
    if command not in NO_INPUTS and input_file is not None:
        args += ["--input-file", str(input_file)]
    if command in WITH_LAYER:
        args += ["-l", case.layer]
    if case.loss is not None and (command in BACKPROP or command == "ablate"):
        args += ["--loss", case.loss]
    return args


# -- plain PyTorch ------------------------------------------------------------------------


def built(case: Case) -> nn.Module:
    torch.manual_seed(0)  # as --seed 0 builds it
    return case.build()


def inputs_of(case: Case, model: nn.Module) -> list[Any]:
    if case.inputs is not None:
        return case.inputs()
    example = model.example_input_array
    return list(example) if isinstance(example, tuple | list) else [example]


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """Tensors of an output structure in order (dict values in key order, dataclass
    fields in order), as the report flattens them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat_tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in flat_tensors(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in flat_tensors(getattr(value, f.name))]
    return []


def numel(model: nn.Module) -> int:
    """Every parameter tensor once (a tied weight is one tensor)."""
    return sum(p.numel() for p in model.parameters())


def forward_record(case: Case) -> dict[str, Any]:
    """Plain eval forwards: the output's tensor shapes (all, and the part ``ablate``
    compares: ``logits`` where the output has one), the number of module calls seen by a forward hook on every module (what per-module hooks see) and by a
    global forward hook (what ``trace`` sees: a module hook turns off the fused fast path
    of ``nn.TransformerEncoderLayer``, a global one does not; autograd on turns it off
    too, so ``trace --backward`` sees more calls), and the bytes of
    ``case.layer``'s outputs."""
    model = built(case).eval()
    args = inputs_of(case, model)
    calls = global_calls = layer_bytes = 0

    def count(module: nn.Module, args: Any, output: Any) -> None:
        nonlocal calls
        calls += 1

    def count_global(module: nn.Module, args: Any, output: Any) -> None:
        nonlocal global_calls
        global_calls += 1

    def size(module: nn.Module, args: Any, output: Any) -> None:
        nonlocal layer_bytes
        layer_bytes += sum(t.numel() * t.element_size() for t in flat_tensors(output))

    with register_module_forward_hook(count_global):
        model(*args)  # with autograd on (as trace --backward runs): no fast path
    global_calls_grad, global_calls = global_calls, 0
    with torch.no_grad():
        with register_module_forward_hook(count_global):
            out = model(*args)
        handles = [m.register_forward_hook(count) for m in model.modules()]
        handles.append(model.get_submodule(case.layer).register_forward_hook(size))
        try:
            model(*args)
        finally:
            for h in handles:
                h.remove()
    logits = out.get("logits") if isinstance(out, dict) else getattr(out, "logits", None)
    return {
        "shapes": [list(t.shape) for t in flat_tensors(out)],
        "compared": [list(t.shape) for t in flat_tensors(out if logits is None else logits)],
        "calls": calls,
        "global_calls": global_calls,
        "global_calls_grad": global_calls_grad,
        "layer_bytes": layer_bytes,
    }


def registration_counts(case: Case) -> dict[str, int]:
    """Registrations of each kind while the model is built, from PyTorch's own global
    registration hooks (a module copied with ``copy.deepcopy``, as ``nn.TransformerEncoder``
    clones its layer, registers nothing)."""
    counts = {"module": 0, "parameter": 0, "buffer": 0}

    def counter(kind: str) -> Callable[..., None]:
        def hook(*args: Any) -> None:
            counts[kind] += 1

        return hook

    mod = torch.nn.modules.module
    handles = [
        mod.register_module_module_registration_hook(counter("module")),
        mod.register_module_parameter_registration_hook(counter("parameter")),
        mod.register_module_buffer_registration_hook(counter("buffer")),
    ]
    try:
        built(case)
    finally:
        for h in handles:
            h.remove()
    return counts


def autograd_totals(case: Case) -> tuple[float, float]:
    """(loss, total grad norm) of one train-mode forward and backward with the case's loss
    (default: the sum of every floating output element)."""
    model = built(case).train()
    out = model(*inputs_of(case, model))
    if case.loss_of is not None:
        loss = case.loss_of(out)
    else:
        loss = sum(t.sum() for t in flat_tensors(out) if t.is_floating_point())
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    grads = [p.grad.double().reshape(-1) for p in model.parameters() if p.grad is not None]
    return float(loss.detach()), float(torch.cat(grads).norm())


def close(a: Any, b: float) -> bool:
    return isinstance(a, int | float) and math.isclose(a, b, rel_tol=REL, abs_tol=1e-6)


# -- what each command's report must say --------------------------------------------------


def check_figure(case: Case, command: str, doc: dict[str, Any]) -> None:
    totals = doc["totals"]
    model = built(case)
    if "params" in totals:
        assert totals["params"] == numel(model), (totals["params"], numel(model))
    if command == "inspect":
        root = next(row for row in doc["layers"] if row["name"] == "")
        assert root["output_shapes"] == forward_record(case)["shapes"]
    elif command == "grads":
        loss, norm = autograd_totals(case)
        assert close(totals["loss"], loss), (totals["loss"], loss)
        assert close(totals["grad_norm"], norm), (totals["grad_norm"], norm)
    elif command == "buffers":
        buffers = dict(model.named_buffers())
        assert totals["buffers"] == len(buffers)
        assert totals["elements"] == sum(b.numel() for b in buffers.values())
    elif command == "registrations":
        counts = registration_counts(case)
        assert {kind: totals[kind] for kind in counts} == counts
    elif command == "trace":
        assert totals["forward"] == forward_record(case)["global_calls"]
    elif command == "trace-backward":
        assert totals["forward"] == forward_record(case)["global_calls_grad"]
    elif command in ("stats", "stats-backward"):
        called = [row for row in doc["layers"] if row["called"]]  # containers: not called
        assert len(called) == forward_record(case)["calls"]
    elif command == "features":
        assert totals["matched"] == [case.layer]
        assert totals["bytes"] == forward_record(case)["layer_bytes"]
    elif command in ("profile", "profile-backward"):
        assert totals["calls"] == forward_record(case)["calls"]
    elif command == "ablate":
        assert totals["clean_output"]["shapes"] == forward_record(case)["compared"]
    elif command not in ("params", "cost", "cost-backward"):
        raise AssertionError(f"no figure for {command}")


# -- the matrix ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def input_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("codebase_inputs")
    files = {}
    for name, case in CASES.items():
        if case.inputs is not None:
            files[name] = folder / f"{name}.pt"
            torch.save(case.inputs(), files[name])
    return files


def _params() -> list[Any]:
    params = []
    for name, case in CASES.items():
        xfails = dict(case.xfail)
        for command in COMMANDS:
            marks = [pytest.mark.slow]
            if command in xfails:
                marks.append(pytest.mark.xfail(strict=True, reason=xfails[command]))
            params.append(pytest.param(name, command, marks=marks, id=f"{name}-{command}"))
    return params


@pytest.mark.parametrize(("name", "command"), _params())
def test_command_on_codebase(name: str, command: str, input_files: dict[str, Path]) -> None:
    case = CASES[name]
    result = hookcli(*command_line(case, command, input_files.get(name)))
    expected = dict(case.exits).get(command, 0)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == expected, (result.returncode, result.stderr[-3000:])
    if expected:
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("hookcli: error:")]
        assert len(errors) == 1, result.stderr
        return
    check_figure(case, command, json.loads(result.stdout))


def test_stats_on_an_inference_mode_forward() -> None:
    """stats on a ``@torch.inference_mode()`` forward: the probe's scratch buffer, first
    made inside that forward, is written again by the root's hook after it returned (it
    was an inference tensor there: exit 70, 'Inplace update to inference tensor')."""
    case = CASES["inference_mode"]
    result = hookcli("stats", case.spec, "-i", "3x4", "-f", "json")
    assert result.returncode == 0, result.stderr
    check_figure(case, "stats", json.loads(result.stdout))


# -- fast: the dataclass-config GPT ---------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt_config", "nanogpt", "mingpt"])
def test_config_gpt_inspect_and_grads(tmp_path: Path, name: str) -> None:
    """``-k config.n_layer=2`` builds nanoGPT's unannotated ``GPT(config)`` with the
    GPTConfig of its file, and minGPT's from ``GPT.get_default_config()`` with the fields
    set on it, from the command line: inspect's parameter total and grads' loss and grad
    norm with ``--loss output:1`` (the model's own cross-entropy) equal plain PyTorch's."""
    case = CASES[name]
    torch.save(case.inputs() if case.inputs else [], tmp_path / "in.pt")
    for command in ("inspect", "grads"):
        result = hookcli(*command_line(case, command, tmp_path / "in.pt"))
        assert result.returncode == 0, result.stderr
        check_figure(case, command, json.loads(result.stdout))
    if name == "gpt_config":
        assert numel(built(case)) != numel(cm.GPT(cm.GPTConfig()))  # the -k took effect
    if name == "nanogpt":
        assert numel(built(case)) != numel(rm.GPT(rm.GPTConfig()))
