"""A Llama-shaped decoder in plain PyTorch, at any size: ``sample_models.decoder:llama_7b``.

Grouped-query attention through ``scaled_dot_product_attention``, RMSNorm, a SwiGLU
MLP, blocks in an ``nn.ModuleList``, an untied LM head. ``llama_7b`` and
``llama_70b`` have the parameter counts of Llama 2 7B (6,738,415,616) and 70B
(68,976,648,192): build them on meta (``--device meta``), never on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Causal self-attention with ``kv_heads`` key/value heads shared by ``heads`` queries."""

    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        repeat = self.heads // self.kv_heads
        if repeat > 1:
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual attention and MLP."""

    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(dim, eps=1e-5)
        self.self_attn = Attention(dim, heads, kv_heads)
        self.post_attention_layernorm = nn.RMSNorm(dim, eps=1e-5)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab]."""

    def __init__(
        self,
        vocab: int = 256,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        kv_heads: int = 2,
        hidden: int = 128,
        seq: int = 16,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.example_input_array = torch.randint(0, vocab, (1, seq), device="cpu")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x))


def llama_7b(layers: int = 32, seq: int = 128) -> Decoder:
    """Llama 2 7B's shape: 6,738,415,616 parameters with the default 32 layers."""
    return Decoder(32000, 4096, layers, 32, 32, 11008, seq)


def llama_70b(layers: int = 80, seq: int = 128) -> Decoder:
    """Llama 2 70B's shape: 68,976,648,192 parameters with the default 80 layers."""
    return Decoder(32000, 8192, layers, 64, 8, 28672, seq)
