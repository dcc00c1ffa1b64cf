"""Ablations: hooks that replace what a module outputs (or passes back), and their effect.

PyTorch's hooks can change values, not only read them: a forward hook that
returns a value replaces the module's output, and a tensor hook that returns a
value replaces the gradient. ``run_ablations`` uses exactly that:

1. one clean pass (forward, and backward when a gradient op is given) gives the
   reference output (and parameter grads);
2. each target (one module, or every matched module at once) then gets its own
   pass, with a forward hook on each of its modules that returns the ablated
   output (``Op``) and, for ``grad_op``, a tensor hook on every output tensor
   that returns the replaced gradient;
3. every hook handle is removed in a ``finally`` after its pass; buffers, the
   global RNG and grads are put back before the next pass, so every pass starts
   from the state the clean pass saw, and the ``HookSession`` the passes run in
   restores training flags, buffers and grads at the end.

Figures stay 0-dim tensors on the model's device until every pass has run, and
reach the host in one copy: no pass waits for the device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookcli.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.hooks import RemovableHandle

    from hookcli.losses import LossFunction
    from hookcli.options import Mode

OP_KINDS = ("zero", "mean", "scale", "noise", "clamp")
GRAD_OP_KINDS = ("zero", "scale")
OP_GRAMMAR = "zero, mean, scale:K, noise:SIGMA or clamp:LO..HI"
GRAD_OP_GRAMMAR = "zero or scale:K"

# Output kinds: what the model's (primary) output looks like.
CLASSIFIER = "classifier"  # a 2-D float tensor [batch, classes]
LANGUAGE_MODEL = "language-model"  # [batch, seq, vocab] logits, or any ``logits`` of 3+ dims
TENSOR = "tensor"  # anything else with floating tensors

# Effect metrics, in the order of the per-pass vector (JSON keys, --metric values).
EFFECT_KEYS = ("rel_l2", "cosine", "max_abs", "top1_agreement", "kl")
GRAD_KEYS = ("grad_rel_l2",)
METRICS = (*EFFECT_KEYS, *GRAD_KEYS)
# Metrics where a smaller value means a larger effect.
ASCENDING = frozenset({"cosine", "top1_agreement"})

# A group's grad norm counts as changed when it moved by more than this, relatively.
CHANGED_RTOL = 1e-5


# -- ops ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One ablation op as the user typed it: ``zero``, ``scale:0.5``, ``clamp:0..6``."""

    kind: str
    value: float = 0.0  # the factor of scale, the sigma of noise
    lo: float | None = None  # clamp bounds (either may be open)
    hi: float | None = None
    text: str = ""


