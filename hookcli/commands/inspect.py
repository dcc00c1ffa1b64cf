"""``hookcli inspect MODEL``: the per-layer table of shapes and parameters."""

from hookcli.cliopts import (
    BatchOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    GlobalHooksOpt,
    HooksOpt,
    InputOpt,
    KwargsOpt,
    ModelArg,
    ModeOpt,
    OutputOpt,
    SeedOpt,
    TrustPickleOpt,
    WeightsOpt,
    model_options,
    output_options,
    run_options,
)
from hookcli.ddpopts import BackendOpt, DdpOpt, DistTimeoutOpt
from hookcli.options import Format, HookKind, Mode, parse_hook_kinds

NAME = "inspect"
DEFAULT_KINDS = (HookKind.PRE, HookKind.FORWARD)


def command(
    model: ModelArg,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    input: InputOpt = None,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    depth: DepthOpt = None,
    hooks: HooksOpt = None,
    global_hooks: GlobalHooksOpt = False,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
    ddp: DdpOpt = False,
    backend: BackendOpt = None,
    dist_timeout: DistTimeoutOpt = 600.0,
) -> int:
    """Per-layer table: name, type, input and output shapes, params, trainable; totals."""
    from hookcli.layers import PARAM_COLUMNS, layer_rows, param_totals, shape_columns
    from hookcli.modelinfo import totals
    from hookcli.pipeline import emit, prepare, run_session
    from hookcli.probes import backward_probes
    from hookcli.render import Column
    from hookcli.report import Report

    kinds = parse_hook_kinds(hooks) or DEFAULT_KINDS
    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ropts = run_options(input, batch_size, device, dtype, mode, Mode.EVAL, global_hooks)
    out = output_options(format, output, depth, debug)
    if ddp or backend is not None:
        from hookcli.ddp import launch_command, run_inspect

        return launch_command(
            lambda ctx: run_inspect(ctx, mopts, ropts, out, kinds),
            ddp=ddp,
            device=device,
            backend=backend,
            timeout_s=dist_timeout,
            kinds=kinds,
            global_hooks=global_hooks,
            need_tensor=False,
        )

    prepared = prepare(mopts, ropts)
    probes = backward_probes(kinds)
    outcome = run_session(prepared, probes, mode=ropts.mode, global_hooks=ropts.global_hooks)
    rows, unshown = layer_rows(
        outcome.records, prepared.model, depth=out.depth, kinds=kinds, probes=probes
    )
    model_totals = dict(totals(prepared.model))
    extra_cols: list[Column] = []
    for p in probes:
        model_totals.update(p.totals())
        extra_cols.extend(getattr(p, "table_columns", ()))
    report = Report(
        command=NAME,
        model=prepared.model_info(),
        settings=prepared.settings,
        inputs=prepared.input_dicts(),
        layers=rows,
        totals=model_totals,
        error=outcome.error.message if outcome.error else None,
    )
    code = emit(
        report,
        out,
        [*shape_columns(kinds), *extra_cols, *PARAM_COLUMNS],
        param_totals(model_totals, unshown),
    )
    if outcome.error is not None:
        raise outcome.error
    return code
