"""A pytorch-lightning run (a watch test script): automatic optimization with
``gradient_clip_val=0.5`` (Lightning calls ``optimizer.step(closure)`` and clips inside
the closure), or ``--manual`` (``manual_backward``, the script's own
``clip_grad_norm_``, ``opt.step()``).

Usage: ``python lightning_loop.py OUT.json [--manual] [--steps N] [--norm-type T]
[--nan-batch K]``; OUT.json holds what the module saw per step: the loss its
``training_step`` computed and the grad norm before clipping (automatic: in
``on_before_optimizer_step``, which Lightning calls before it clips; manual: what
``clip_grad_norm_`` returned). ``--norm-type T``: automatic optimization clips in the
module's own ``configure_gradient_clipping`` with ``clip_grad_norm_(...,
norm_type=T)`` and keeps what it returned (``clip_returned``). ``--nan-batch K``: step
K's batch holds a NaN.
"""

import argparse
import json

import pytorch_lightning as pl
import torch
from torch import nn


class Model(pl.LightningModule):
    def __init__(self, manual, norm_type=None, nan_batch=0):
        super().__init__()
        self.norm_type = norm_type
        self.nan_batch = nan_batch
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.automatic_optimization = not manual
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_step + 1 == self.nan_batch:
            x = x.clone()
            x[0, 0] = float("nan")
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.automatic_optimization:
            self.seen.append({"loss": loss.item()})
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), 0.5)
        self.seen.append({"loss": loss.item(), "grad_norm": float(norm)})
        opt.step()
        return None

    def on_before_optimizer_step(self, optimizer):
        if self.automatic_optimization:
            grads = [p.grad.double() for p in self.parameters() if p.grad is not None]
            self.seen[-1]["grad_norm"] = float(
                torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            )

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ):
        if self.norm_type is None:
            return super().configure_gradient_clipping(
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
        norm = torch.nn.utils.clip_grad_norm_(
            self.parameters(), gradient_clip_val, norm_type=self.norm_type
        )
        self.seen[-1]["clip_returned"] = float(norm)
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--manual", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--norm-type", type=float, default=None)
    parser.add_argument("--nan-batch", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model = Model(args.manual, args.norm_type, args.nan_batch)
    trainer = pl.Trainer(
        max_steps=args.steps,
        max_epochs=100,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **({} if args.manual else {"gradient_clip_val": 0.5}),
    )
    trainer.fit(model, data)
    with open(args.out, "w") as f:
        json.dump(model.seen, f)


if __name__ == "__main__":
    main()
