"""``hookcli registrations MODEL``: every module/parameter/buffer registration while building."""

from hookcli.cliopts import (
    AnnotateOpt,
    AtolOpt,
    BaselineOpt,
    DebugOpt,
    DepthOpt,
    DeviceOpt,
    FormatOpt,
    JunitOpt,
    KwargsOpt,
    ModelArg,
    OutputOpt,
    RtolOpt,
    SeedOpt,
    TrustPickleOpt,
    UpdateBaselineOpt,
    WeightsOpt,
    ci_options,
    model_options,
    output_options,
)
from hookcli.options import Format

NAME = "registrations"


def command(
    model: ModelArg,
    kwargs: KwargsOpt = None,
    weights: WeightsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    device: DeviceOpt = "cpu",
    depth: DepthOpt = None,
    format: FormatOpt = Format.TABLE,
    output: OutputOpt = None,
    baseline: BaselineOpt = None,
    update_baseline: UpdateBaselineOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    annotate: AnnotateOpt = None,
    junit: JunitOpt = None,
    seed: SeedOpt = 0,
    debug: DebugOpt = False,
) -> int:
    """Every registration while the model is built, in order: parent, kind, name, shape."""
    from hookcli.inputs import resolve_device
    from hookcli.loading import is_torchvision_name
    from hookcli.pipeline import build_model, emit
    from hookcli.registrations import RegistrationRecorder, registrations_report

    mopts = model_options(model, kwargs, weights, trust_pickle, seed)
    ci = ci_options(baseline, update_baseline, annotate, junit, rtol, atol)
    out = output_options(format, output, depth, debug, ci)
    if is_torchvision_name(mopts.spec.strip()):
        # Import torchvision before the hooks go in: only the model's own build is recorded.
        import torchvision.models  # noqa: F401

    recorder = RegistrationRecorder()
    with recorder:
        loaded = build_model(mopts, resolve_device(device))
    regs = recorder.resolve(loaded.module)
    recorder.release()
    return emit(registrations_report(loaded, regs, seed=mopts.seed, depth=out.depth), out)
