"""MODEL sources that need an optional extra: ``hf:`` (transformers) and ``timm:``.

Each module has ``build(name, kwargs, seed) -> LoadedModel`` and ``names()``;
``hookcli.loading.PREFIXES`` maps the prefix to it. ``LoadedModel``, what every
source returns, lives here, below both the sources and the loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class LoadedModel:
    """A built model and what was learnt about it while building."""

    module: nn.Module
    spec: str
    family: str | None = None  # torchvision family, None for user models
    torchvision_name: str | None = None
    # SPEC texts (``[NAME=][DTYPE:]DIMS[:LOW..HIGH]``) when the source knows the inputs
    default_inputs: tuple[str, ...] = ()
    input_source: str = ""  # where default_inputs came from, for the report
    # name -> CPU tensor: exact values for default inputs of that name (hf multimodal ids)
    input_values: Mapping[str, Any] | None = None
    # what the report's settings record of the build: kwargs (as given), weights (path, sha256)
    settings: Mapping[str, Any] | None = None
