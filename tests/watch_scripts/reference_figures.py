"""The plain-PyTorch reference figures of the watch test scripts (``--ref PATH``).

A training script calls, around each ``optimizer.step()``::

    ref.before_step(loss)   # loss: the value backward was called on (summed over the
    optimizer.step()        # step's backwards under gradient accumulation)
    ref.after_step()

and ``ref.write()`` at its end. Everything here only reads: no RNG draws, no change to
a parameter, a gradient or autograd's graph, so a run with ``--ref`` trains exactly
like one without. Without ``--ref`` (``path`` None) every call returns at once.

Per step (one ``optimizer.step()``, numbered from 1 per optimizer), in float64 from
float64 copies of the tensors:

- ``loss`` / ``loss_hex``: as given by the script (``float.hex`` for bit-for-bit checks);
- ``grad_norm``: L2 over the grads of the optimizer's params that have one, as
  ``clip_grad_norm_`` measures it, before the script clips (``before_clip()``), else
  just before ``step()``; ``grad_norm_applied``: the same just before ``step()`` (after
  any clipping); ``clip_norm``: what the script's ``clip_grad_norm_`` returned;
- ``lr``: ``param_groups[i]["lr"]`` just before ``step()`` (the rate the step uses);
- ``modules``: for every module of the root (``root.named_modules()``, qualified names
  under the root) with own trainable parameters in the optimizer
  (``named_parameters(recurse=False)``; a tied tensor counts in each module that owns
  it): ``grad_norm`` (L2 over its own grads that exist, else null), ``weight_norm``
  (before ``step()``) and ``update_ratio`` = ||w_after - w_before|| / ||w_before||
  (null when ||w_before|| is 0).

Non-finite values are written as Python's json writes them (``NaN``, ``Infinity``).
The file: ``{"steps": [...], "nan": {"step", "phase", "module"} | null}``; with several
tracks (``RefFile.track(name, ...)``): ``{"models": {name: {"steps", "nan"}}, "nan": the
first of theirs in time | null}``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch
from torch import nn


def rank_path(path: str, rank: int) -> str:
    """``ref.json`` -> ``ref.rank1.json`` (``ref`` -> ``ref.rank1``)."""
    stem, suffix = os.path.splitext(path)
    return f"{stem}.rank{rank}{suffix}"


def _l2(tensors: list[torch.Tensor]) -> float:
    total = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        total = total + t.detach().to("cpu", torch.float64).pow(2).sum()  # any device
    return math.sqrt(total.item())  # NaN and Inf pass through


class Track:
    """The figures of one optimizer over the parameters of one root module."""

    def __init__(
        self, root: nn.Module, optimizer: torch.optim.Optimizer, events: list[dict[str, Any]] | None
    ):
        self.enabled = events is not None
        self._events = events
        self.root = root
        self.optimizer = optimizer
        self.steps: list[dict[str, Any]] = []
        self.nan: dict[str, Any] | None = None
        self._before: dict[str, list[torch.Tensor]] = {}
        self._pending: dict[str, Any] | None = None
        self._preclip: dict[str, Any] | None = None

    def _params(self) -> list[torch.Tensor]:
        seen: set[int] = set()
        out = []
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _modules(self) -> list[tuple[str, list[torch.Tensor]]]:
        stepped = {id(p) for p in self._params()}
        out = []
        for name, m in self.root.named_modules():
            own = [
                p
                for _, p in m.named_parameters(recurse=False)
                if p.requires_grad and id(p) in stepped
            ]
            if own:
                out.append((name, own))
        return out

    def _grad_norms(self) -> tuple[float | None, dict[str, float | None]]:
        grads = [p.grad for p in self._params() if p.grad is not None]
        modules = {}
        for name, own in self._modules():
            own_grads = [p.grad for p in own if p.grad is not None]
            modules[name] = _l2(own_grads) if own_grads else None
        return (_l2(grads) if grads else None), modules

    def before_clip(self) -> None:
        """Called just before the script clips: the grad norms before clipping."""
        if self.enabled:
            self._preclip = dict(zip(("total", "modules"), self._grad_norms(), strict=True))

    def before_step(self, loss: float, clip_norm: float | None = None) -> None:
        """``clip_norm``: what the script's ``clip_grad_norm_`` returned this step."""
        if not self.enabled:
            return
        total, per_module = self._grad_norms()
        pre = self._preclip
        self._preclip = None
        modules: dict[str, dict[str, float | None]] = {}
        self._before = {}
        for name, own in self._modules():
            modules[name] = {
                "grad_norm": pre["modules"][name] if pre else per_module[name],
                "update_ratio": None,
                "weight_norm": _l2(own),
            }
            if pre:
                modules[name]["grad_norm_applied"] = per_module[name]
            self._before[name] = [p.detach().to(torch.float64, copy=True) for p in own]
        self._pending = {
            "step": len(self.steps) + 1,
            "loss": float(loss),
            "loss_hex": float(loss).hex(),
            "grad_norm": pre["total"] if pre else total,
            "grad_norm_applied": total,
            "lr": [float(g["lr"]) for g in self.optimizer.param_groups],
            "modules": modules,
        }
        if clip_norm is not None:
            self._pending["clip_norm"] = clip_norm

    def after_step(self) -> None:
        if not self.enabled:
            return
        assert self._pending is not None, "after_step without before_step"
        for name, own in self._modules():
            before = self._before[name]
            diff = [p.detach().to(torch.float64) - b for p, b in zip(own, before, strict=True)]
            w = _l2(before)
            self._pending["modules"][name]["update_ratio"] = _l2(diff) / w if w > 0 else None
        self.steps.append(self._pending)
        self._pending = None
        self._before = {}

    def non_finite(self, step: int, phase: str, module: str | None) -> None:
        """The first non-finite value of this track: its step, phase and origin module."""
        if self._events is not None and self.nan is None:
            self.nan = {"step": step, "phase": phase, "module": module}
            self._events.append(self.nan)

    def as_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "nan": self.nan}


class RefFile:
    """One reference file: one track (most scripts) or several keyed by name."""

    def __init__(self, path: str | None):
        self.path = path
        self.tracks: dict[str, Track] = {}
        self.events: list[dict[str, Any]] = []  # the tracks' first non-finite values, in order

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def track(self, name: str, root: nn.Module, optimizer: torch.optim.Optimizer) -> Track:
        t = Track(root, optimizer, self.events if self.enabled else None)
        self.tracks[name] = t
        return t

    def write(self) -> None:
        if self.path is None:
            return
        if list(self.tracks) == [""]:
            data: dict[str, Any] = self.tracks[""].as_dict()
        else:
            data = {
                "models": {k: t.as_dict() for k, t in self.tracks.items()},
                "nan": self.events[0] if self.events else None,
            }
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")


def weights_digest(module: nn.Module) -> str:
    """sha256 over the bytes of every tensor of the state dict, in order: equal digests,
    bit-identical weights and buffers."""
    import hashlib

    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def base_parser(description: str) -> Any:
    """``--steps N --seed S [--ref PATH] [--device D]``, which every watch test script
    takes (``--device`` only where the script passes it to ``on_device``)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ref", default=None, help="write the reference figures (JSON) there")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where there is one")
    return parser


def on_device(name: str) -> torch.device:
    """The device to train on. On CUDA the script asks torch for its deterministic
    kernels (and cuBLAS for a fixed workspace), as any script does whose runs are to be
    compared bit for bit: two runs of it, watched or not, then compute the same losses.
    The data stays drawn on the CPU (the same values on every device) and is moved."""
    device = torch.device(name)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    return device
