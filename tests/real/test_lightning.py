"""pytorch-lightning: the ``LightningTransformer`` that ``pytorch_lightning.demos`` ships
(an ``nn.Transformer`` language model), fed source and target token batches.

It has no ``example_input_array``, so the tokens are given with ``-i``. Its dropout (0.2) is
fixed by the demo, so ``grads`` runs in eval mode: a train-mode run would draw its masks
from the global RNG, which a float64 reference cannot repeat."""

from __future__ import annotations

from torch import nn

from tests.real.conftest import need
from tests.real.oracle import Package, PackageChecks


def transformer() -> nn.Module:
    return need("pytorch_lightning.demos.transformer").LightningTransformer(vocab_size=100)


class TestLightningTransformer(PackageChecks):
    package = Package(
        module="pytorch_lightning",
        spec="pytorch_lightning.demos.transformer:LightningTransformer",
        build=transformer,
        kwargs={"vocab_size": 100},
        inputs=("int64:2x8:0..100", "int64:2x8:0..100"),
        seed=2,
        grads_mode="eval",
    )
