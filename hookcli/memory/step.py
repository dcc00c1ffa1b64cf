"""One steady-state training step (and one inference forward) under the live-bytes tracker.

``track_step`` makes the optimizer's state as a first step leaves it, without running
one (``_first_state``; the step is measured again without the state of a parameter the
loss does not reach), or under FSDP runs a first step untracked; then the measured one:
forward (in ``forward_context()``: autocast; ``torch.utils.checkpoint`` around every
module of the class ``checkpoint``), the loss, backward (all of it in ``run_context()``:
on meta, the attention kernel the CPU picks, which checkpointing's recomputation in
backward must also see), ``optimizer.step()``, ``zero_grad``. The model is left as it was
found: parameters and buffers are copied before and put back after, gradients and the
train/eval mode too.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookcli.memory.tracker import FSDP_KINDS, LiveBytes, Peak

if TYPE_CHECKING:
    from hookcli.memory.fsdp import FsdpPlan

OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adafactor", "none")


def make_optimizer(
    name: str, params: list[nn.Parameter], foreach: bool | None = None
) -> torch.optim.Optimizer | None:
    """The torch optimizer of ``--optimizer`` (``foreach=None``: torch's choice)."""
    opt = torch.optim
    if name == "none":
        return None
    if name == "adam":
        return opt.Adam(params, lr=1e-4, foreach=foreach)
    if name == "adamw":
        return opt.AdamW(params, lr=1e-4, foreach=foreach)
    if name == "sgd":
        return opt.SGD(params, lr=1e-4, foreach=foreach)
    if name == "sgd-momentum":
        return opt.SGD(params, lr=1e-4, momentum=0.9, foreach=foreach)
    if name == "adafactor":
        return opt.Adafactor(params, lr=1e-4, foreach=foreach)
    raise ValueError(name)


@contextlib.contextmanager
def checkpointing(
    model: nn.Module,
    class_name: str | None,
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Iterator[int]:
    """``torch.utils.checkpoint`` (non-reentrant) around every module of ``class_name``;
    each checkpointed forward in ``context()``, its recomputation in backward too (the
    autocast emulated on meta, which checkpoint cannot re-enter by itself)."""
    if not class_name:
        yield 0
        return
    from torch.utils.checkpoint import checkpoint

    found = [m for m in model.modules() if type(m).__name__ == class_name]

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        def inside(*args: Any, **kwargs: Any) -> Any:
            with context():
                return forward(*args, **kwargs)

        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            return checkpoint(inside, *args, use_reentrant=False, **kwargs)

        return run

    # a forward set on the instance itself (a patched model) is put back as it was
    own = {id(m): vars(m)["forward"] for m in found if "forward" in vars(m)}
    for m in found:
        m.forward = wrap(m.forward)
    try:
        yield len(found)
    finally:
        for m in found:
            if id(m) in own:
                m.forward = own[id(m)]
            else:
                vars(m).pop("forward", None)


@contextlib.contextmanager
def _kept(model: nn.Module) -> Iterator[None]:
    """Parameters, buffers, grads and the mode as they were, whatever the step did."""
    mode = model.training
    params = list(model.parameters())
    grads = [p.grad for p in params]
    with torch.no_grad():
        saved = [t.detach().clone() for t in params] + [b.clone() for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, s in zip([*params, *model.buffers()], saved, strict=False):
                t.copy_(s)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        model.train(mode)


@contextlib.contextmanager
def _module_stack(model: nn.Module, tracker: LiveBytes) -> Iterator[None]:
    names = {id(m): n or "(root)" for n, m in model.named_modules()}
    handles = []

    def pre(m: nn.Module, _args: Any) -> None:
        tracker.enter(names.get(id(m), type(m).__name__))

    def post(m: nn.Module, _args: Any, _out: Any) -> None:
        tracker.leave()

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _inputs(args: Any, kwargs: dict[str, Any]) -> list[Any]:
    from hookcli.structures import iter_tensors

    return list(iter_tensors([args, kwargs]))


@dataclass(frozen=True)
class StepPeaks:
    """What the tracked step found."""

    train: Peak
    optimizer: str
    foreach: bool | None  # the implementation torch picked (None: no optimizer)
    checkpointed: int  # modules wrapped by --checkpoint


def _foreach_used(opt: torch.optim.Optimizer | None) -> bool | None:
    if opt is None:
        return None
    chosen = opt.defaults.get("foreach")
    if chosen is not None:
        return bool(chosen)
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [p for g in opt.param_groups for p in g["params"]]
    return bool(_default_to_fused_or_foreach(params, False, False)[1])


def _attribute_tensors(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """``{"attributes": tensors}``: what the model keeps in plain attributes (a KV cache),
    alive before the step and after, held as their own kind; empty when there are none."""
    from hookcli.modelinfo import attribute_tensors

    found = [t for _, _, t in attribute_tensors(model)]
    return {"attributes": found} if found else {}


def _step_dtype() -> torch.dtype | None:
    """The dtype of Adam's ``step`` count as its first step makes it: torch's private
    ``torch.optim.optimizer._get_scalar_dtype()`` (torch 2.6 to 2.15). None where this
    torch has no such function, or one called otherwise: ``_first_state`` then lets the
    optimizer's own first step make the state."""
    from torch.optim import optimizer

    get = getattr(optimizer, "_get_scalar_dtype", None)
    try:
        found = get() if callable(get) else None
    except TypeError:
        return None
    return found if isinstance(found, torch.dtype) else None


def _first_state(
    opt: torch.optim.Optimizer | None,
    name: str,
    stepped: list[nn.Parameter],
    set_to_none: bool,
) -> None:
    """The optimizer's state and the grads as a first training step leaves them (for the
    parameters that step gives a grad; ``track_step`` takes back what others get), without
    its forward and backward. Adam's, AdamW's and SGD's momentum are made as torch makes
    them at their first step (zeros like the parameter, Adam's ``step`` count on the CPU,
    in ``_step_dtype``); another optimizer's (and Adam's where ``_step_dtype`` is None) by
    its own step on a zero grad. Parameters it moves (weight decay) are put back by
    ``_kept``."""
    group = opt.defaults if opt is not None else {}
    step_dtype = _step_dtype() if name in ("adam", "adamw") else None
    simple = name in ("none", "sgd", "sgd-momentum") or (
        step_dtype is not None
        and not any(group.get(k) for k in ("amsgrad", "fused", "capturable", "differentiable"))
    )
    with torch.no_grad():
        for p in stepped:
            p.grad = None if simple and set_to_none else torch.zeros_like(p)
        if opt is None or not simple:
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
            return
        for p in stepped:
            zeros = functools.partial(torch.zeros_like, p, memory_format=torch.preserve_format)
            if name == "sgd-momentum":
                opt.state[p] = {"momentum_buffer": zeros()}
            elif name in ("adam", "adamw"):
                step = torch.tensor(1.0, dtype=step_dtype, device="cpu")
                opt.state[p] = {"step": step, "exp_avg": zeros(), "exp_avg_sq": zeros()}


def track_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    optimizer: str = "adam",
    foreach: bool | None = None,
    forward_context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    run_context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    zero_grad: str = "none",
    checkpoint: str | None = None,
    recompute_context: Callable[
        [], contextlib.AbstractContextManager[Any]
    ] = contextlib.nullcontext,
    fsdp: FsdpPlan | None = None,
) -> StepPeaks:
    """The peak of one steady-state training step (see the module's doc);
    ``recompute_context``: what each ``checkpoint``-ed forward runs in (``checkpointing``);
    ``fsdp``: one rank's peak under FSDP2 (``hookcli.memory.fsdp``)."""
    set_to_none = zero_grad == "none"
    with _kept(model):
        model.train()
        for p in model.parameters():
            p.grad = None
        params = [p for p in model.parameters() if p.requires_grad]
        names = {id(p): n for n, p in model.named_parameters()}
        sharded = None
        if fsdp is not None:
            from hookcli.memory.fsdp import FsdpMemory

            sharded = FsdpMemory(model, fsdp)
            if foreach is None:  # what torch picks for the model's own parameters
                foreach = _foreach_used(make_optimizer(optimizer, params))
            stepped = [s for s in sharded.shard_params if s.requires_grad]
            names.update(sharded.names)
        else:
            stepped = params
        opt = make_optimizer(optimizer, stepped, foreach)
        attrs = _attribute_tensors(model)
        extra = (*(FSDP_KINDS if sharded is not None else ()), *attrs.keys())
        tracker = LiveBytes(extra)

        def run(tracked: bool) -> None:
            with checkpointing(model, checkpoint, recompute_context), run_context():
                with forward_context():
                    output = model(*args, **kwargs)
                loss = loss_fn(output)
                del output
                if tracked:
                    tracker.phase = "backward"
                loss.backward()
                del loss
                if sharded is not None and tracked:
                    sharded.finish_backward()
            if sharded is not None and not tracked:
                had = {id(p) for p in params if p.grad is not None}
                for p in params:
                    p.grad = None  # FSDP2 frees the unsharded gradients it reduced
                sharded.fill_grads(had)
            if tracked:
                tracker.phase = "step"
                for p in stepped:  # the step's ops name the parameter by its grad, its state
                    state = opt.state.get(p, {}) if opt is not None else {}
                    for t in [p.grad, *state.values()]:
                        if isinstance(t, torch.Tensor) and t.layout is torch.strided:
                            tracker.param_names[t.untyped_storage()._cdata] = names.get(id(p), "")
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
            else:
                for p in stepped:
                    if set_to_none:
                        p.grad = None
                    elif p.grad is not None:
                        p.grad.zero_()

        def measured() -> set[int]:
            """One tracked step (a fresh tracker); the ids of the parameters it gave a grad."""
            nonlocal tracker
            tracker = LiveBytes(extra)
            if sharded is not None:  # the model's own: FsdpMemory makes what a rank holds
                tracker.ignore(model.parameters())
            tracker.hold(model.parameters() if sharded is None else sharded.shard_params, "params")
            tracker.hold(model.buffers(), "buffers")
            tracker.hold(attrs.get("attributes", ()), "attributes")
            tracker.hold((p.grad for p in stepped), "grads")
            if opt is not None:
                for state in opt.state.values():
                    tracker.hold(state.values(), "optimizer_state")
            tracker.hold(_inputs(args, kwargs), "inputs")
            for p in model.parameters() if sharded is None else sharded.shard_params:
                tracker.param_names[p.untyped_storage()._cdata] = names.get(id(p), "")
            got: set[int] = set()

            def accumulated(p: torch.Tensor) -> None:
                got.add(id(p))
                tracker.mark(p.grad, "grads")

            hooks = [p.register_post_accumulate_grad_hook(accumulated) for p in params]

            def pack(t: torch.Tensor) -> torch.Tensor:
                if tracker.phase == "forward":
                    tracker.mark(t, "saved")
                return t

            try:
                saving = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
                with contextlib.ExitStack() as stack:
                    stack.enter_context(_module_stack(model, tracker))
                    if sharded is not None:
                        stack.enter_context(sharded.installed(tracker, set_to_none))
                    stack.enter_context(tracker)
                    stack.enter_context(saving)
                    run(tracked=True)
            finally:
                tracker.close()
                for h in hooks:
                    h.remove()
            return got

        with checkpointing(model, checkpoint) as wrapped:
            pass  # counted only
        if sharded is not None:
            run(tracked=False)  # the optimizer's state, as after the first step
            measured()
        else:
            # the state a first step leaves, made without running one; then the measured step
            _first_state(opt, optimizer, stepped, set_to_none)
            got = measured()
            unused = [p for p in stepped if id(p) not in got]
            if unused:  # the loss does not reach them: a first step leaves them no grad
                for p in unused:  # and no state, so the step is measured again without
                    p.grad = None
                    if opt is not None:
                        opt.state.pop(p, None)
                measured()
    return StepPeaks(tracker.peak, optimizer, _foreach_used(opt), wrapped)


def track_inference(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    forward_context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    fsdp: FsdpPlan | None = None,
) -> Peak:
    """The peak of one eval, no_grad forward whose output is dropped at once; ``fsdp``:
    on one rank under FSDP2, each unit all-gathered for its forward."""
    mode = model.training
    attrs = _attribute_tensors(model)
    tracker = LiveBytes((*(FSDP_KINDS if fsdp is not None else ()), *attrs.keys()))
    tracker.spanning = False  # no backward: no autograd node to place in a module
    with contextlib.ExitStack() as stack:
        if fsdp is not None:
            from hookcli.memory.fsdp import FsdpMemory

            sharded = FsdpMemory(model, fsdp)
            tracker.ignore(model.parameters())
            tracker.hold(sharded.shard_params, "params")
            stack.enter_context(_module_stack(model, tracker))
            stack.enter_context(sharded.installed(tracker, True))
        else:
            tracker.hold(model.parameters(), "params")
            stack.enter_context(_module_stack(model, tracker))
        tracker.hold(model.buffers(), "buffers")
        tracker.hold(attrs.get("attributes", ()), "attributes")
        tracker.hold(_inputs(args, kwargs), "inputs")
        model.eval()
        try:
            with torch.no_grad(), forward_context(), tracker:
                model(*args, **kwargs)
        finally:
            tracker.close()
            model.train(mode)
    return tracker.peak
