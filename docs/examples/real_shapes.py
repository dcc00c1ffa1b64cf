"""Small models shaped like public codebases, for the examples in docs/cost.md and
docs/profile.md: each builds its own example inputs (``example_input_array``), so the
command line needs no ``--input``.

- ``GCN``: tkipf/pygcn's two-layer GCN (``Parameter(torch.FloatTensor(...))``,
  ``torch.spmm`` on a sparse COO adjacency);
- ``CachedLM``: a llama-style decoder keeping its KV cache in plain attributes
  (``self.cache_k``), neither parameters nor buffers;
- ``TinyWhisper``: an encoder-decoder whose blocks sit in ``ModuleList``s;
- ``TinyUNet``: a diffusers-style UNet whose down block is called with keywords and
  returns ``(hidden, (skip, skip))``, and whose output is a dataclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class GraphConvolution(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.FloatTensor(in_features, out_features))
        self.bias = nn.Parameter(torch.FloatTensor(out_features))
        stdv = 1.0 / math.sqrt(out_features)
        self.weight.data.uniform_(-stdv, stdv)
        self.bias.data.uniform_(-stdv, stdv)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return torch.spmm(adj, torch.mm(x, self.weight)) + self.bias


class GCN(nn.Module):
    """2,708 nodes as in Cora, each linked to itself and 2 neighbours each way."""

    def __init__(self, nfeat: int = 64, nhid: int = 16, nclass: int = 7, nodes: int = 2708):
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        rows = [i for i in range(nodes) for _ in range(5)]
        cols = [(i + d) % nodes for i in range(nodes) for d in range(-2, 3)]
        adj = torch.sparse_coo_tensor(
            torch.tensor([rows, cols]), torch.full((len(rows),), 0.2), (nodes, nodes)
        ).coalesce()
        g = torch.Generator().manual_seed(0)
        self.example_input_array = (torch.randn(nodes, nfeat, generator=g), adj)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gc1(x, adj))
        return F.log_softmax(self.gc2(x, adj), dim=1)


class CachedAttention(nn.Module):
    def __init__(self, dim: int, heads: int, max_batch: int, max_seq: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.cache_k = torch.zeros(max_batch, max_seq, heads, self.head_dim)
        self.cache_v = torch.zeros(max_batch, max_seq, heads, self.head_dim)

    def forward(self, x: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.wqkv(x).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        self.cache_k[:b, start_pos : start_pos + s] = k.detach()
        self.cache_v[:b, start_pos : start_pos + s] = v.detach()
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class CachedLM(nn.Module):
    """Token ids in, logits out; a KV cache of ``max_batch x max_seq`` slots per layer."""

    def __init__(
        self,
        vocab: int = 1000,
        dim: int = 256,
        layers: int = 4,
        heads: int = 8,
        max_batch: int = 8,
        max_seq: int = 2048,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            CachedAttention(dim, heads, max_batch, max_seq) for _ in range(layers)
        )
        self.head = nn.Linear(dim, vocab, bias=False)
        g = torch.Generator().manual_seed(0)
        self.example_input_array = torch.randint(0, vocab, (1, 128), generator=g)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.mlp(x)


class Encoder(nn.Module):
    def __init__(self, n_mels: int, dim: int, layers: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(n_mels, dim, 3, padding=1)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv(mel)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return x


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))

    def forward(self, tokens: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + audio.mean(1, keepdim=True)
        for block in self.blocks:
            x = block(x)
        return x @ self.embed.weight.T


class TinyWhisper(nn.Module):
    def __init__(self, n_mels: int = 16, dim: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.encoder = Encoder(n_mels, dim, layers)
        self.decoder = Decoder(100, dim, layers)
        g = torch.Generator().manual_seed(0)
        self.example_input_array = (
            torch.randn(1, n_mels, 32, generator=g),
            torch.randint(0, 100, (1, 8), generator=g),
        )

    def forward(self, mel: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder(tokens, self.encoder(mel))


@dataclass
class UNetOutput:
    sample: torch.Tensor


class DownBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)

    def forward(
        self, hidden_states: torch.Tensor, temb: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        h = F.silu(self.conv1(hidden_states)) + temb[:, :, None, None]
        h2 = F.silu(self.conv2(h))
        return self.down(h2), (h, h2)


class UpBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(c, c, 2, stride=2)
        self.conv = nn.Conv2d(3 * c, c, 3, padding=1)

    def forward(self, hidden_states: torch.Tensor, skips: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return F.silu(self.conv(torch.cat([self.up(hidden_states), *skips], dim=1)))


class TinyUNet(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.time_embedding = nn.Linear(1, c)
        self.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.down_blocks = nn.ModuleList([DownBlock(c)])
        self.up_blocks = nn.ModuleList([UpBlock(c)])
        self.conv_out = nn.Conv2d(c, 3, 3, padding=1)
        g = torch.Generator().manual_seed(0)
        self.example_input_array = (torch.randn(1, 3, 32, 32, generator=g), torch.ones(1, 1))

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> UNetOutput:
        emb = self.time_embedding(timestep)
        h = self.conv_in(sample)
        skips = []
        for block in self.down_blocks:
            h, res = block(hidden_states=h, temb=emb)
            skips.append(res)
        for block in self.up_blocks:
            h = block(h, skips.pop())
        return UNetOutput(sample=self.conv_out(h))
