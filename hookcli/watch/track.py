"""What the monitor holds per model (a track): its parameters, modules and optimizers,
and the figures of the step under way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hookcli.watch.figures import _Plan


@dataclass
class _Module:
    name: str
    type: str
    params: list[int]  # indices into the track's params (its own stepped ones)
    numel: int  # elements of the module and its descendants
    own: int
    trainable: int
    depth: int


@dataclass
class _Step:
    """The figures of one step between its pre- and post-hook (device tensors)."""

    step: int
    logged: bool
    pos: list[int]  # indices of the params that have a grad
    norms: torch.Tensor | None  # their grad norms, one vector
    losses: list[torch.Tensor]
    lrs: list[Any]
    weights: torch.Tensor | None = None  # weight norms of every param (logged)
    before: list[torch.Tensor] | None = None  # copies for the update ratio (logged)
    updates: torch.Tensor | None = None  # ||w_after - w_before|| per param (logged)
    act: dict[int, tuple[tuple[torch.Tensor, ...], int]] = field(default_factory=dict)
    act_order: list[int] = field(default_factory=list)
    # the optimizers (places in the model's list) that took the step: a model with several
    by: list[int] | None = None
    origin: dict[str, Any] | None = None  # --nan-origin's finding for this step
    step_time: float | None = None
    time: float = 0.0
    pre_pos: list[int] | None = None  # before clipping (None: no clipping this step)
    pre_norms: torch.Tensor | None = None
    pre_total: torch.Tensor | None = None  # the whole model's, as the clip returned it
    pre_type: float = 2.0  # the norm_type of ``pre_total``


@dataclass
class _Track:
    index: int
    label: str
    mode: str  # "optimizer" or "backward"
    optimizer: Any  # a weakref to the (first) optimizer (None in backward mode)
    root_class: str
    params: list[torch.Tensor]
    param_names: list[str]
    modules: list[_Module]
    n_params: int  # what the optimizers held when the track was built
    steps: int = 0
    last_post: float | None = None
    next_logged: bool = True
    pending: _Step | None = None
    never: set[int] = field(default_factory=set)  # params that never had a grad
    act: dict[int, tuple[tuple[torch.Tensor, ...], int]] = field(default_factory=dict)
    act_order: list[int] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # non-finite kinds already reported
    forward_order: list[int] = field(default_factory=list)  # modules, last logged step
    refs: list[nn.Module] = field(default_factory=list)  # the modules, kept alive
    plans: dict[Any, _Plan] = field(default_factory=dict)  # how to take the norms
    kept: list[torch.Tensor] | None = None  # the parameter copies, reused (CPU)
    members: dict[int, int] = field(default_factory=dict)  # id(optimizer) -> its params
    root_ids: tuple[int, ...] = ()
    ids: set[int] = field(default_factory=set)  # id() of every stepped parameter
    preclip: tuple[list[int], torch.Tensor | None] | None = None  # at the first clip
    preclip_total: torch.Tensor | None = None  # what that clip returned (whole model)
    preclip_type: float = 2.0  # ... and its norm_type
    sharded: bool = False  # DTensor parameters (FSDP2): figures of the local shards
    closing: list[Any] | None = None  # a closure step's lrs, until its closure returns
    joined: set[int] = field(default_factory=set)  # optimizers stepped in the open step
    posted: set[int] = field(default_factory=set)  # ... and done
    stop_due: dict[str, Any] | None = None  # a stop found before the step (a NaN loss)
    early: str | None = None  # the kind of that non-finite loss, until the step


def _count(opt: Any) -> int:
    return sum(len(g["params"]) for g in opt.param_groups)


def _params_of(opts: list[Any]) -> tuple[list[torch.Tensor], set[int]]:
    """The parameters of ``opts``, each once, in their order."""
    params: list[torch.Tensor] = []
    seen: set[int] = set()
    for opt in opts:
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
    return params, seen


def _grads(track: _Track) -> tuple[list[torch.Tensor], list[int]]:
    """The gradients of ``track``'s parameters that have one, and where they are."""
    found = [p.grad for p in track.params]
    grads = [g for g in found if g is not None]
    if len(grads) == len(found):
        pos = list(range(len(found)))
    else:
        pos = [i for i, g in enumerate(found) if g is not None]
    if track.sharded:
        grads = _locals(grads)
    return grads, pos


def _is_dtensor(t: Any) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def _locals(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A DTensor's local shard (what this rank holds), other tensors as they are."""
    with torch.no_grad():
        return [t.to_local() if _is_dtensor(t) else t for t in tensors]  # type: ignore[attr-defined]


def _weights(track: _Track) -> list[torch.Tensor]:
    """The stepped parameters, as this rank holds them."""
    return _locals(track.params) if track.sharded else track.params
