"""``grads`` on every rank (``--ddp``, ``--fsdp``): each rank's gradients, merged on rank 0.

``run_grads`` hands a distributed launch here. Each rank runs the session the launch
wraps, measures its gradients before the reduction (DDP: a tensor hook per parameter;
FSDP2: a hook on each unsharded parameter) and after it, and sends them to rank 0,
which builds the rows (local grad norm per rank, the spread, the reduced norm, the
parameters with no grad per rank, FSDP's shard sizes), the totals and the checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hookcli.options import HookKind, Mode

# ``plan``: the runner's GradsPlan (typed Any here: grads.runner imports this module)

if TYPE_CHECKING:
    from hookcli.distributed.ranks import Divergence, RankRows
    from hookcli.pipeline import Outcome, Prepared
    from hookcli.report import CheckResult, Column, Row

DESYNC = "desync"


@dataclass(frozen=True)
class GradsRank:
    """What rank r sends to rank 0 in ``grads --ddp``/``--fsdp``."""

    rank: int
    loss: float | None
    rows: RankRows
    checks: tuple[CheckResult, ...]
    unused: tuple[str, ...]  # trainable parameters with no local grad on this rank
    unused_indices: tuple[int, ...]  # their DDP indices (among the trainable parameters)
    grad_norm: float | None  # total, before the reduction
    reduced_grad_norm: float | None  # total, after it
    divergences: tuple[Divergence, ...]
    shards: tuple[Any, ...] = ()  # FSDP: ParamShard per managed parameter
    shard_grad_norm: float | None = None  # FSDP: this rank's shard's total, after it
    module_grad_norm: Mapping[str, float | None] = field(default_factory=dict)  # DDP
    module_unused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # DDP


def merged_grads(prepared: Prepared, plan: Any, launch: Any) -> Outcome | None:
    """``grads`` on this rank; rank 0 merges every rank's and gets the report."""
    from hookcli.layers import layer_rows

    fsdp = launch.name == "fsdp"
    probe = _fsdp_probe(plan) if fsdp else _ddp_probe(plan)
    run = launch.session(
        prepared,
        [probe],
        mode=Mode(prepared.settings["mode"]),
        backward=True,
        loss_fn=launch.loss_fn(plan.loss, prepared.inputs),
        compare=True,
    )
    model = prepared.model
    rows, _ = layer_rows(run.records, model, depth=plan.depth, kinds=plan.kinds, probes=[probe])
    rank = _fsdp_rank if fsdp else _ddp_rank
    mine = rank(launch, run, probe, plan, rows, model)
    ranks = launch.gather(mine)
    if ranks is None:
        return None
    return _report(prepared, plan, launch, run, probe, ranks)


# -- one rank ---------------------------------------------------------------------------------


def _ddp_probe(plan: Any) -> Any:
    from hookcli.grads.probe import GradProbe

    return GradProbe(
        frozenset(plan.kinds),
        output_hooks=plan.explicit and HookKind.TENSOR in plan.kinds,
        watch_forward=bool({"nan", "inf", "dead"} & set(plan.gates.fail_on)),
        flag_inf="inf" in plan.gates.fail_on,
    )


def _fsdp_probe(plan: Any) -> Any:
    """GradProbe without its per-parameter figures (a DTensor's norm is a collective)."""
    from hookcli.grads.probe import GradProbe

    class CallGradProbe(GradProbe):
        def attach(self, session: Any) -> None:
            super().attach(session)
            self._params = []  # the shards' figures come from the FSDP session

    return CallGradProbe(
        frozenset(k for k in plan.kinds if k is not HookKind.TENSOR),
        output_hooks=False,
        watch_forward=bool({"nan", "inf"} & set(plan.gates.fail_on)),
        flag_inf="inf" in plan.gates.fail_on,
    )


