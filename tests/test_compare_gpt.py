"""`hookcli compare` of a nanoGPT-shaped GPT (written here as nanoGPT writes it) against
transformers' GPT2LMHeadModel built from a small GPT2Config: --copy-weights through the
automatic alignment (transposed Conv1D weights), every aligned module within float32
tolerance, and a planted bug named."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

from tests.conftest import invoke_json


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        # regularization
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.planted = getattr(config, "planted", "")
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        # manual implementation of attention
        att = q @ k.transpose(-2, -1)
        if self.planted != "scale":
            att = att * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = (
            y.transpose(1, 2).contiguous().view(B, T, C)
        )  # re-assemble all head outputs side by side
        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    planted: str = ""


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config

        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = (
            self.lm_head.weight
        )  # https://paperswithcode.com/method/weight-tying

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()  # noqa: RUF059  (as nanoGPT writes it)
        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)
        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        else:
            # inference-time mini-optimization: only forward the lm_head on the very last position
            logits = self.lm_head(x[:, [-1], :])  # note: using list [-1] to preserve the time dim
            loss = None
        return logits, loss


SMALL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 64}
# A as a user builds nanoGPT's GPT from the command line: `-k config.n_layer=2 ...` on the
# unannotated `GPT(config)`, hookcli inferring GPTConfig from this file (issue 44)
A_KW = [f"config.{k}={v}" for k, v in {**SMALL, "block_size": 16}.items()]
B_KW = [f"{k}={v}" for k, v in {**SMALL, "n_positions": 16}.items()] + [
    "activation_function='gelu'",  # nanoGPT's nn.GELU() is exact; GPT-2's default is tanh
    "use_cache=False",
]


def _args(extra_a: list[str] = ()) -> list[str]:
    out = [
        "compare",
        "tests.test_compare_gpt:GPT",
        "hf:gpt2:causal-lm",
        "-i",
        "int64:2x8:0..64",
    ]
    for k in [*A_KW, *extra_a]:
        out += ["--a-kwargs", k]
    for k in B_KW:
        out += ["--b-kwargs", k]
    return [*out, "--copy-weights", "--align", "order"]


def test_nanogpt_against_transformers_gpt2_agrees_module_by_module() -> None:
    pytest.importorskip("transformers")
    report = invoke_json(*_args())
    assert report["settings"]["align"] == "order"
    rows = [r for r in report["calls"] if r["partner"] is not None]
    pairs = {r["name"]: r["partner"] for r in rows}
    for i in range(2):
        for part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "ln_1", "ln_2"):
            assert pairs[f"transformer.h.{i}.{part}"] == f"transformer.h.{i}.{part}"
    transposed = [c for c in report["copied_weights"] if c["how"] == "transposed"]
    assert {c["b"] for c in transposed} >= {"transformer.h.0.attn.c_attn.weight"}
    # every aligned call within float32 tolerance, checked here from the figures
    for r in rows:
        for t in r["outputs"]:
            if t["problem"] is None:
                assert t["max_abs"] <= 1e-5 + 1.3e-6 * 10, (r["name"], t["max_abs"])
    # nanoGPT's lm_head runs on the last position only (its inference mini-optimisation):
    # the one place the two differ, and said as a shape difference
    first = report["first_divergence"]
    assert (first["module"], first["problem"]) == ("lm_head", "shape"), first


def test_nanogpt_with_a_planted_bug_is_named() -> None:
    pytest.importorskip("transformers")
    report = invoke_json(*_args(["config.planted='scale'"]))
    assert report["first_divergence"]["module"] == "transformer.h.0.attn"
    assert report["first_divergence_local"]["module"] == "transformer.h.0.attn"
