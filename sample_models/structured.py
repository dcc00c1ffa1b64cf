"""Models with structured inputs and outputs: tied weights, dicts, tokens, RNN state."""

from typing import Any

import torch
from torch import nn


class TiedEmbeddingLM(nn.Module):
    """A tiny language model whose embedding and output layer share one weight tensor."""

    def __init__(self, vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.GELU())
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied
        self.example_input_array = torch.randint(0, vocab, (2, 7))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.body(self.embed(tokens)))


class TwoInputDictOutput(nn.Module):
    """Two inputs (an image and a feature vector) and a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.image_branch = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.vector_branch = nn.Linear(6, 4)
        self.classifier = nn.Linear(8, 3)
        self.regressor = nn.Linear(8, 1)
        self.example_input_array = (torch.randn(2, 3, 8, 8), torch.randn(2, 6))

    def forward(self, image: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        joined = torch.cat([self.image_branch(image), self.vector_branch(features)], dim=1)
        return {"logits": self.classifier(joined), "score": self.regressor(joined)}


class TinyTransformer(nn.Module):
    """An embedding plus two encoder layers over int64 token ids, keyword input ``mask``."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, 64, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.example_input_array = torch.randint(0, vocab, (2, 12))

    def forward(self, tokens: torch.Tensor, mask: Any = None) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        padding = None if mask is None else ~mask.bool()
        x = self.encoder(x, src_key_padding_mask=padding)
        return self.head(self.norm(x))


class LSTMModel(nn.Module):
    """An LSTM returning ``(output, (h, c))`` like ``nn.LSTM`` itself."""

    def __init__(self, input_size: int = 8, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.proj = nn.Linear(input_size, input_size)
        self.lstm = nn.LSTM(input_size, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 4)
        self.example_input_array = torch.randn(3, 5, input_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, (h, c) = self.lstm(self.proj(x))
        return self.head(out), (h, c)
