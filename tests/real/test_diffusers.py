"""diffusers: a small ``UNet2DModel`` (attention in one down and one up block), fed a noisy
batch and a tensor of timesteps; its output is the ``UNet2DOutput`` dataclass."""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.real.conftest import need
from tests.real.oracle import Package, PackageChecks

CONFIG: dict[str, Any] = {
    "sample_size": 16,
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": (16, 32),
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
    "up_block_types": ("AttnUpBlock2D", "UpBlock2D"),
    "attention_head_dim": 8,
}


def unet() -> nn.Module:
    return need("diffusers").UNet2DModel(**CONFIG)


class TestDiffusersUNet2D(PackageChecks):
    package = Package(
        module="diffusers",
        spec="diffusers:UNet2DModel",
        build=unet,
        kwargs=CONFIG,
        inputs=("2x3x16x16", "int64:2:0..1000"),
        seed=1,
    )
