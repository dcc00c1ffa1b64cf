"""vit-pytorch: lucidrains' ``ViT`` as its README builds it, at a small size."""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.real.conftest import need
from tests.real.oracle import Package, PackageChecks

CONFIG: dict[str, Any] = {
    "image_size": 32,
    "patch_size": 8,
    "num_classes": 10,
    "dim": 64,
    "depth": 2,
    "heads": 4,
    "mlp_dim": 128,
}


def vit() -> nn.Module:
    return need("vit_pytorch").ViT(**CONFIG)


class TestVitPytorch(PackageChecks):
    package = Package(
        module="vit_pytorch",
        spec="vit_pytorch:ViT",
        build=vit,
        kwargs=CONFIG,
        inputs=("2x3x32x32",),
        seed=5,
    )
