"""A small GPT-style character model trained on a built-in text (a watch test script).

Token + position embeddings (the position embedding is added in place onto the token
embedding's output), 2 blocks of causal self-attention (q, k, v are views of one
projection's output) and a GELU MLP with pre-LayerNorm and dropout, a final LayerNorm,
and a head whose weight is tied to the token embedding. AdamW with two param groups
(weight decay on matrices only), a warm-up + cosine ``LambdaLR``, and
``clip_grad_norm_(..., --clip)`` before each step (the reference's ``grad_norm`` is the
norm before clipping, ``clip_norm`` what ``clip_grad_norm_`` returned, and
``grad_norm_applied`` the clipped one, which the step uses). One step = one ``optimizer.step()``; the loss is
the cross-entropy that backward is called on.

Usage: ``python gpt_char.py --steps 200 --seed 0 [--ref ref.json]``.
"""

from __future__ import annotations

import math
import sys

import torch
from reference_figures import RefFile, base_parser, on_device, weights_digest
from torch import nn
from torch.nn import functional as F

TEXT = """\
It was the best of times, it was the worst of times, it was the age of wisdom, it was
the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it
was the season of Light, it was the season of Darkness, it was the spring of hope, it
was the winter of despair, we had everything before us, we had nothing before us, we
were all going direct to Heaven, we were all going direct the other way - in short, the
period was so far like the present period, that some of its noisiest authorities
insisted on its being received, for good or for evil, in the superlative degree of
comparison only.
"""


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att.masked_fill_(~self.mask[:, :, :t, :t], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self,
        vocab: int,
        block_size: int = 32,
        n_embd: int = 48,
        n_head: int = 4,
        n_layer: int = 2,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(n_embd, n_head, block_size, dropout) for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx)
        x += self.wpe(pos)  # in place, on a module's output
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=10, help="warm-up steps")
    parser.add_argument("--clip", type=float, default=1.0, help="clip_grad_norm_ max norm")
    args = parser.parse_args(argv)

    device = on_device(args.device)
    torch.manual_seed(args.seed)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT], dtype=torch.long)
    model = GPT(len(chars), block_size=args.block_size).train().to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )

    def warmup_cosine(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
    ref = RefFile(args.ref)
    track = ref.track("", model, optimizer)
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(1, args.steps + 1):
        starts = torch.randint(len(data) - args.block_size - 1, (args.batch,), generator=gen)
        x = torch.stack([data[s : s + args.block_size] for s in starts])
        y = torch.stack([data[s + 1 : s + 1 + args.block_size] for s in starts])
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        track.before_clip()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        value = loss.item()
        track.before_step(value, clip_norm=float(norm))
        optimizer.step()
        track.after_step()
        scheduler.step()
        print(f"step {step} loss {value:.6f} ({value.hex()})", flush=True)
    print(f"weights sha256 {weights_digest(model)}")
    ref.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
