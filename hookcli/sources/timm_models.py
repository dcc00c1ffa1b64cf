"""``timm:NAME``: a timm model, ``pretrained=False``, its input size from its own config."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from hookcli.errors import LoadError, first_line

if TYPE_CHECKING:
    from hookcli.sources import LoadedModel


def _timm() -> Any:
    try:
        import timm
    except ImportError as err:
        raise LoadError(
            f"timm: models need timm: pip install 'hookcli[timm]' ({first_line(err)})"
        ) from err
    return timm


def names() -> list[str]:
    """Every architecture timm can build."""
    return sorted(_timm().list_models())


def build(name: str, kwargs: dict[str, Any], seed: int) -> LoadedModel:
    """``timm.create_model(name, pretrained=False, **kwargs)``, seeded."""
    import torch

    from hookcli.sources import LoadedModel

    timm = _timm()
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; did you mean timm:{', timm:'.join(close)}?" if close else ""
        raise LoadError(f"unknown model timm:{name}{hint} (run `hookcli models --filter 'timm:*'`)")
    torch.manual_seed(seed)
    try:
        module = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as err:
        raise LoadError(f"could not build timm:{name}: {first_line(err)}") from err
    cfg = getattr(module, "pretrained_cfg", None) or getattr(module, "default_cfg", None) or {}
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    default: tuple[str, ...] = ()
    if isinstance(size, (list, tuple)) and size:
        default = ("1x" + "x".join(str(int(d)) for d in size),)
    return LoadedModel(
        module=module,
        spec=f"timm:{name}",
        default_inputs=default,
        input_source="timm pretrained_cfg input_size",
    )
