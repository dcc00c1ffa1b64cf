"""timm: ``timm:resnet18``, as ``timm.create_model("resnet18", pretrained=False)`` builds it."""

from __future__ import annotations

from tests.real.conftest import need
from tests.real.oracle import Package, PackageChecks


class TestTimmResNet18(PackageChecks):
    # two 64x64 images: train-mode batch norm over more than one value per channel
    package = Package(
        module="timm",
        spec="timm:resnet18",
        build=lambda: need("timm").create_model("resnet18", pretrained=False),
        inputs=("2x3x64x64",),
    )
