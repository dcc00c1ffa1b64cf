"""``profile``: the plan, the passes, the report.

A run is, in order:

1. the *counting pass*: ``hookcli.cost.runner.measure`` with cost's ``CostProbe`` counts
   every module call's FLOPs (and, with ``--backward``, its backward FLOPs) and
   gives the call tree; no clock runs while the counter's dispatch mode is on;
2. ``--warmup`` untimed passes, bare and hooked;
3. on CUDA one pass measuring memory per call (``max_memory_allocated`` delta);
4. ``--repeat`` timed repeats, each a bare forward (no hook at all, timed around
   the call) and a hooked forward (and backward), in alternating order so neither
   always runs on the warmer cache.

``overhead_ratio`` is the median hooked forward over the median bare forward,
both timed the same way around the model call in the same process.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import RunError, UsageError
from hookcli.options import Loss, Mode, loss_arg
from hookcli.profile.figures import CallTree, Spread, Timings, overhead, spread
from hookcli.profile.plan import Measured, ProfilePlan, SortKey

if TYPE_CHECKING:
    from typing import Unpack

    from torch import nn

    from hookcli.commandargs import RunArgs
    from hookcli.cost.probe import CostProbe
    from hookcli.pipeline import Prepared
    from hookcli.profile.clocks import Clock
    from hookcli.profile.hooks import TimingHooks
    from hookcli.report import Report
    from hookcli.session import CallRecord


META_REFUSED = "profile times real runs: --device meta has no time (use cost for FLOPs on meta)"
# --warmup and --repeat: far more passes than any timing needs.
MAX_PASSES = 1_000_000
# The stamps per module call per timed pass (hooks.TimingHooks): forward and backward
# start and end, the backward thread (int64 each), and a backward flag byte.
STAMP_BYTES = 41


def parse_max_ms(text: str) -> tuple[str, float]:
    """``GLOB:MS`` -> (glob, milliseconds); the last colon splits."""
    glob, sep, ms = text.rpartition(":")
    try:
        value = float(ms)
    except ValueError:
        value = -1.0
    if not sep or not glob or not value >= 0:
        raise UsageError(
            f"--max-ms {text!r}: expected GLOB:MS, e.g. 'layer4*:20' or '(root):150' "
            "(MS a number of milliseconds >= 0)"
        )
    return glob, value


def plan_profile(
    backward: bool = False,
    warmup: int = 2,
    repeat: int = 10,
    sort: str | SortKey = SortKey.SELF,
    max_ms: str | Sequence[str] | None = None,
    sync: bool = False,
    depth: int | None = None,
    trace_out: str | Path | None = None,
    plot: str | Path | None = None,
    top: int = 20,
    progress: bool = False,
    loss: str | Loss | None = None,
) -> ProfilePlan:
    """Check the options of ``profile`` (UsageError, before any model is built).

    ``--trace-out`` and ``--plot`` get the checks ``-o`` gets (``atomic.check_target``:
    a folder, a read-only file, a place where no file can be made, ``-``), and may not
    name one file.
    """
    for option, value in (("--warmup", warmup), ("--repeat", repeat)):
        low = 0 if option == "--warmup" else 1
        if value < low:
            raise UsageError(f"{option} must be >= {low}, got {value}")
        if value > MAX_PASSES:
            why = "; each timed pass keeps its stamps in memory" if option == "--repeat" else ""
            raise UsageError(f"{option} {value} is out of range: at most {MAX_PASSES:,}{why}")
    if depth is not None and depth < 0:
        raise UsageError(f"--depth must be >= 0, got {depth}")
    if top < 1:
        raise UsageError(f"top must be >= 1, got {top}")
    try:
        key = SortKey(sort)
    except ValueError:
        raise UsageError(
            f"--sort must be one of {', '.join(k.value for k in SortKey)}, got {sort!r}"
        ) from None
    texts = [max_ms] if isinstance(max_ms, str) else list(max_ms or ())
    gates = tuple(parse_max_ms(t) for t in texts)
    trace_path = Path(trace_out) if trace_out is not None else None
    plot_path = Path(plot) if plot is not None else None
    from hookcli.atomic import check_distinct, check_target
    from hookcli.grads.plot import check_plot_path

    if trace_path is not None:
        check_target(trace_path, "--trace-out")
    if plot_path is not None:
        from hookcli.plot import require_matplotlib

        require_matplotlib()  # exit 2 before any work when matplotlib is missing
        check_plot_path(plot_path)
    check_distinct((("--trace-out", trace_path), ("--plot", plot_path)))
    return ProfilePlan(
        backward,
        warmup,
        repeat,
        key,
        gates,
        sync,
        depth,
        trace_path,
        plot_path,
        top,
        progress,
        loss_arg(loss),
    )


# -- the counting pass -------------------------------------------------------------------


def call_tree(probe: CostProbe, records: Sequence[CallRecord]) -> CallTree:
    """The call tree of the counting pass (records and the probe's lists share indices)."""
    n = len(records)
    return CallTree(
        names=tuple(r.name for r in records),
        types=tuple(r.type for r in records),
        depths=tuple(r.depth for r in records),
        parents=tuple(probe.parent[:n]),
        module_ids=tuple(probe.module_ids[:n]),
    )


# -- the timed passes ------------------------------------------------------------------------


def _with_grad(value: Any) -> Any:
    """Floating tensors as new leaves that require grad (nested lists/tuples/dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not value.requires_grad:
            return value.detach().requires_grad_(True)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_with_grad(v) for v in value)
    if isinstance(value, dict):
        return {k: _with_grad(v) for k, v in value.items()}
    return value


class _Progress:
    """A one-line bar on stderr, shown when the repeats will take more than ~2 s."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled
        self.total = total
        self.shown = False

    def update(self, done: int, per_repeat_s: float) -> None:
        if not self.enabled:
            return
        if not self.shown and per_repeat_s * self.total < 2.0:
            return
        self.shown = True
        width = 30
        fill = int(width * done / self.total)
        left = per_repeat_s * (self.total - done)
        sys.stderr.write(
            f"\rprofile: repeat {done}/{self.total} [{'#' * fill}{'.' * (width - fill)}] "
            f"~{left:.0f} s left "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 70 + "\r")
            sys.stderr.flush()


def _open_label(hooks: TimingHooks | None, tree: CallTree) -> tuple[str, str] | None:
    if hooks is None or hooks._top <= 0:
        return None
    i = hooks._stack[hooks._top - 1]
    return (tree.names[i] or "(root)", tree.types[i])


def _run_error(
    err: BaseException, where: tuple[str, str] | None, phase: str, model: Any = None
) -> Exception:
    from hookcli.errors import ResourceError, first_line, is_oom, oom_cause
    from hookcli.failure import carried_state_reason, deliberate, internal_error, raised_at

    if is_oom(err):
        return ResourceError(f"out of memory during {phase}: {first_line(oom_cause(err))}")
    # the state a model keeps across calls, where the model raised, or hookcli's own bug
    why = carried_state_reason(err, model) if model is not None else ""
    if not why and not deliberate(err):
        at = raised_at(err)
        if at is not None and at.hookcli:
            return internal_error(err, at, phase, f"{where[0]} ({where[1]})" if where else None)
        why = at.suffix() if at is not None else ""
    reason = why if why and not why.startswith(" (") else f"{first_line(err)}{why}"
    if where is None:
        return RunError(f"{phase} failed: {reason}")
    return RunError(f"{phase} failed in {where[0]} ({where[1]}): {reason}", where[0])


def time_passes(
    prepared: Prepared,
    plan: ProfilePlan,
    tree: CallTree,
    probe: CostProbe,
    clock: Clock,
) -> Measured:
    """Warmup, the memory pass (cuda), the timed repeats. Raises RunError/ResourceError."""
    import torch

    from hookcli.amp import autocast
    from hookcli.losses import make_loss
    from hookcli.profile.hooks import Diverged, MemoryHooks, TimingHooks
    from hookcli.session import HookSession

    assert prepared.inputs is not None
    model = prepared.model
    by_id = {id(m): m for m in model.modules()}
    modules = [by_id[tree.module_ids[calls[0]]] for calls in tree.slot_calls]
    args, kwargs = prepared.inputs.args, dict(prepared.inputs.kwargs)
    if plan.backward:
        args, kwargs = _with_grad(args), _with_grad(kwargs)
    grad_ctx: Callable[[], Any] = torch.enable_grad if plan.backward else torch.inference_mode
    called = set(tree.module_ids)
    uncalled = [  # a scripted submodule takes no Python hooks (the session skips it too)
        mod
        for mod in by_id.values()
        if id(mod) not in called and not isinstance(mod, torch.jit.ScriptModule)
    ]
    try:
        hooks = TimingHooks(
            modules,
            tree,
            plan.repeat,
            backward=plan.backward,
            now=clock.now,
            event=clock.event,
            uncalled=uncalled,
        )
    except MemoryError:
        from hookcli.errors import ResourceError
        from hookcli.render import fmt_bytes

        need = fmt_bytes(STAMP_BYTES * tree.n * plan.repeat, binary=True)
        raise ResourceError(
            f"out of memory for the timing stamps: --repeat {plan.repeat} passes of "
            f"{tree.n} module calls need about {need}; lower --repeat"
        ) from None
    m = Measured(tree=tree, probe=probe, clock=clock, hooks=hooks)
    params = list({id(p): p for p in model.parameters()}.values())
    leaves = [t for t in _leaves((args, kwargs)) if t.requires_grad]
    counter = time.perf_counter_ns
    sync = clock.synchronize
    bare: list[int] = []
    hooked: list[int] = []
    bwd: list[int] = []
    starts: list[int] = []
    bstarts: list[int] = []

    def forward(p: int, with_hooks: bool, keep: bool) -> Any:
        session.reset_attributes()  # a KV cache in attributes: each pass starts as found
        origin = None
        if with_hooks:
            hooks.begin_pass(p)
            hooks.attach()
        try:
            sync()
            if with_hooks and clock.event is not None:
                origin = clock.event()
                origin.record()
            t0 = counter()
            try:
                with grad_ctx(), autocast():
                    out = model(*args, **kwargs)
            except KeyboardInterrupt:
                raise
            except (Exception, SystemExit) as err:
                where = _open_label(hooks if with_hooks else None, tree)
                raise _run_error(err, where, "forward") from err
            sync()
            t1 = counter()
            if with_hooks:
                try:
                    hooks.end_forward()
                except Diverged as err:
                    raise RunError(
                        f"the model's module calls differ from pass to pass ({err}); "
                        "profile needs the same calls in every forward"
                    ) from None
                if origin is not None:
                    hooks.read_events(origin, t0, backward=False)
            if keep:
                (hooked if with_hooks else bare).append(t1 - t0)
                if with_hooks:
                    starts.append(t0)
            if with_hooks and plan.backward:
                backward(out, origin is not None, keep)
            return None
        finally:
            if with_hooks:
                hooks.detach()

    loss_fn = make_loss(plan.loss, prepared.inputs)

    def backward(out: Any, events: bool, keep: bool) -> None:
        loss = loss_fn(out)
        for t in params:
            t.grad = None
        for t in leaves:
            t.grad = None
        origin = None
        sync()
        if events:
            assert clock.event is not None
            origin = clock.event()
            origin.record()
        t0 = counter()
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as err:
            raise _run_error(err, None, "backward", model) from err
        sync()
        t1 = counter()
        if origin is not None:
            hooks.read_events(origin, t0, backward=True)
        if keep:
            bwd.append(t1 - t0)
            bstarts.append(t0)

    def survey_forward() -> None:
        session.reset_attributes()
        try:
            with grad_ctx(), autocast():
                model(*args, **kwargs)
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as err:
            raise _run_error(err, None, "forward") from err

    bar = _Progress(plan.progress, plan.repeat)
    with HookSession(model, [], mode=Mode(prepared.settings["mode"]), backward=plan.backward,
                     only=(), grad=plan.backward) as session:  # fmt: skip
        try:
            if plan.backward:
                hooks.survey(lambda: survey_forward())  # which modules need tensor hooks
            for _ in range(plan.warmup):
                forward(0, False, keep=False)
                forward(0, True, keep=False)
            if prepared.settings["device"].startswith("cuda"):
                session.reset_attributes()
                m.memory = _memory_pass(model, modules, tree, args, kwargs, grad_ctx, MemoryHooks)
            began = counter()
            for r in range(plan.repeat):
                order = (False, True) if r % 2 == 0 else (True, False)
                for with_hooks in order:
                    forward(r, with_hooks, keep=True)
                bar.update(r + 1, (counter() - began) / 1e9 / (r + 1))
        finally:
            bar.close()
            for t in params:
                t.grad = None
    m.bare_ns, m.hooked_ns, m.backward_ns = tuple(bare), tuple(hooked), tuple(bwd)
    m.pass_starts, m.backward_starts = tuple(starts), tuple(bstarts)
    m.timings = Timings(
        tree,
        plan.repeat,
        hooks.starts,
        hooks.ends,
        hooks.bwd_starts if plan.backward else None,
        hooks.bwd_ends if plan.backward else None,
        hooks.bwd_ok if plan.backward else None,
    )
    return m


def _leaves(value: Any) -> Iterator[Any]:
    from hookcli.structures import iter_tensors

    yield from iter_tensors(value)


def _memory_pass(
    model: nn.Module,
    modules: list[nn.Module],
    tree: CallTree,
    args: Any,
    kwargs: Any,
    grad_ctx: Callable[[], Any],
    memory_hooks: Any,
) -> list[int]:
    """One forward with the memory hooks: per module, the largest peak above a call's start."""
    import torch

    from hookcli.amp import autocast

    dev = next((p.device for p in model.parameters()), torch.device("cuda"))
    mem = memory_hooks(
        modules,
        tree,
        allocated=lambda: torch.cuda.memory_allocated(dev),
        peak=lambda: torch.cuda.max_memory_allocated(dev),
        reset_peak=lambda: torch.cuda.reset_peak_memory_stats(dev),
    )
    mem.attach()
    try:
        with grad_ctx(), autocast():
            model(*args, **kwargs)
    finally:
        mem.detach()
    result: list[int] = mem.per_module()
    return result


# -- the report ----------------------------------------------------------------------------------


def _median(values: Sequence[int]) -> Spread | None:
    return spread(values) if values else None


def module_rows(m: Measured, backward: bool) -> list[tuple[int, dict[str, Any]]]:
    """(slot, JSON row) per module, in first-call order."""
    t = m.timings
    assert t is not None
    tree = m.tree
    flops_of = [m.probe.call_cost(i) for i in range(tree.n)]
    root = spread(t.per_pass(t.incl, 0)).median
    out = []
    for slot, calls in enumerate(tree.slot_calls):
        first = calls[0]
        fwd = spread(t.per_pass(t.incl, slot))
        own = spread(t.per_pass(t.self_, slot))
        flops = sum(flops_of[i].flops for i in calls)
        row: dict[str, Any] = {
            "name": tree.names[first],
            "type": tree.types[first],
            "depth": tree.depths[first],
            "calls": len(calls),
            "forward_ms": round(fwd.median, 6),
            "forward_iqr_ms": round(fwd.iqr, 6),
            "forward_min_ms": round(fwd.low, 6),
            "forward_max_ms": round(fwd.high, 6),
            "forward_self_ms": round(own.median, 6),
            "forward_pct": round(100.0 * fwd.median / root, 3) if root > 0 else None,
            "forward_self_pct": round(100.0 * own.median / root, 3) if root > 0 else None,
            "flops": flops,
            "flops_per_s": flops / (fwd.median / 1e3) if fwd.median > 0 and flops else None,
        }
        if backward:
            b = t.per_pass_opt(t.bwd_incl, slot)
            bs = t.per_pass_opt(t.bwd_self, slot)
            bsp = spread(b) if b is not None else None
            bflops = sum(flops_of[i].backward_flops or 0 for i in calls)
            row["backward_ms"] = round(bsp.median, 6) if bsp else None
            if bsp is None and m.hooks is not None:
                row["backward_why"] = m.hooks.why_not(slot)  # never a bare "-"
            elif bsp is not None and bs is None:
                row["backward_self_why"] = "a call inside it has no backward time"
            row["backward_iqr_ms"] = round(bsp.iqr, 6) if bsp else None
            row["backward_self_ms"] = round(spread(bs).median, 6) if bs is not None else None
            row["backward_flops"] = bflops
            row["backward_flops_per_s"] = (
                bflops / (bsp.median / 1e3) if bsp and bsp.median > 0 and bflops else None
            )
        else:
            row["backward_ms"] = None
        row["memory_bytes"] = m.memory[slot] if m.memory is not None else None
        out.append((slot, row))
    return out


_SORT_KEYS: dict[SortKey, Callable[[dict[str, Any]], float]] = {
    SortKey.SELF: lambda r: r["forward_self_ms"],
    SortKey.INCLUSIVE: lambda r: r["forward_ms"],
    SortKey.CALLS: lambda r: r["calls"],
    SortKey.FLOPS: lambda r: r["flops"],
}


def _checks(rows: Sequence[dict[str, Any]], gates: Sequence[tuple[str, float]]) -> list[Any]:
    from hookcli.globs import name_matches
    from hookcli.report import CheckResult

    out = []
    for glob, limit in gates:
        hit = [r for r in rows if name_matches(r["name"], glob, type_name=r["type"])]
        over = [r for r in hit if r["forward_ms"] > limit]
        if not hit:
            detail = f"{glob}: no module matches (a typo?), so nothing was checked"
        elif over:
            worst = max(over, key=lambda r: r["forward_ms"])
            detail = (
                f"{len(over)} of {len(hit)} module(s) matching {glob} over {limit:g} ms "
                f"(median forward); worst {worst['name'] or '(root)'} {worst['forward_ms']:.3f} ms"
            )
        else:
            top = max(r["forward_ms"] for r in hit)
            detail = f"{len(hit)} module(s) matching {glob} <= {limit:g} ms (max {top:.3f} ms)"
        out.append(
            CheckResult(
                f"max-ms {glob}",
                bool(hit) and not over,
                detail,
                tuple(r["name"] or "(root)" for r in over),
            )
        )
    return out


def build_report(
    prepared: Prepared, plan: ProfilePlan, m: Measured | None, error: RunError | None
) -> Report:
    """The profile report: one row per module, sorted by ``plan.sort``."""
    from hookcli.profile import render as prender
    from hookcli.report import Row

    settings = {
        **prepared.settings,
        "backward": plan.backward,
        "warmup": plan.warmup,
        "repeat": plan.repeat,
        "timer": m.clock.name if m else None,
        "sort": plan.sort.value,
    }
    if plan.backward:
        settings["loss"] = plan.loss.value
    if m is None or m.timings is None:
        return prepared.report(
            "profile",
            settings,
            lists={"modules": ()},
            primary="modules",
            error=error.message if error else None,
            columns=tuple(prender.columns(plan.backward, False)),
        )
    from hookcli.profile.rows import table_rows

    pairs = module_rows(m, plan.backward)
    types = {name: type(mod).__name__ for name, mod in prepared.model.named_modules()}
    # container rows (ModuleList, ...) and, under --depth, self time folded into the cut
    all_rows = table_rows(
        m, [r for _, r in pairs], backward=plan.backward, depth=plan.depth, types=types
    )
    shown = [r for r in all_rows if plan.depth is None or r["depth"] <= plan.depth]
    key = _SORT_KEYS[plan.sort]
    order = sorted(range(len(shown)), key=lambda k: (-key(shown[k]), k))
    rows = tuple(Row.of(shown[k], {"depth": 0}) for k in order)
    totals = _totals(m, plan)
    checks = tuple(_checks(all_rows, plan.max_ms)) if error is None else ()
    return prepared.report(
        "profile",
        settings,
        totals=totals,
        checks=checks,
        lists={"modules": rows},
        primary="modules",
        notes=tuple(prender.notes(plan, m.clock.name, all_rows)),
        error=error.message if error else None,
        columns=tuple(prender.columns(plan.backward, m.memory is not None)),
        table_totals=tuple(prender.totals_lines(totals)),
    )


def _totals(m: Measured, plan: ProfilePlan) -> dict[str, Any]:
    t = m.timings
    assert t is not None
    root = spread(t.per_pass(t.incl, 0))
    bare, hooked = spread(m.bare_ns), spread(m.hooked_ns)
    bwd = _median(m.backward_ns)
    flops = m.probe.total_flops()
    out: dict[str, Any] = {
        "forward_ms": round(root.median, 6),
        "forward_iqr_ms": round(root.iqr, 6),
        "backward_ms": round(bwd.median, 6) if bwd else None,
        "backward_iqr_ms": round(bwd.iqr, 6) if bwd else None,
        "bare_forward_ms": round(bare.median, 6),
        "profiled_forward_ms": round(hooked.median, 6),
        **overhead(m.bare_ns, m.hooked_ns),
        "flops": flops,
        "flops_per_s": flops / (root.median / 1e3) if root.median > 0 and flops else None,
        "calls": m.tree.n,
        "modules": len(m.tree.slot_calls),
    }
    if plan.backward:
        bflops = m.probe.total_backward_flops() or 0
        out["backward_flops"] = bflops
        out["backward_flops_per_s"] = bflops / (bwd.median / 1e3) if bwd and bflops else None
    return out


def collect(prepared: Prepared, plan: ProfilePlan) -> tuple[Measured | None, RunError | None]:
    """The counting pass, then the timed passes. A model failure is returned, not raised."""
    from hookcli.cost.runner import measure
    from hookcli.profile.clocks import make_clock

    device = prepared.settings["device"]
    if device == "meta":  # the CLI refuses it before the build; a live model can be on meta
        raise UsageError(META_REFUSED)
    mode = Mode(prepared.settings["mode"])
    probe, records, error = measure(prepared, mode=mode, backward=plan.backward, loss=plan.loss)
    if error is not None:
        return None, error
    if not records:
        raise UsageError("profile: no module call ran (is forward a module call?)")
    tree = call_tree(probe, records)
    clock = make_clock(device, plan.sync)
    try:
        return time_passes(prepared, plan, tree, probe, clock), None
    except RunError as err:
        return None, err


def run_profile(prepared: Prepared, plan: ProfilePlan) -> tuple[Report, RunError | None]:
    """Profile a prepared model; write --trace-out and --plot; build the report."""
    m, error = collect(prepared, plan)
    report = build_report(prepared, plan, m, error)
    if m is not None and m.timings is not None:
        if plan.trace_out is not None:
            from hookcli.profile.trace import write_trace

            write_trace(plan.trace_out, m, title=_title(prepared))
        if plan.plot is not None:
            from hookcli.profile.render import plot_top

            plot_top(report, plan.plot, plan.top, _title(prepared))
    return report, error


def _title(prepared: Prepared) -> str:
    info = prepared.model_info()
    return f"hookcli profile {info.get('spec') or info.get('class')}"


def cli_command(
    *,
    backward: bool,
    loss: str | None,
    warmup: int,
    repeat: int,
    sync: bool,
    sort: Any,
    depth: int | None,
    trace_out: Path | None,
    plot: Path | None,
    max_ms: list[str] | None,
    **common: Unpack[RunArgs],
) -> int:
    """The profile command's run (``hookcli profile``): plan, build, time, emit."""
    import sys

    from hookcli.commandargs import command_options
    from hookcli.pipeline import emit_outcome, prepare

    plan = plan_profile(
        backward, warmup, repeat, sort, max_ms, sync, depth, trace_out, plot,
        progress=sys.stderr.isatty(), loss=loss,
    )  # fmt: skip
    if common["device"] == "meta":  # before the model is built (parse_device took the rest)
        raise UsageError(META_REFUSED)
    mopts, ropts, out = command_options(common, Mode.EVAL, depth)
    return emit_outcome(*run_profile(prepare(mopts, ropts), plan), out)
