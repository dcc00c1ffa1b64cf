"""Published code that needs issue 44's options, from the command line alone:

- fairscale's model-parallel layers (a decoder written as Meta's Llama reference writes
  them, ``tests/real/llama_mp.py``, from ``tests/fixtures/llama_fairscale.py``) built with ``--model-parallel 1`` and loaded from a
  checkpoint with ``--weights``, as Llama loads ``consolidated.00.pth``; the plain side
  builds the same module in a gloo process group of world size 1 with fairscale's
  model-parallel group of size 1, as torchrun would give it;
- a part of a built model: ``segment_anything:build_sam_vit_b --part image_encoder`` on
  ``--device meta``;
- ``--enable-grad`` on SAM's ``Sam.forward``, decorated ``@torch.no_grad()``
  (``tests/real/sam_small.py`` assembles a small SAM from the package's own classes).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.real.conftest import need
from tests.real.oracle import (
    Package,
    PackageChecks,
    assert_float64_close,
    default_dtype,
    hookcli,
    hookcli_json,
    sum_loss_backward,
    unique_numel,
)

LLAMA_ARGS = {"dim": 32, "n_layers": 2, "n_heads": 4, "vocab_size": 64, "multiple_of": 16}


@pytest.fixture(scope="module")
def model_parallel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """torch.distributed (gloo, world size 1) and fairscale's model-parallel group of size 1
    in this process, for the plain side's builds; taken down after the module."""
    import torch.distributed as dist

    fs_init = need("fairscale.nn.model_parallel.initialize")
    assert not dist.is_initialized()
    store = tmp_path_factory.mktemp("process_group") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        fs_init.initialize_model_parallel(1)
        yield
    finally:
        if fs_init.model_parallel_is_initialized():
            fs_init.destroy_model_parallel()
        dist.destroy_process_group()


@contextlib.contextmanager
def rms_norm_in_own_dtype() -> Iterator[None]:
    """Llama's ``RMSNorm`` normalises in float32 (``x.float()``), then casts back: for the
    float64 reference, the same normalisation in float64."""
    from tests.real.llama_mp import RMSNorm

    saved = RMSNorm.forward
    RMSNorm.forward = lambda self, x: self._norm(x) * self.weight  # type: ignore[method-assign]
    try:
        yield
    finally:
        RMSNorm.forward = saved  # type: ignore[method-assign]


def random_state(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """A checkpoint for ``model``: matrices ~ N(0, 1/fan_in), vectors (norm gains) ~ 1."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in model.state_dict().items():
        x = torch.randn(t.shape, generator=g)
        state[name] = x / math.sqrt(t.shape[-1]) if t.dim() > 1 else 1 + 0.1 * x
    return state


class TestFairscaleModelParallel(PackageChecks):
    @pytest.fixture(scope="class")
    @classmethod
    def pkg(cls, model_parallel_group: None, tmp_path_factory: pytest.TempPathFactory) -> Package:
        from tests.real import llama_mp

        shapes = llama_mp.Transformer(llama_mp.ModelArgs(**LLAMA_ARGS))
        checkpoint = tmp_path_factory.mktemp("llama") / "consolidated.00.pth"
        torch.save(random_state(shapes, seed=11), checkpoint)

        def build() -> nn.Module:  # as Llama.build: the model, then its checkpoint
            model = llama_mp.Transformer(llama_mp.ModelArgs(**LLAMA_ARGS))
            model.load_state_dict(torch.load(checkpoint, weights_only=True))
            return model

        return Package(
            module="fairscale",
            spec="tests/real/llama_mp.py:Transformer",
            build=build,
            kwargs={f"params.{key}": value for key, value in LLAMA_ARGS.items()},
            inputs=("int64:2x8:0..64",),
            options=("--model-parallel", "1", "--weights", str(checkpoint)),
            float64_patch=rms_norm_in_own_dtype,
        )


def test_part_of_a_built_model_on_meta() -> None:
    sam = need("segment_anything")
    doc = hookcli_json(
        [
            "inspect",
            "segment_anything:build_sam_vit_b",
            "--part",
            "image_encoder",
            "--device",
            "meta",
            "-i",
            "1x3x1024x1024",
            "-f",
            "json",
        ]
    )
    with torch.device("meta"):
        encoder = sam.build_sam_vit_b().image_encoder
    assert doc["totals"]["params"] == unique_numel(encoder)
    root = next(r for r in doc["layers"] if r["name"] == "")
    assert root["type"] == type(encoder).__name__
    assert root["output_shapes"] == [[1, 256, 64, 64]]


def _sam_inputs(seed: int) -> list[Any]:
    """``Sam.forward``'s ``batched_input, multimask_output``: one image, no prompts."""
    g = torch.Generator().manual_seed(seed)
    return [[{"image": torch.randn(3, 64, 64, generator=g), "original_size": (64, 64)}], False]


def test_enable_grad_on_a_no_grad_forward(tmp_path: Path) -> None:
    need("segment_anything")
    from tests.real.sam_small import build_sam_small

    inputs = tmp_path / "batched_input.pt"
    torch.save(_sam_inputs(seed=0), inputs)
    argv = ["grads", "tests/real/sam_small.py:build_sam_small", "--input-file", str(inputs)]

    refused = hookcli([*argv, "-f", "json"])
    assert refused.returncode == 2, refused.stderr
    errors = [ln for ln in refused.stderr.splitlines() if ln.startswith("hookcli: error:")]
    assert len(errors) == 1 and "--enable-grad" in errors[0], refused.stderr

    doc = hookcli_json([*argv, "--enable-grad", "-f", "json"])

    # plain autograd in float64 on the undecorated forward; the random-feature position
    # table stays float32, as SAM computes it whatever the model's dtype
    torch.manual_seed(0)
    model = build_sam_small().double().train()
    model.prompt_encoder.pe_layer.float()
    batched, multimask = _sam_inputs(seed=0)
    batched = [{k: v.double() if torch.is_tensor(v) else v for k, v in b.items()} for b in batched]
    with default_dtype(torch.float64):
        out = type(model).forward.__wrapped__(model, batched, multimask)
    assert_float64_close(doc["totals"], sum_loss_backward(model, out))
    assert doc["totals"]["params"] == unique_numel(model)
