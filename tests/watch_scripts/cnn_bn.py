"""A CNN with BatchNorm and in-place ReLU trained with SGD + momentum on random data
(a watch test script).

``--model small`` (default): three conv-BN-ReLU(inplace=True) stages, pooling, a linear
head; ``--model resnet18``: torchvision's resnet18 (no weights, 10 classes) on random
3x32x32 images (``--size``). Every ``--eval-every`` steps, an evaluation pass under
``torch.no_grad()`` in ``eval()`` mode over held-out batches (no optimizer step, no
backward), then back to ``train()``. One step = one ``optimizer.step()``; the loss is the
cross-entropy that backward is called on.

Usage: ``python cnn_bn.py --steps 200 --seed 0 [--model resnet18] [--ref ref.json]``.
"""

from __future__ import annotations

import sys

import torch
from reference_figures import RefFile, base_parser, on_device, weights_digest
from torch import nn
from torch.nn import functional as F


def small_cnn(classes: int = 10) -> nn.Module:
    def stage(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )

    return nn.Sequential(
        stage(3, 8),
        nn.MaxPool2d(2),
        stage(8, 16),
        nn.MaxPool2d(2),
        stage(16, 16),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, classes),
    )


def build(name: str) -> nn.Module:
    if name == "small":
        return small_cnn()
    import torchvision

    return torchvision.models.get_model(name, weights=None, num_classes=10)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="small, or a torchvision name")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=0, help="image side (0: 16, resnet18 32)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=5)
    args = parser.parse_args(argv)

    device = on_device(args.device)
    torch.manual_seed(args.seed)
    model = build(args.model).train().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    ref = RefFile(args.ref)
    track = ref.track("", model, optimizer)
    gen = torch.Generator().manual_seed(args.seed)
    size = args.size or (16 if args.model == "small" else 32)
    shape = (args.batch, 3, size, size)
    held_out = [
        (torch.randn(shape, generator=gen), torch.randint(10, (args.batch,), generator=gen))
    ]
    held_out = [(hx.to(device), hy.to(device)) for hx, hy in held_out]
    for step in range(1, args.steps + 1):
        x = torch.randn(shape, generator=gen)
        y = torch.randint(10, (args.batch,), generator=gen)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        value = loss.item()
        track.before_step(value)
        optimizer.step()
        track.after_step()
        print(f"step {step} loss {value:.6f} ({value.hex()})", flush=True)
        if step % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(hx).argmax(1) == hy).sum()) for hx, hy in held_out)
            model.train()
            print(f"eval after step {step}: {correct} of {len(held_out) * args.batch} right")
    print(f"weights sha256 {weights_digest(model)}")
    ref.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
