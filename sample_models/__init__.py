"""Sample models for hookcli's docs and tests; use them as ``sample_models:NAME``."""

from sample_models.basic import BNMLP, CustomLinearLayer, LeNet, Net
from sample_models.faulty import InfModel, NaNModel, UnusedBranch
from sample_models.structured import (
    LSTMModel,
    TiedEmbeddingLM,
    TinyTransformer,
    TwoInputDictOutput,
)

__all__ = [
    "BNMLP",
    "CustomLinearLayer",
    "InfModel",
    "LSTMModel",
    "LeNet",
    "NaNModel",
    "Net",
    "TiedEmbeddingLM",
    "TinyTransformer",
    "TwoInputDictOutput",
    "UnusedBranch",
]

SAMPLES = tuple(f"sample_models:{name}" for name in __all__)
