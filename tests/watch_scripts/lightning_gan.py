"""A pytorch-lightning GAN in manual optimization (a watch test script), as Lightning's
own GAN example is written: one LightningModule holding the generator and the
discriminator, two optimizers, and per batch ``toggle_optimizer``, ``manual_backward``,
``step``, ``zero_grad``, ``untoggle_optimizer`` for G, then the same for D.

Usage: ``python lightning_gan.py OUT.json [--batches N]``; OUT.json holds what the
module computed per batch: ``g_loss`` and ``d_loss``.
"""

import argparse
import json

import pytorch_lightning as pl
import torch
from torch import nn


class GAN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
        self.seen = []

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], 2)
        ones = torch.ones(real.shape[0], 1)
        zeros = torch.zeros(real.shape[0], 1)
        bce = nn.functional.binary_cross_entropy_with_logits

        self.toggle_optimizer(opt_g)
        g_loss = bce(self.discriminator(self.generator(z)), ones)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        d_loss = (bce(self.discriminator(real), ones) + bce(self.discriminator(fake), zeros)) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.seen.append({"g_loss": g_loss.item(), "d_loss": d_loss.item()})

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=2e-4)
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=1e-3)
        return [opt_g, opt_d], []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    real = torch.randn(16 * args.batches, 4)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(real), batch_size=16)
    model = GAN()
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, data)
    with open(args.out, "w") as f:
        json.dump(model.seen, f)


if __name__ == "__main__":
    main()