def _ddp_rank(
    launch: Any, run: Any, probe: Any, plan: Any, rows: Sequence[Row], model: Any
) -> GradsRank:
    from hookcli.distributed.ranks import l2
    from hookcli.grads.checks import GradGates, run_checks

    findings = probe.findings
    assert findings is not None
    gates = plan.gates
    local_gates = GradGates(
        tuple(n for n in gates.fail_on if n not in ("unused", DESYNC)),
        gates.max_grad_norm,
        gates.min_grad_norm,
    )
    checks = run_checks(local_gates, findings, run.records, run.loss)
    # No grad on this rank: the tensor hook never fired (after the all-reduce, .grad is
    # set wherever any rank produced one, so .grad cannot tell).
    unused = [pg.name for pg in findings.params if pg.requires_grad and pg.grad_norm is None]
    trainable = [pg.name for pg in findings.params if pg.requires_grad]
    unused_set = set(unused)
    modules = dict(model.named_modules())
    own = {name: findings.module_params.get(id(m), ()) for name, m in modules.items()}

    def extra(row: Row) -> dict[str, Any]:
        names = own.get(str(row.data["name"]), ())
        return {
            "reduced_grad_norm": l2([run.reduced.get(n) for n in names]) if names else None,
            "unused_params": [n for n in names if n in unused_set],
        }

    return GradsRank(
        rank=launch.rank,
        loss=run.loss,
        rows=launch.rank_rows(rows, run, extra),
        checks=checks,
        unused=tuple(unused),
        unused_indices=tuple(trainable.index(n) for n in unused),
        grad_norm=findings.total_grad_norm,
        reduced_grad_norm=l2(list(run.reduced.values())),
        divergences=run.divergences,
        module_grad_norm={
            name: findings.modules[id(m)].grad_norm
            for name, m in modules.items()
            if id(m) in findings.modules
        },
        module_unused={
            name: tuple(n for n in names if n in unused_set) for name, names in own.items() if names
        },
    )


def _fsdp_rank(
    launch: Any, run: Any, probe: Any, plan: Any, rows: Sequence[Row], model: Any
) -> GradsRank:
    from hookcli.distributed.fsdp import own_params
    from hookcli.distributed.ranks import l2

    fail_on = plan.gates.fail_on
    checks = tuple(_nonfinite_check(n, run, probe.findings) for n in fail_on if n in ("nan", "inf"))
    own = own_params(model)
    by_name = {p.name: p for p in run.params}

    def extra(row: Row) -> dict[str, Any]:
        names = own.get(str(row.data["name"]), ())
        return {"unsharded_shapes": [list(by_name[n].shape) for n in names if n in by_name]}

    # DDP's indices: positions among the model's trainable parameters, in model order
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    return GradsRank(
        rank=launch.rank,
        loss=run.loss,
        rows=launch.rank_rows(rows, run, extra),
        checks=checks,
        unused=run.unused,
        unused_indices=tuple(trainable.index(n) for n in run.unused),
        grad_norm=l2([p.local_grad_norm for p in run.params]),
        reduced_grad_norm=run.reduced_total,
        divergences=run.divergences,
        shards=run.params,
        shard_grad_norm=l2([p.shard_grad_norm for p in run.params]),
    )


def _nonfinite_check(name: str, run: Any, findings: Any) -> CheckResult:
    """NaN (Inf) in this rank's loss, its local gradients before the reduce-scatter, or outputs."""
    from hookcli.checks import layer_label
    from hookcli.report import CheckResult

    k = 0 if name == "nan" else 1
    what = "NaN" if name == "nan" else "Inf"
    bad = [p.name for p in run.params if p.local_nonfinite[k]]
    outs: list[str] = []
    if findings is not None and findings.watched_forward:
        for r in run.records:
            call = findings.calls.get(r.index)
            if call is not None and (call.output_nan if k == 0 else call.output_inf):
                outs.append(layer_label(r.name, r.call))
    loss_bad = run.loss is not None and (math.isnan(run.loss) if k == 0 else math.isinf(run.loss))
    if not bad and not outs and not loss_bad:
        return CheckResult(name, True, f"no {what} in any gradient or output; the loss is finite")
    parts = []
    if outs:
        parts.append(f"{what} first in the output of {outs[0]}")
    if bad:
        parts.append(f"{what} in the local gradients of {', '.join(bad[:3])}")
    if loss_bad:
        parts.append(f"the loss is {run.loss}")
    return CheckResult(name, False, "; ".join(parts), tuple(dict.fromkeys([*outs, *bad])))


# -- rank 0 -----------------------------------------------------------------------------------


