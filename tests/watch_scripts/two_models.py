"""Two models and two optimizers in one process: a tiny GAN on a 2-D ring of Gaussians
(a watch test script).

The generator (noise -> point) and the discriminator (point -> logit) each have their own
Adam. Each iteration: one discriminator step (on real points and detached fakes), then
one generator step, during which the discriminator's parameters are frozen
(``requires_grad_(False)``, as pix2pix/CycleGAN do) so that the generator's backward
leaves the discriminator's grads alone. Each optimizer counts its own steps from 1; the
loss of a discriminator step is ``loss_d`` (the one backward before it), of a generator
step ``loss_g``.

With ``--ref PATH`` the reference figures are keyed per model, each under its own root
(module names under that model):
``{"models": {"discriminator": {"steps": [...], "nan": null},
"generator": {"steps": [...], "nan": null}}, "nan": null}``.

Usage: ``python two_models.py --steps 50 --seed 0 [--ref ref.json]``.
"""

from __future__ import annotations

import math
import sys

import torch
from reference_figures import RefFile, base_parser, weights_digest
from torch import nn
from torch.nn import functional as F


class Generator(nn.Module):
    def __init__(self, noise: int = 4, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(noise, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.out = nn.Linear(hidden, 2)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.out(self.net(z))


class Discriminator(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(2, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(1)


def ring(n: int, gen: torch.Generator) -> torch.Tensor:
    """Points around 8 Gaussians on the unit circle."""
    k = torch.randint(8, (n,), generator=gen).double()
    angle = 2 * math.pi * k / 8
    centres = torch.stack([angle.cos(), angle.sin()], 1).float()
    return centres + 0.05 * torch.randn(n, 2, generator=gen)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--noise", type=int, default=4)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    generator, discriminator = Generator(args.noise), Discriminator()
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    ref = RefFile(args.ref)
    track_d = ref.track("discriminator", discriminator, opt_d)
    track_g = ref.track("generator", generator, opt_g)
    gen = torch.Generator().manual_seed(args.seed)
    ones, zeros = torch.ones(args.batch), torch.zeros(args.batch)
    for step in range(1, args.steps + 1):
        real = ring(args.batch, gen)
        fake = generator(torch.randn(args.batch, args.noise, generator=gen))

        opt_d.zero_grad()
        loss_d = F.binary_cross_entropy_with_logits(
            discriminator(real), ones
        ) + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
        loss_d.backward()
        value_d = loss_d.item()
        track_d.before_step(value_d)
        opt_d.step()
        track_d.after_step()

        discriminator.requires_grad_(False)
        opt_g.zero_grad()
        loss_g = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        loss_g.backward()
        discriminator.requires_grad_(True)
        value_g = loss_g.item()
        track_g.before_step(value_g)
        opt_g.step()
        track_g.after_step()
        print(
            f"step {step} loss_d {value_d:.6f} ({value_d.hex()}) "
            f"loss_g {value_g:.6f} ({value_g.hex()})",
            flush=True,
        )
    print(f"weights sha256 {weights_digest(generator)} {weights_digest(discriminator)}")
    ref.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
