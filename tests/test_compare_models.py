"""Models for the compare tests (loaded as tests.test_compare_models:NAME); no tests here.

``Decoder(bug=...)`` plants one known bug in block 1: ``gelu`` (the tanh approximation in
``h.1.mlp.act``), ``scale`` (attention without 1/sqrt(d) in ``h.1.attn``) or
``transpose`` (``h.1.mix`` multiplies by its weight transposed). Built with the same seed,
every variant has the same weights as the correct one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

BUGS = {"gelu": "h.1.mlp.act", "scale": "h.1.attn", "transpose": "h.1.mix"}


class Attention(nn.Module):
    def __init__(self, d, heads, bug=None):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads
        self.bug = bug

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = q @ k.transpose(-2, -1)
        if self.bug != "scale":
            att = att * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Mix(nn.Linear):
    def __init__(self, d, bug=None):
        super().__init__(d, d)
        self.bug = bug

    def forward(self, x):
        w = self.weight.t() if self.bug == "transpose" else self.weight
        return F.linear(x, w, self.bias)


class MLP(nn.Module):
    def __init__(self, d, bug=None):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU(approximate="tanh" if bug == "gelu" else "none")
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads, bug=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, bug)
        self.mix = Mix(d, bug)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d, bug)

    def forward(self, x):
        x = x + self.mix(self.attn(self.ln_1(x)))
        return x + self.mlp(self.ln_2(x))


class Decoder(nn.Module):
    """A small decoder: embeddings, ``n_layer`` blocks, a head; ``bug`` goes to block 1."""

    def __init__(self, vocab=50, d=32, heads=4, n_layer=3, seq=8, bug=None):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads, bug if i == 1 else None) for i in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.example_input_array = torch.randint(0, vocab, (2, seq))

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


class ConvNet(nn.Module):
    """A small convnet: conv, batch norm, ReLU, pooling, a residual add, a classifier."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)
        self.example_input_array = torch.randn(2, 3, 16, 16)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(x + self.bn2(self.conv2(x)))
        return self.fc(self.pool(x).flatten(1))


class MLPNet(nn.Module):
    """Linear layers only: what quantize_dynamic changes."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)
        self.example_input_array = torch.randn(4, 16)

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))