def _report(
    prepared: Prepared,
    plan: Any,
    launch: Any,
    run: Any,
    probe: Any,
    ranks: Sequence[GradsRank],
) -> Outcome:
    from hookcli.distributed.ranks import fmt_per_rank, fmt_unused_per_rank, merge_checks, spread
    from hookcli.layers import PARAM_COLUMNS, shape_columns
    from hookcli.modelinfo import totals
    from hookcli.render import fmt_bytes, fmt_float, fmt_int
    from hookcli.report import Column, Report

    fsdp = launch.name == "fsdp"
    merged = launch.merge_rows(ranks, prepared.model) if fsdp else _ddp_rows(launch, ranks)
    rows = tuple(_fsdp_row(row, prepared.model, ranks) for row in merged) if fsdp else merged
    by_name = {c.name: c for c in merge_checks([r.checks for r in ranks])}
    divergences = [d for r in ranks for d in r.divergences]
    ordered: list[CheckResult] = []
    for name in plan.gates.fail_on:
        if name == "unused":
            ordered.append(_unused_check(ranks, run, fsdp))
        elif name == DESYNC:
            ordered.append(launch.desync_check(divergences, run, None))
        elif name in by_name:
            ordered.append(by_name.pop(name))
    ordered.extend(by_name.values())  # the norm bounds (DDP)
    model_totals: dict[str, Any] = dict(totals(prepared.model))
    if not fsdp:
        model_totals.update(probe.totals())
    unused_any: list[str] = []
    for r in ranks:
        unused_any.extend(n for n in r.unused if n not in unused_any)
    model_totals.update(
        {
            "loss": ranks[0].loss,
            "loss_per_rank": [r.loss for r in ranks],
            "grad_norm": ranks[0].grad_norm,
            "grad_norm_per_rank": [r.grad_norm for r in ranks],
            "grad_norm_spread": spread([r.grad_norm for r in ranks]),
        }
    )
    if fsdp:
        model_totals["shard_grad_norm_per_rank"] = [r.shard_grad_norm for r in ranks]
    model_totals["reduced_grad_norm"] = ranks[0].reduced_grad_norm
    model_totals.update(launch.shard_totals(ranks))
    model_totals["unused_params"] = unused_any
    model_totals["unused_params_per_rank"] = [list(r.unused) for r in ranks]
    model_totals.update(launch.desync_totals(divergences, run))
    per_rank = fmt_per_rank(fmt_float)
    if fsdp:
        shard_params = model_totals["shard_params_per_rank"]
        shard_bytes = model_totals["shard_param_bytes_per_rank"]
        columns: list[Column] = [
            *[c for c in shape_columns(plan.kinds) if c.key != "input_shapes"],
            *launch.columns(),
            Column("grad_norm_per_rank", "Local grad norm per rank", per_rank, "right"),
            Column("shard_grad_norm_per_rank", "Shard grad norm per rank", per_rank, "right"),
            Column("reduced_grad_norm", "Reduced grad norm", fmt_float, "right"),
            Column("unused_params_per_rank", "Unused (per rank)", fmt_unused_per_rank),
            PARAM_COLUMNS[0],
        ]
        table_totals = [
            ("Total params (unsharded)", fmt_int(model_totals["params"])),
            (
                "Shard params per rank",
                " | ".join(
                    f"{fmt_int(n)} ({fmt_bytes(b, binary=True)})"
                    for n, b in zip(shard_params, shard_bytes, strict=True)
                ),
            ),
        ]
    else:
        columns, table_totals = _ddp_layout(launch, plan, probe, model_totals)
    table_totals += [
        ("Loss per rank", per_rank(model_totals["loss_per_rank"])),
        ("Local grad norm per rank", per_rank(model_totals["grad_norm_per_rank"])),
    ]
    if fsdp:
        shard_norms = per_rank(model_totals["shard_grad_norm_per_rank"])
        table_totals.append(("Shard grad norm per rank", shard_norms))
    table_totals.append(("Reduced grad norm", fmt_float(model_totals["reduced_grad_norm"])))
    for rank, names in enumerate(model_totals["unused_params_per_rank"]):
        if names:
            table_totals.append((f"No grad on rank {rank}", ", ".join(names)))
    report = Report(
        command="grads",
        model=launch.model_info(prepared, run),
        settings=launch.settings(prepared, run, {"loss": plan.loss.value}, desync=True),
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=model_totals,
        checks=tuple(ordered),
        lists={"shards": _shard_rows(ranks)} if fsdp else {},
        notes=launch.notes(run, model_totals),
        columns=tuple(columns),
        table_totals=tuple(table_totals),
    )
    return report, None


def _unused_check(ranks: Sequence[GradsRank], run: Any, fsdp: bool) -> CheckResult:
    from hookcli.distributed.ranks import unused_check

    unused = [r.unused for r in ranks]
    indices = [r.unused_indices for r in ranks]
    if not fsdp:
        return unused_check(unused, indices)
    why = (
        "FSDP2 pairs the ranks' reduce-scatters by order: it would hang, fail or mix gradients"
        if run.skipped
        else "every rank agrees, so FSDP2 reduces the others"
    )
    return unused_check(unused, indices, why=why)


