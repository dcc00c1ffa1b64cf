"""segment-anything: SAM's ``ImageEncoderViT`` at a small size, with windowed attention and
relative positions as SAM uses them (no global-attention block at this depth)."""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.real.conftest import need
from tests.real.oracle import Package, PackageChecks

CONFIG: dict[str, Any] = {
    "img_size": 64,
    "patch_size": 16,
    "embed_dim": 64,
    "depth": 2,
    "num_heads": 2,
    "out_chans": 32,
    "window_size": 2,
    "use_rel_pos": True,
    "global_attn_indexes": (),
}


def encoder() -> nn.Module:
    return need("segment_anything.modeling").ImageEncoderViT(**CONFIG)


class TestSamImageEncoder(PackageChecks):
    package = Package(
        module="segment_anything",
        spec="segment_anything.modeling:ImageEncoderViT",
        build=encoder,
        kwargs=CONFIG,
        inputs=("2x3x64x64",),
        seed=4,
    )