def _number(text: str, option: str, spec: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{option} {spec!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"{option} {spec!r}: {what} must be finite")
    return value


def parse_op(text: str, option: str = "--op", kinds: Sequence[str] = OP_KINDS) -> Op:
    """``scale:0.5`` -> Op('scale', 0.5); a malformed op is exit 2 showing the grammar."""
    spec = text.strip()
    kind, sep, arg = spec.partition(":")
    kind = kind.strip().lower()
    grammar = OP_GRAMMAR if tuple(kinds) == OP_KINDS else GRAD_OP_GRAMMAR
    if kind not in kinds:
        raise UsageError(f"unknown {option} {text!r}; use {grammar}")
    if kind in ("zero", "mean"):
        if sep:
            raise UsageError(f"{option} {kind} takes no value, got {text!r}; use {grammar}")
        return Op(kind, text=kind)
    if not arg.strip():
        raise UsageError(f"{option} {kind} needs a value ({kind}:...); use {grammar}")
    if kind == "scale":
        return Op(kind, _number(arg, option, text, "the factor"), text=spec)
    if kind == "noise":
        sigma = _number(arg, option, text, "sigma")
        if sigma < 0:
            raise UsageError(f"{option} {text!r}: sigma must be >= 0")
        return Op(kind, sigma, text=spec)
    lo_text, dots, hi_text = arg.partition("..")
    if not dots or not (lo_text.strip() or hi_text.strip()):
        raise UsageError(
            f"{option} {text!r}: write clamp:LO..HI (clamp:0..6, clamp:..1, clamp:0..)"
        )
    lo = _number(lo_text, option, text, "LO") if lo_text.strip() else None
    hi = _number(hi_text, option, text, "HI") if hi_text.strip() else None
    if lo is not None and hi is not None and lo > hi:
        raise UsageError(f"{option} {text!r}: LO must not be above HI")
    return Op(kind, lo=lo, hi=hi, text=spec)


def parse_grad_op(text: str) -> Op:
    """``--grad-op``: zero or scale:K."""
    return parse_op(text, "--grad-op", GRAD_OP_KINDS)


class _Generators:
    """One ``torch.Generator`` per device, each seeded with ``seed`` when first used."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._by_device: dict[Any, torch.Generator] = {}

    def on(self, device: torch.device) -> torch.Generator:
        import torch

        g = self._by_device.get(device)
        if g is None:
            g = torch.Generator(device=device).manual_seed(self.seed)
            self._by_device[device] = g
        return g


def apply_op(op: Op, t: torch.Tensor, generators: _Generators) -> torch.Tensor:
    """The ablated copy of one floating-point tensor (the original is left untouched)."""
    import torch

    if op.kind == "zero":
        return torch.zeros_like(t)
    if op.kind == "scale":
        return t * op.value
    if op.kind == "mean":
        if t.dim() == 0:
            return t  # no batch dimension to average over
        out = torch.empty_like(t)  # keeps the memory format (channels_last)
        # a materialized copy, not an expanded view: in-place ops downstream must work
        out.copy_(t.mean(dim=0, keepdim=True))
        return out
    if op.kind == "noise":
        std = t.detach().std(correction=0) if t.numel() else t.new_zeros(())
        noise = torch.randn(
            t.shape, generator=generators.on(t.device), dtype=t.dtype, device=t.device
        )
        return t + (op.value * std) * noise
    return torch.clamp(t, min=op.lo, max=op.hi)


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor], _depth: int = 0) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every tensor (tuples, lists, dicts, dataclasses,
    named tuples, Hugging Face ``ModelOutput``); other leaves are kept as they are."""
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if obj is None or _depth > 32:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: map_tensors(getattr(obj, f.name, None), fn, _depth + 1)
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(v, fn, _depth + 1) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn, _depth + 1) for v in obj)
    if isinstance(obj, Mapping):
        items = [(k, map_tensors(v, fn, _depth + 1)) for k, v in obj.items()]
        try:
            return type(obj)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from items
            return dict(items)
    return obj


# -- what a pass ablates, and what came of it ------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What one pass ablates: one module, or (``--together``) every matched module."""

    name: str
    type: str
    modules: tuple[tuple[str, nn.Module], ...]


def single_targets(selected: Sequence[tuple[str, nn.Module]]) -> list[Target]:
    """One target per module."""
    return [Target(name, type(m).__name__, ((name, m),)) for name, m in selected]


def together_target(label: str, selected: Sequence[tuple[str, nn.Module]]) -> Target:
    """All modules in one target."""
    return Target(label, f"{len(selected)} modules", tuple(selected))


