"""`hookcli cost` against torchvision's published operation counts (slow: `make zoo`).

torchvision publishes, per classification weight, ``meta["_ops"]``: the GFLOPS
(multiply-accumulates, in billions, rounded to 3 decimals) of one image at the
weights' crop size. hookcli's MACs must match within 0.5%, or within the
published rounding (0.0005 G) where that is larger (mobilenet_v3_small's 0.057).
Models are built on the meta device: nothing is allocated or downloaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torchvision
from torch import nn

from hookcli.cost.runner import measure
from hookcli.options import Mode, ModelOptions, RunOptions
from hookcli.pipeline import prepare
from hookcli.sources import LoadedModel


def _cases() -> list[tuple[str, str]]:
    out = []
    for name in torchvision.models.list_models(module=torchvision.models):
        for weights in torchvision.models.get_model_weights(name):
            out.append((name, weights.name))
    return out


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Move each parameter and buffer to meta as it is registered (for builders that
    compute with tensors, which ``torch.device("meta")`` cannot give values)."""
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer

    def param(self: nn.Module, name: str, value: nn.Parameter | None) -> None:
        register_parameter(self, name, value)
        if value is not None:
            self._parameters[name] = nn.Parameter(value.to("meta"), value.requires_grad)

    def buffer(
        self: nn.Module, name: str, value: torch.Tensor | None, persistent: bool = True
    ) -> None:
        register_buffer(self, name, None if value is None else value.to("meta"), persistent)

    nn.Module.register_parameter = param  # type: ignore[method-assign]
    nn.Module.register_buffer = buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]


def build_on_meta(name: str, **kwargs: object) -> nn.Module:
    try:
        with torch.device("meta"):
            return torchvision.models.get_model(name, weights=None, **kwargs)
    except (NotImplementedError, RuntimeError):
        with params_on_meta():
            return torchvision.models.get_model(name, weights=None, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "weights_name"), _cases())
def test_macs_equal_torchvision_published_ops(name: str, weights_name: str) -> None:
    weights = torchvision.models.get_model_weights(name)[weights_name]
    size = weights.transforms().crop_size[0]
    kwargs = {}
    if name.startswith("vit_") and size != 224:
        kwargs["image_size"] = size  # ViT's position embedding is built for one size
    model = build_on_meta(name, **kwargs)
    assert all(p.is_meta for p in model.parameters())
    prepared = prepare(
        ModelOptions(name),
        RunOptions(inputs=(f"1x3x{size}x{size}",), device="meta"),
        loaded=LoadedModel(model, name),
    )
    probe, _, error = measure(prepared, mode=Mode.EVAL)
    assert error is None
    macs = probe.total_flops() // 2
    published = weights.meta["_ops"] * 1e9
    tolerance = max(0.005 * published, 0.0005e9)
    assert abs(macs - published) <= tolerance, (name, weights_name, macs / 1e9, published / 1e9)
