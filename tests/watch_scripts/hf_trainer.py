"""A Hugging Face ``Trainer`` run on a tiny regression model (a watch test script).

Usage: ``python hf_trainer.py OUT.json [--max-grad-norm X] [--steps N]``; writes
``Trainer``'s own ``state.log_history`` (``logging_steps=1``: each step's ``loss`` and
``grad_norm``) to OUT.json. ``--max-grad-norm 0`` turns clipping off.
"""

import argparse
import json
import tempfile

import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Regressor(nn.Module):
    def __init__(self, config=None):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.body(x)
        loss = nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(1, keepdim=True) * 3 + torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp,
            max_steps=args.steps,
            per_device_train_batch_size=8,
            learning_rate=1e-2,
            logging_steps=1,
            max_grad_norm=args.max_grad_norm,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = Trainer(model=Regressor(), args=targs, train_dataset=Rows(64))
        trainer.train()
        with open(args.out, "w") as f:
            json.dump(trainer.state.log_history, f)


if __name__ == "__main__":
    main()
