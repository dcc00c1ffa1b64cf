"""The launch a command's runner takes: ``Local``, ``Ddp`` (ddp.py) or ``Fsdp`` (fsdp.py).

A strategy builds the model for this process, runs the hook session on it (wrapped
as the launch wraps it), and brings what each rank found to rank 0 (``gather``). It
adds what only the launch knows to the merged report: the ``ranks`` column, shard
sizes, the desync check and its settings and notes. The command's runner alone turns
its findings into rows, totals and checks; a new launch is one more class here.

    runner(prepared, plan, launch) -> Outcome on rank 0 (and Local), None on the others
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from hookcli.errors import HookcliError, RunError, UsageError, first_line

if TYPE_CHECKING:
    from typing import Unpack

    import torch

    from hookcli.distributed.launch import DistContext
    from hookcli.distributed.ranks import Divergence, RankRows
    from hookcli.options import Mode, ModelOptions, OutputOptions, RunOptions
    from hookcli.pipeline import Outcome, Prepared
    from hookcli.report import CheckResult, Column, Report, Row
    from hookcli.session import CallRecord, HookSession, Probe

    Runner = Callable[[Prepared, "Launch"], Outcome | None]

T = TypeVar("T")
DESYNC = "desync"


class SessionHow(TypedDict):
    """How a launch's session runs (``Launch.session``): the module ``mode``, whether a
    ``backward`` runs for the backward hooks, the ``loss_fn`` of the output, and whether
    to ``compare`` the ranks' tensors against rank 0's."""

    mode: Mode
    backward: bool
    loss_fn: Callable[[Any], torch.Tensor]
    compare: bool


def check_wrapped_options(
    flag: str, wrapper: str, global_hooks: bool, refused: Sequence[str] = ()
) -> None:
    """Options that no launch wrapping the model takes (``flag``: ``--ddp``, ``--fsdp``):
    --global-hooks, and the command's own ``refused`` ones that were given (``--plot``);
    exit 2 before any rank starts its group."""
    if global_hooks:
        raise UsageError(
            f"--global-hooks does not combine with {flag} (it would hook {wrapper} itself)"
        )
    if refused:
        raise UsageError(f"{refused[0]} does not combine with {flag}")


def forward_loss(
    session: HookSession,
    prepared: Prepared,
    loss_fn: Callable[[Any], torch.Tensor],
    fix: Callable[[HookcliError], HookcliError] = lambda err: err,
) -> tuple[torch.Tensor | None, HookcliError | None]:
    """One forward of the prepared inputs on a rank, then the loss where a backward is
    needed; an error is returned (``fix`` rewrites hookcli's own), not raised, so that
    the rank can tell the others rather than leave them waiting."""
    assert prepared.inputs is not None
    args, kwargs = prepared.inputs.args, dict(prepared.inputs.kwargs)
    try:
        output = session.forward(args, kwargs)
        return (loss_fn(output) if session.backward_needed else None), None
    except HookcliError as err:
        return None, fix(err)
    except Exception as err:  # the loss
        return None, RunError(f"the loss could not be computed: {first_line(err)}")


@dataclass(frozen=True)
class RankFindings:
    """What rank r sends to rank 0: its rows, local checks, totals and what it compared."""

    rank: int
    loss: float | None
    rows: RankRows
    checks: tuple[CheckResult, ...] = ()
    totals: Mapping[str, Any] = field(default_factory=dict)
    divergences: tuple[Divergence, ...] = ()
    shards: tuple[Any, ...] = ()  # FSDP: this rank's ParamShard per managed parameter
    extra: Mapping[str, Any] = field(default_factory=dict)  # the command's own figures


@dataclass(frozen=True)
class LocalRun:
    """What a single-process session saw."""

    records: tuple[CallRecord, ...]
    loss: float | None
    error: Any  # RunError | None
    divergences: tuple[Divergence, ...] = ()
    skipped: str | None = None


class Launch:
    """What every strategy answers; ``Local``'s answers are the single-process ones."""

    name = "local"
    distributed = False
    rank = 0

    def loss_fn(self, loss: Any, inputs: Any) -> Any:
        """The loss of a run: ``--loss`` reduced over the outputs, on every rank."""
        from hookcli.losses import reduce_output

        return lambda output: reduce_output(output, loss)

    def session(
        self, prepared: Prepared, probes: Sequence[Probe], **how: Unpack[SessionHow]
    ) -> Any:
        """One forward (and backward) with the probes' hooks on the model as launched
        (``how``: ``SessionHow``). The run has ``records``, ``loss``, ``error``,
        ``divergences`` and ``skipped`` (why a backward did not run).
        """
        raise NotImplementedError

    def step(self, stage: str, fn: Callable[[], T]) -> T:
        """Run one stage of the command (on every rank, they agree that it went well)."""
        return fn()

    def gather(self, mine: Any) -> list[Any] | None:
        """Every rank's findings on rank 0 (in rank order), None on the others."""
        return [mine]

    def rank_rows(
        self, rows: Sequence[Row], run: Any, extra: Callable[[Row], dict[str, Any]] | None = None
    ) -> RankRows:
        """This rank's rows as they travel, with the launch's and the command's extra keys."""
        from hookcli.distributed.ranks import RankRows

        fix = self.row_fix(run)

        def data(r: Row) -> dict[str, Any]:
            return {**dict(r.data), **fix(r), **(extra(r) if extra else {})}

        return RankRows(self.rank, tuple((data(r), dict(r.display)) for r in rows))

    def row_fix(self, run: Any) -> Callable[[Row], dict[str, Any]]:
        return lambda row: {}

    def merge_rows(
        self, gathered: Sequence[RankFindings], model: Any, per_rank_keys: Sequence[str] = ()
    ) -> tuple[Row, ...]:
        """Rank 0's rows, then those only other ranks ran (``ranks.merge_rows``)."""
        from hookcli.distributed.ranks import merge_rows

        return merge_rows([g.rows for g in gathered], per_rank_keys=per_rank_keys)

    def shards(self, run: Any) -> tuple[Any, ...]:
        """This rank's share of each parameter (FSDP's ``ParamShard``s), for ``RankFindings``."""
        return ()

    def shard_totals(self, gathered: Sequence[RankFindings]) -> dict[str, Any]:
        return {}

    def columns(self) -> list[Column]:
        """The launch's columns after the shapes: ``ranks`` (and shard sizes)."""
        from hookcli.distributed.ranks import fmt_ranks
        from hookcli.report import Column

        return [Column("ranks", "Ranks", fmt_ranks)]

    def model_info(self, prepared: Prepared, run: Any) -> dict[str, Any]:
        return dict(prepared.model_info())

    def finish(self, report: Report, error: Any, out: OutputOptions) -> int:
        """Write the report (rank 0), then raise the run's error: the exit status."""
        from hookcli.pipeline import emit_outcome

        return emit_outcome(report, error, out)


class Local(Launch):
    """One process: the model as built, the session as ``pipeline.run_session`` runs it."""

    def __init__(self, global_hooks: bool = False) -> None:
        self.global_hooks = global_hooks

    def loss_fn(self, loss: Any, inputs: Any) -> Any:
        """``make_loss``: ``--loss`` with the inputs' labels and ``fn:`` functions."""
        from hookcli.losses import make_loss

        return make_loss(loss, inputs)

    def session(
        self, prepared: Prepared, probes: Sequence[Probe], **how: Unpack[SessionHow]
    ) -> LocalRun:
        from hookcli.pipeline import run_session

        # one process: nothing to compare with
        outcome = run_session(
            prepared,
            probes,
            global_hooks=self.global_hooks,
            mode=how["mode"],
            backward=how["backward"],
            loss_fn=how["loss_fn"],
        )
        return LocalRun(outcome.records, outcome.loss, outcome.error)


class Ranks(Launch):
    """What DDP and FSDP share: the rank's context, its model, the gather."""

    distributed = True

    def __init__(self, ctx: Any, desync_tol: float) -> None:
        self.ctx = ctx
        self.desync_tol = desync_tol

    @property
    def rank(self) -> int:  # type: ignore[override]
        return int(self.ctx.rank)

    def prepare(self, mopts: ModelOptions, ropts: RunOptions, allow_meta: bool = False) -> Any:
        return self.ctx.step(
            "building the model", lambda: prepare_rank(self.ctx, mopts, ropts, allow_meta)
        )

    def settings(
        self,
        prepared: Prepared,
        run: Any,
        extra: Mapping[str, Any] | None = None,
        desync: bool = False,
    ) -> dict[str, Any]:
        """The report's settings: the launch's, the command's ``extra``, then (``desync``)
        the tolerance of the desync check and what the launch says with it."""
        settings = {**self.base_settings(prepared, run), **(extra or {})}
        if desync:
            settings["desync_tolerance"] = self.desync_tol
            settings.update(self.desync_settings(run))
        return settings

    def base_settings(self, prepared: Prepared, run: Any) -> dict[str, Any]:
        raise NotImplementedError

    def desync_settings(self, run: Any) -> dict[str, Any]:
        return {}

    def step(self, stage: str, fn: Callable[[], T]) -> T:
        result: T = self.ctx.step(stage, fn)
        return result

    def gather(self, mine: Any) -> list[Any] | None:
        result: list[Any] | None = self.ctx.gather(mine)
        return result

    def run(
        self,
        mopts: ModelOptions,
        ropts: RunOptions,
        out: OutputOptions,
        runner: Runner,
        after: Callable[[Report], None] | None = None,
        allow_meta: bool = False,
    ) -> int:
        """This rank's command: build, run, and on rank 0 merge and write the report."""
        outcome = runner(self.prepare(mopts, ropts, allow_meta), self)
        if outcome is None:
            return 0
        report, error = outcome
        code = self.finish(report, error, out)
        if after is not None:
            after(report)
        return code


def prepare_rank(
    ctx: DistContext, mopts: ModelOptions, ropts: RunOptions, allow_meta: bool = False
) -> Prepared:
    """The model built with ``--seed`` (as on every rank); inputs drawn with seed + rank."""
    from hookcli.distributed.launch import redraw_inputs
    from hookcli.pipeline import Prepared, build_model, prepare

    if ctx.device == "meta" and not allow_meta:
        raise UsageError(
            "--ddp/--fsdp need real tensors: --device meta only gives shapes (cost takes meta)"
        )
    if ctx.device == "meta":  # cost --fsdp: built on meta, never on the CPU (a 7B model)
        import torch

        loaded = build_model(mopts, torch.device("meta"))
    else:
        loaded = build_model(mopts)
    input_seed = mopts.seed + ctx.rank
    rank_mopts = dataclasses.replace(mopts, seed=input_seed)
    prepared = prepare(rank_mopts, dataclasses.replace(ropts, device=ctx.device), loaded=loaded)
    inputs = prepared.inputs
    assert inputs is not None
    if inputs.source == "example_input_array" and ctx.device != "meta":  # redraw per rank
        args, kwargs = redraw_inputs(inputs.args, inputs.kwargs, input_seed)
        inputs = dataclasses.replace(inputs, args=args, kwargs=kwargs)
    settings = {
        **prepared.settings,
        "seed": mopts.seed,
        "input_seed": "seed + rank",
        "ddp": True,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "launcher": ctx.env.source,
    }
    return Prepared(loaded=prepared.loaded, inputs=inputs, settings=settings)