def _ddp_rows(launch: Any, ranks: Sequence[GradsRank]) -> tuple[Row, ...]:
    """Each rank's figures for the row's module, also from ranks where it did not run."""
    from hookcli.distributed.ranks import spread
    from hookcli.report import Row

    out = []
    for row in launch.merge_rows(ranks, None):
        name = str(row.data["name"])
        data = dict(row.data)
        per_rank = [r.module_grad_norm.get(name) for r in ranks]
        unused = [list(r.module_unused.get(name, ())) for r in ranks]
        data["grad_norm_per_rank"] = per_rank
        data["grad_norm_spread"] = spread(per_rank)
        data["unused_params"] = list(dict.fromkeys(n for names in unused for n in names))
        data["unused_params_per_rank"] = unused
        out.append(Row.of(data, row.display))
    return tuple(out)


def _ddp_layout(
    launch: Any, plan: Any, probe: Any, model_totals: Mapping[str, Any]
) -> tuple[list[Column], list[tuple[str, str]]]:
    from hookcli.distributed.ranks import fmt_per_rank, fmt_unused_per_rank
    from hookcli.layers import PARAM_COLUMNS, param_totals, shape_columns
    from hookcli.render import fmt_float, fmt_pct
    from hookcli.report import Column

    skip = {"grad_norm", "weight_norm", "grad_weight_ratio", "unused_params"}
    columns: list[Column] = [
        *shape_columns(plan.kinds),
        *launch.columns(),
        Column("grad_norm_per_rank", "Local grad norm per rank", fmt_per_rank(fmt_float), "right"),
        Column("reduced_grad_norm", "Reduced grad norm", fmt_float, "right"),
        Column("grad_norm_spread", "Spread", fmt_pct, "right"),
        *[c for c in probe.table_columns if c.key not in skip],
        Column("unused_params_per_rank", "Unused (per rank)", fmt_unused_per_rank),
        PARAM_COLUMNS[0],
    ]
    return columns, list(param_totals(dict(model_totals), 0)[:1])


def _fsdp_row(row: Row, model: Any, ranks: Sequence[GradsRank]) -> Row:
    """The row's own parameters' grad norms per rank (before and after the reduce-scatter)."""
    from hookcli.distributed.fsdp import own_params
    from hookcli.distributed.ranks import l2, spread
    from hookcli.report import Row

    params = [{p.name: p for p in r.shards} for r in ranks]
    unused = [set(r.unused) for r in ranks]
    data = dict(row.data)
    names = [n for n in own_params(model).get(str(data["name"]), ()) if n in params[0]]
    mine = [[ps[n] for n in names] for ps in params]
    if names:
        data["grad_norm_per_rank"] = [l2([p.local_grad_norm for p in m]) for m in mine]
        data["shard_grad_norm_per_rank"] = [l2([p.shard_grad_norm for p in m]) for m in mine]
        data["reduced_grad_norm"] = l2([p.reduced_grad_norm for p in mine[0]])
    else:
        data["grad_norm_per_rank"] = data["shard_grad_norm_per_rank"] = [None] * len(ranks)
        data["reduced_grad_norm"] = None
    data["grad_norm_spread"] = spread(data["grad_norm_per_rank"])
    data["unused_params_per_rank"] = [[n for n in names if n in u] for u in unused]
    data["unused_params"] = [n for n in names if any(n in u for u in unused)]
    return Row.of(data, row.display)


def _shard_rows(ranks: Sequence[GradsRank]) -> tuple[Row, ...]:
    from hookcli.report import Row

    return tuple(
        Row.of(
            {
                "name": p.name,
                "shape": list(p.shape),
                "dtype": p.dtype,
                "shard_numel_per_rank": [r.shards[i].shard_numel for r in ranks],
                "shard_bytes_per_rank": [r.shards[i].shard_bytes for r in ranks],
                "grad_norm_per_rank": [r.shards[i].local_grad_norm for r in ranks],
                "shard_grad_norm_per_rank": [r.shards[i].shard_grad_norm for r in ranks],
                "reduced_grad_norm": p.reduced_grad_norm,
                "unused_ranks": [r.rank for r in ranks if p.name in r.unused],
            }
        )
        for i, p in enumerate(ranks[0].shards)
    )
