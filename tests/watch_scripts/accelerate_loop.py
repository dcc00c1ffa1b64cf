"""A training loop written for Hugging Face ``accelerate`` (a watch test script).

Usage: ``accelerate launch --num_processes 2 --cpu accelerate_loop.py OUT [--steps N]``;
each process writes ``OUT.rank{R}.json``: per step the loss it computed and what
``accelerator.clip_grad_norm_`` returned.
"""

import argparse
import json

import torch
from accelerate import Accelerator
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=g)
    y = x[:, :1] * 2 + 0.1 * torch.randn(128, 1, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    seen = []
    for step, (xb, yb) in enumerate(data, 1):
        loss = nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        norm = accelerator.clip_grad_norm_(model.parameters(), 0.1)
        seen.append({"loss": loss.item(), "clip": float(norm)})
        optimizer.step()
        optimizer.zero_grad()
        if step == args.steps:
            break
    with open(f"{args.out}.rank{accelerator.process_index}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