def leaves(selected: Sequence[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """The modules without child modules."""
    return [(n, m) for n, m in selected if next(iter(m.children()), None) is None]


@dataclass(frozen=True)
class Effect:
    """How far the ablated output moved from the clean one (None: not defined for the kind)."""

    rel_l2: float
    cosine: float
    max_abs: float
    top1_agreement: float | None
    kl: float | None

    def get(self, key: str) -> float | None:
        value: float | None = getattr(self, key)
        return value


@dataclass(frozen=True)
class GroupChange:
    """One parameter group (a module's own parameters): its grad norm clean and ablated."""

    group: str
    clean_grad_norm: float
    grad_norm: float

    @property
    def ratio(self) -> float | None:
        """grad_norm / clean_grad_norm (None when the clean norm is 0)."""
        return self.grad_norm / self.clean_grad_norm if self.clean_grad_norm else None

    @property
    def changed(self) -> bool:
        scale = max(abs(self.clean_grad_norm), abs(self.grad_norm))
        return abs(self.grad_norm - self.clean_grad_norm) > CHANGED_RTOL * scale

    def to_dict(self) -> dict[str, Any]:
        """The fields, then ``ratio`` and ``changed``."""
        return {**dataclasses.asdict(self), "ratio": self.ratio, "changed": self.changed}


@dataclass(frozen=True)
class Outcome:
    """One pass: the target, its calls, the output's change and the grads' change."""

    target: Target
    calls: int
    output_shapes: tuple[tuple[int, ...], ...]
    tensors: int  # output tensors the op (or, alone, the grad op) acted on, over all calls
    effect: Effect | None  # None: no forward op, or the pass raised
    grad_norm: float | None = None
    grad_rel_l2: float | None = None
    groups: tuple[GroupChange, ...] = ()
    note: str | None = None
    error: str | None = None

    def metric(self, key: str) -> float | None:
        if key == "grad_rel_l2":
            return self.grad_rel_l2
        return None if self.effect is None else self.effect.get(key)


@dataclass(frozen=True)
class CleanOutput:
    """The reference run: the compared output's summary (and loss and grad norm)."""

    kind: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    compared: str  # which part of the output is compared
    norm: float
    mean: float
    std: float
    min: float
    max: float
    top1: list[Any] | None  # classifier: the predicted class of each row
    loss: float | None = None
    grad_norm: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class AblationRun:
    """Everything ``run_ablations`` found, in target order (ranking is the caller's)."""

    clean: CleanOutput
    outcomes: tuple[Outcome, ...]
    not_called: tuple[str, ...]


# -- comparing outputs ------------------------------------------------------------------------
def compared_tensors(output: Any) -> tuple[list[torch.Tensor], str]:
    """The floating tensors of ``output`` that are compared, and a word on which.

    A ``logits`` entry (Hugging Face ``ModelOutput``, a dict) is compared alone,
    so caches and hidden states riding along do not count; otherwise every
    floating tensor of the output structure, flattened in order, is.
    """
    import torch

    from hookcli.structures import iter_tensors

    logits = None
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        logits = output["logits"]
    elif not isinstance(output, torch.Tensor) and isinstance(
        getattr(output, "logits", None), torch.Tensor
    ):
        logits = output.logits
    if logits is not None and logits.is_floating_point():
        return [logits.detach()], "logits"
    found = [t.detach() for t in iter_tensors(output) if t.is_floating_point()]
    what = "output" if isinstance(output, torch.Tensor) else f"{len(found)} output tensor(s)"
    return found, what


def output_kind(tensors: Sequence[torch.Tensor], compared: str) -> str:
    """classifier (2-D), language-model (3-D, or logits of 3+ dims), or tensor."""
    if len(tensors) != 1:
        return TENSOR
    t = tensors[0]
    if t.dim() == 2 and t.shape[-1] > 1:
        return CLASSIFIER
    if (t.dim() == 3 or (compared == "logits" and t.dim() > 3)) and t.shape[-1] > 1:
        return LANGUAGE_MODEL
    return TENSOR


def _flat(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    import torch

    if len(tensors) == 1:
        return tensors[0].reshape(-1).to(dtype)
    return torch.cat([t.reshape(-1).to(dtype) for t in tensors])


class Basis:
    """The clean output, prepared once so that each pass compares cheaply."""

    def __init__(self, tensors: Sequence[torch.Tensor], compared: str) -> None:
        import torch

        self.compared = compared
        self.kind = output_kind(tensors, compared)
        self.shapes = tuple(tuple(t.shape) for t in tensors)
        # float64 throughout: KL and the law of cosines cancel, and float32 left the
        # 4th digit to the thread count.
        self.dtype = torch.float64
        self.out_dtype = str(tensors[0].dtype).removeprefix("torch.")
        self.flat = _flat(tensors, self.dtype)
        self.norm = torch.linalg.vector_norm(self.flat)
        self.top: torch.Tensor | None = None
        self.logp: torch.Tensor | None = None
        if self.kind != TENSOR:
            primary = tensors[0].to(self.dtype)
            self.top = primary.argmax(dim=-1)
            self.logp = torch.log_softmax(primary, dim=-1)

    def compare(self, output: Any) -> tuple[torch.Tensor, str | None]:
        """The EFFECT_KEYS of an ablated output, as one vector (NaN where undefined)."""
        import torch

        tensors, _ = compared_tensors(output)
        nan = torch.full((len(EFFECT_KEYS),), math.nan, dtype=self.dtype, device=self.flat.device)
        if tuple(tuple(t.shape) for t in tensors) != self.shapes:
            return nan, "the output's shapes differ from the clean run's"
        flat = _flat(tensors, self.dtype)
        diff = flat - self.flat
        nd, na, nc = torch.linalg.vector_norm(diff), torch.linalg.vector_norm(flat), self.norm
        rel = torch.where(nc > 0, nd / nc, torch.where(nd > 0, math.inf, 0.0))
        denom = 2 * na * nc
        cos = torch.where(
            denom > 0, ((na * na + nc * nc - nd * nd) / denom).clamp(-1, 1), torch.zeros_like(nd)
        )
        max_abs = diff.abs().max()
        top1 = kl = nan[0]
        if self.top is not None and self.logp is not None:
            primary = tensors[0].to(self.dtype)
            top1 = (primary.argmax(dim=-1) == self.top).to(self.dtype).mean()
            logq = torch.log_softmax(primary, dim=-1)
            rows = max(self.logp.numel() // self.logp.shape[-1], 1)
            kl = torch.nn.functional.kl_div(logq, self.logp, reduction="sum", log_target=True)
            kl = kl / rows
        return torch.stack([rel, cos, max_abs, top1, kl]), None

    def summary(self) -> dict[str, Any]:
        """Device-side figures of the clean output (norm, mean, std, min, max)."""
        f = self.flat
        return {
            "norm": self.norm,
            "mean": f.mean(),
            "std": f.std(correction=0),
            "min": f.min(),
            "max": f.max(),
        }


def effect_of(values: Sequence[float], kind: str) -> Effect:
    """Host values of a compare() vector -> Effect."""
    rel, cos, max_abs, top1, kl = values
    defined = kind != TENSOR
    return Effect(rel, cos, max_abs, top1 if defined else None, kl if defined else None)


# -- running -------------------------------------------------------------------------------------
class _Counter:
    __slots__ = ("calls", "shapes", "tensors")

    def __init__(self) -> None:
        self.calls = 0
        self.tensors = 0
        self.shapes: tuple[tuple[int, ...], ...] = ()


class _GradState:
    """Trainable parameters grouped by owning module, and the clean run's grads."""

    def __init__(self, model: nn.Module) -> None:
        seen: set[int] = set()
        self.params: list[torch.Tensor] = []
        self.group_of: list[int] = []
        self.groups: list[str] = []
        for name, m in model.named_modules():
            own = [p for p in m.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
            if not own:
                continue
            self.groups.append(name or "(root)")
            for p in own:
                seen.add(id(p))
                self.params.append(p)
                self.group_of.append(len(self.groups) - 1)
        self.clean: list[torch.Tensor | None] = []

    def clear(self) -> None:
        for p in self.params:
            p.grad = None

    def take_clean(self) -> None:
        self.clean = [p.grad for p in self.params]
        self.clear()

    def figures(self, device: torch.device, clean: bool = False) -> torch.Tensor:
        """[norm of each group..., total norm, L2 of the change from the clean grads]."""
        import torch

        from hookcli.grads.probe import tensor_norm

        zero = torch.zeros((), dtype=torch.float64, device=device)
        group_sq = [zero] * len(self.groups)
        diff_sq = zero
        for i, p in enumerate(self.params):
            g = self.clean[i] if clean else p.grad
            n = zero if g is None else tensor_norm(g).to(device, torch.float64)
            group_sq[self.group_of[i]] = group_sq[self.group_of[i]] + n * n
            if not clean:
                c = self.clean[i]
                if g is None and c is None:
                    continue
                if g is None or c is None:
                    d = n if c is None else tensor_norm(c).to(device, torch.float64)
                else:
                    d = tensor_norm(g.detach() - c).to(device, torch.float64)
                diff_sq = diff_sq + d * d
        if not group_sq:
            return torch.stack([zero, diff_sq.sqrt()])
        groups = torch.stack(group_sq)
        return torch.cat([groups.sqrt(), groups.sum().sqrt().reshape(1), diff_sq.sqrt().reshape(1)])


class _Buffers:
    """Every buffer's value, put back between passes (train-mode batch norm updates them)."""

    def __init__(self, model: nn.Module) -> None:
        self.saved: list[tuple[nn.Module, str, torch.Tensor, torch.Tensor]] = []
        import torch

        with torch.no_grad():
            for m in model.modules():
                for name, buf in m._buffers.items():
                    if buf is not None:
                        self.saved.append((m, name, buf, buf.detach().clone()))
        self._originals = [original for _, _, original, _ in self.saved]
        self._copies = [copy for _, _, _, copy in self.saved]

    def restore(self) -> None:
        import torch

        for m, name, original, _ in self.saved:
            if m._buffers.get(name) is not original:
                m._buffers[name] = original
        if not self.saved:
            return
        with torch.no_grad():
            try:
                torch._foreach_copy_(self._originals, self._copies)  # one call, not one per buffer
            except (RuntimeError, AttributeError, TypeError):
                for original, copy in zip(self._originals, self._copies, strict=True):
                    original.copy_(copy)


def _rng_devices(device: torch.device) -> list[int]:
    import torch

    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _seed(seed: int, device: torch.device) -> None:
    """Seed the global generators a forward on ``device`` draws from.

    Not ``torch.manual_seed``: without CUDA initialized it queues a lazy CUDA seed and
    records a stack trace each call, a cost per pass for nothing on the CPU.
    """
    import torch

    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)


def run_ablations(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    targets: Sequence[Target],
    *,
    op: Op | None,
    grad_op: Op | None = None,
    mode: Mode,
    seed: int = 0,
    device: torch.device | None = None,
    loss: str | LossFunction = "sum",
    on_pass: Callable[[int, int, str], None] | None = None,
    check: Callable[[Basis], None] | None = None,
) -> AblationRun:
    """One clean pass, then one pass per target; the model is left exactly as found.

    The clean pass raising is a ``RunError``; a target's pass raising is recorded
    in its ``Outcome.error`` and the other targets still run. ``check`` sees the
    clean output before any ablation runs (a UsageError there stops the command).
    """
    import torch

    from hookcli.errors import RunError
    from hookcli.losses import reduce_output
    from hookcli.session import HookSession

    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    backward = grad_op is not None
    with (
        HookSession(model, [], mode=mode, backward=backward, only=()) as session,
        torch.random.fork_rng(devices=_rng_devices(device)),
    ):
        buffers = _Buffers(model)
        grads = _GradState(model) if backward else None
        watched: dict[int, tuple[str, nn.Module]] = {}
        for target in targets:
            for name, m in target.modules:
                watched.setdefault(id(m), (name, m))

        def reset() -> None:
            buffers.restore()
            _seed(seed, device)  # the same dropout masks in every pass (train mode)
            if grads is not None:
                grads.clear()

        def run(clean: bool = False) -> tuple[Any, torch.Tensor | None]:
            output = session.forward(tuple(args), dict(kwargs))
            loss_t = None
            if backward and not clean and not _needs_grad(output):
                return output, None  # the op cut every path (zero on the last layer): no grads
            if backward:
                loss_t = reduce_output(output, loss)
                session.backward(loss_t)
            return output, loss_t

        # -- the clean pass, watching which matched modules run
        counters = {mid: _Counter() for mid in watched}

        def watch(counter: _Counter) -> Callable[..., None]:
            def hook(module: nn.Module, inputs: Any, output: Any) -> None:
                from hookcli.structures import shapes_of

                if counter.calls == 0:
                    counter.shapes = shapes_of(output)
                counter.calls += 1

            return hook

        reset()
        handles: list[RemovableHandle] = []
        try:
            for mid, (_, m) in watched.items():
                handles.append(m.register_forward_hook(watch(counters[mid])))
            output, clean_loss = run(clean=True)
        finally:
            for h in handles:
                h.remove()
        tensors, compared = compared_tensors(output)
        if not tensors or sum(t.numel() for t in tensors) == 0:
            raise UsageError(
                "the model's output holds no floating-point values: nothing to compare"
            )
        basis = Basis(tensors, compared)
        del output, tensors
        if check is not None:
            check(basis)
        if grads is not None:
            grads.take_clean()
        pending: list[torch.Tensor] = [torch.stack(list(basis.summary().values()))]
        if grads is not None:
            pending.append(grads.figures(basis.flat.device, clean=True))
            assert clean_loss is not None
            pending.append(clean_loss.detach().to(torch.float64).reshape(1))

        # -- one pass per target
        raw: list[tuple[Target, _Counter, int | None, int | None, str | None, str | None]] = []
        for i, target in enumerate(targets):
            if on_pass is not None:
                on_pass(i, len(targets), target.name)
            counter = _Counter()
            ran = sum(counters[id(m)].calls for _, m in target.modules)
            if ran == 0:
                raw.append((target, counter, None, None, None, None))
                continue
            reset()
            generators = _Generators(seed)
            handles = []
            error = note = None
            slot = grad_slot = None
            try:
                for _, m in target.modules:
                    handles.append(
                        m.register_forward_hook(
                            _ablating_hook(op, grad_op, counter, generators, handles)
                        )
                    )
                try:
                    output, _ = run()
                except RunError as err:
                    error = err.message
                else:
                    if op is not None:
                        vec, note = basis.compare(output)
                        pending.append(vec)
                        slot = len(pending) - 1
                    if grads is not None:
                        pending.append(grads.figures(basis.flat.device))
                        grad_slot = len(pending) - 1
                    del output
            finally:
                for h in handles:
                    h.remove()
            raw.append((target, counter, slot, grad_slot, note, error))
        reset()

    # -- to the host, once
    values = [v.detach().to("cpu", torch.float64).tolist() for v in pending]
    summary = dict(zip(("norm", "mean", "std", "min", "max"), values[0], strict=True))
    clean_loss_value = clean_grad_norm = None
    clean_groups: list[float] = []
    if grads is not None:
        clean_fig = values[1]
        clean_groups = clean_fig[: len(grads.groups)]
        clean_grad_norm = clean_fig[len(grads.groups)]
        clean_loss_value = values[2][0]
    top1 = (
        basis.top.reshape(-1).tolist()
        if basis.kind == CLASSIFIER and basis.top is not None
        else None
    )
    clean = CleanOutput(
        kind=basis.kind,
        shapes=basis.shapes,
        dtype=basis.out_dtype,
        compared=basis.compared,
        top1=top1,
        loss=clean_loss_value,
        grad_norm=clean_grad_norm,
        **summary,
    )
    outcomes = []
    for target, counter, slot, grad_slot, note, error in raw:
        effect = None if slot is None else effect_of(values[slot], basis.kind)
        grad_norm = grad_rel = None
        groups: tuple[GroupChange, ...] = ()
        if grad_slot is not None and grads is not None:
            fig = values[grad_slot]
            n = len(grads.groups)
            groups = tuple(
                GroupChange(g, c, a)
                for g, c, a in zip(grads.groups, clean_groups, fig[:n], strict=True)
            )
            grad_norm = fig[n]
            denom = clean_grad_norm or 0.0
            grad_rel = fig[n + 1] / denom if denom else (0.0 if fig[n + 1] == 0 else math.inf)
        calls = counter.calls
        if calls == 0 and error is None:
            # Never ran in the clean pass, so no pass was needed: the output is unchanged.
            note = "never called: the output is unchanged"
            if op is not None:
                effect = _unchanged(basis.kind)
            if grads is not None:
                groups = tuple(
                    GroupChange(g, c, c) for g, c in zip(grads.groups, clean_groups, strict=True)
                )
                grad_norm, grad_rel = clean_grad_norm, 0.0
        outcomes.append(
            Outcome(
                target=target,
                calls=calls,
                output_shapes=_first_shapes(target, counters),
                tensors=counter.tensors,
                effect=effect,
                grad_norm=grad_norm,
                grad_rel_l2=grad_rel,
                groups=groups,
                note=note,
                error=error,
            )
        )
    not_called = tuple(
        name or "(root)" for mid, (name, _) in watched.items() if counters[mid].calls == 0
    )
    return AblationRun(clean=clean, outcomes=tuple(outcomes), not_called=not_called)


def _needs_grad(output: Any) -> bool:
    """Whether any floating tensor of ``output`` carries a gradient path."""
    from hookcli.structures import iter_tensors

    return any(t.is_floating_point() and t.requires_grad for t in iter_tensors(output))


def _unchanged(kind: str) -> Effect:
    """The effect of an ablation that changed nothing."""
    defined = kind != TENSOR
    return Effect(0.0, 1.0, 0.0, 1.0 if defined else None, 0.0 if defined else None)


def _first_shapes(target: Target, counters: Mapping[int, _Counter]) -> tuple[tuple[int, ...], ...]:
    for _, m in target.modules:
        c = counters.get(id(m))
        if c is not None and c.calls:
            return c.shapes
    return ()


def _ablating_hook(
    op: Op | None,
    grad_op: Op | None,
    counter: _Counter,
    generators: _Generators,
    handles: list[RemovableHandle],
) -> Callable[..., Any]:
    """A forward hook returning the ablated output; tensor hooks on it for ``grad_op``."""
    import torch

    from hookcli.structures import iter_tensors

    def replace(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        counter.tensors += 1
        assert op is not None
        return apply_op(op, t, generators)

    def grad_hook(g: torch.Tensor) -> torch.Tensor:
        assert grad_op is not None
        return torch.zeros_like(g) if grad_op.kind == "zero" else g * grad_op.value

    def hook(module: nn.Module, inputs: Any, output: Any) -> Any:
        counter.calls += 1
        if grad_op is not None:
            # On the module's own output, before any replacement: the gradient that
            # flows back into the module. A hook registered before a later in-place
            # op (``out += identity``) still sees this version's gradient.
            for t in iter_tensors(output):
                if t.is_floating_point() and t.requires_grad:
                    handles.append(t.register_hook(grad_hook))
                    if op is None:
                        counter.tensors += 1
        if op is None:
            return None
        return map_tensors(output, replace)

    return hook


def rank(outcomes: Sequence[Outcome], key: str) -> list[Outcome]:
    """Largest effect first: passes that raised, then NaN, then by ``key`` (stable)."""

    def sort_key(o: Outcome) -> tuple[int, float]:
        if o.error is not None:
            return (0, 0.0)
        v = o.metric(key)
        if v is None:
            return (3, 0.0)
        if math.isnan(v):
            return (1, 0.0)
        return (2, v if key in ASCENDING else -v)

    return sorted(outcomes, key=sort_key)
