"""The stages every command shares: build the model, draw inputs, run a session, emit.

Each capability's runner is a preset of these stages plus its probes.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from hookcli.errors import RunError, UsageError
from hookcli.options import Mode, ModelOptions, OutputOptions, RunOptions
from hookcli.streams import (  # re-exported: commands and runners import them from here
    model_output_to_stderr as model_output_to_stderr,
)
from hookcli.streams import progress as progress
from hookcli.streams import report_stream as report_stream

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.inputs.grammar import Inputs
    from hookcli.report import Column, Report
    from hookcli.session import CallRecord, HookSession, Probe
    from hookcli.sources import LoadedModel


@dataclass(frozen=True)
class Prepared:
    """A built model on its device and the inputs to call it with."""

    loaded: LoadedModel
    inputs: Inputs | None
    settings: dict[str, Any]

    @property
    def model(self) -> nn.Module:
        return self.loaded.module

    def model_info(self) -> dict[str, Any]:
        return {"spec": self.loaded.spec, "class": type(self.loaded.module).__name__}

    def input_dicts(self) -> tuple[dict[str, Any], ...]:
        return tuple(i.to_dict() for i in self.inputs.infos) if self.inputs else ()

    def report(self, command: str, settings: Mapping[str, Any], **fields: Any) -> Report:
        """``command``'s report on this model and its inputs (``fields``: the rest of
        ``Report``'s: rows, totals, checks, notes, ...)."""
        from hookcli.report import Report

        return Report(
            command=command,
            model=self.model_info(),
            settings=settings,
            inputs=self.input_dicts(),
            **fields,
        )


def build_model(opts: ModelOptions, device: torch.device | None = None) -> LoadedModel:
    """MODEL -> LoadedModel built on ``device`` (exit 3 on failure)."""
    from hookcli.kwargs import parse_kwargs
    from hookcli.loading import load_model

    kwargs = parse_kwargs(opts.kwargs)
    try:
        return load_model(
            opts.spec,
            kwargs,
            seed=opts.seed,
            weights=opts.weights,
            trust_pickle=opts.trust_pickle,
            device=device,
        )
    finally:
        _resume_gc()


def _resume_gc() -> None:
    """After the imports and the build: freeze that heap, then collect as usual.

    Only where the CLI paused collection (``cli.main``); in-process callers keep
    their own garbage-collector settings (``collection_paused`` turns it back on as
    it found it).
    """
    if not gc.isenabled() and not _PAUSED:
        gc.freeze()
        gc.enable()


_PAUSED: list[bool] = []


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for one in-process call, as ``timeit``
    does, and back on after it (left off where the caller had it off).

    An API call makes and drops many small objects (a frame per module call, a row per
    layer); with torch imported, the full collections they set off each walk every
    object of the process (about 0.13 s on the 2-core AMD EPYC of docs/performance.md),
    which is most of what ``hookcli.inspect`` costs on a model of 10,000 module calls.
    Reference counting still frees everything that holds no cycle; what does is
    collected once the collector is back on.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    _PAUSED.append(True)
    try:
        yield
    finally:
        _PAUSED.pop()
        gc.enable()


def prepare(
    model_opts: ModelOptions,
    run_opts: RunOptions,
    *,
    need_inputs: bool = True,
    loaded: LoadedModel | None = None,
) -> Prepared:
    """Build the model (unless given), cast and move it, and draw its inputs."""
    from hookcli.inputs.grammar import (
        build_inputs,
        check_against_forward,
        check_order,
        parse_spec,
        resolve_device,
        torch_dtype,
    )
    from hookcli.options import FLOAT_DTYPES

    device = resolve_device(run_opts.device)  # bad --device is exit 2, before any build
    from hookcli import amp as autocast

    amp = autocast.check(autocast.current(), device)  # --amp the device cannot run: exit 2
    if run_opts.dtype is not None and run_opts.dtype not in FLOAT_DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(FLOAT_DTYPES)}, got {run_opts.dtype}")
    for text in run_opts.inputs:
        parse_spec(text)  # a malformed spec is exit 2 before the model is built
    saved_inputs = None
    if need_inputs and run_opts.input_file is not None:
        from hookcli.inputs.files import read_input_file

        saved_inputs = read_input_file(run_opts.input_file)  # a bad file: exit 2, no build
    elif need_inputs and run_opts.inputs_from:
        from hookcli.inputs.files import check_inputs_from

        check_inputs_from(run_opts.inputs_from)
    if loaded is None:
        loaded = build_model(model_opts, device)
    model = loaded.module
    try:
        if run_opts.dtype is not None:
            model.to(torch_dtype(run_opts.dtype))
        if not _all_on(model, device):  # .to() walks every module even when nothing moves
            model.to(device)
    except Exception as err:
        from hookcli.errors import LoadError, ResourceError, first_line, is_oom, oom_cause

        if is_oom(err):
            raise ResourceError(
                f"out of memory moving the model to {device}: {first_line(oom_cause(err))}"
            ) from err
        raise LoadError(f"could not move the model to {device}: {first_line(err)}") from err
    inputs = None
    if need_inputs and (run_opts.input_file is not None or run_opts.inputs_from):
        from hookcli.inputs.files import real_inputs
        from hookcli.loading import keep_cwd

        with keep_cwd():  # --inputs-from runs the user's code
            inputs = real_inputs(
                model,
                input_file=run_opts.input_file,
                inputs_from=run_opts.inputs_from,
                preloaded=saved_inputs,
                seed=model_opts.seed,
                dtype=run_opts.dtype,
                device=device,
            )
    elif need_inputs:
        specs = [parse_spec(t) for t in run_opts.inputs]
        check_order(specs)
        check_against_forward(model, specs)  # too many -i, an unknown NAME=: exit 2
        inputs = build_inputs(
            model,
            run_opts.inputs,
            seed=model_opts.seed,
            batch_size=run_opts.batch_size,
            dtype=run_opts.dtype,
            device=run_opts.device,
            family=loaded.family,
            torchvision_name=loaded.torchvision_name,
            defaults=loaded.default_inputs,
            defaults_source=loaded.input_source,
            values=loaded.input_values,
            offer_no_forward=run_opts.offer_no_forward,
        )
    if inputs is not None:
        from hookcli.inputs.files import initialize_lazy

        initialize_lazy(model, inputs)
    from hookcli import gradmode

    gradmode.lift_requested(model)  # --enable-grad: undecorated forwards until the command ends
    settings = {
        "device": str(device),
        "dtype": run_opts.dtype or _model_dtype(model),
        "mode": run_opts.mode.value,
        "seed": model_opts.seed,
        **build_settings(loaded),
    }
    if gradmode.current():
        settings["enable_grad"] = True
    if autocast.activate(amp, device) is not None:
        settings["amp"] = amp  # every forward of the run under torch.autocast
    if inputs is not None and inputs.source.startswith(("--input-file", "--inputs-from")):
        settings["inputs"] = inputs.source  # --input-file FILE / --inputs-from SPEC
    return Prepared(loaded=loaded, inputs=inputs, settings=settings)


def build_settings(loaded: LoadedModel) -> dict[str, Any]:
    """What ``settings`` records of the build: ``kwargs`` (as given by -k / --kwargs-file)
    and ``weights`` (path, sha256, the checkpoint key a config came from); absent when
    none was given. (``loss`` and ``amp`` are the runners': how the model is run.)"""
    return dict(loaded.settings or {})


def _all_on(model: nn.Module, device: torch.device) -> bool:
    """Every parameter and buffer already on ``device`` (index included where given)."""
    import itertools

    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.device.type != device.type or (
            device.index is not None and t.device.index != device.index
        ):
            return False
    return True


def _model_dtype(model: nn.Module) -> str:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return "float32"


# What a command's runner returns: the report (also of a failed run) and the failure.
Outcome = tuple["Report", RunError | None]


@dataclass(frozen=True)
class RunOutcome:
    """What a session saw: every call, the probes (with their results), any failure."""

    records: tuple[CallRecord, ...]
    probes: tuple[Probe, ...]
    error: RunError | None
    loss: float | None = None


def run_session(
    prepared: Prepared,
    probes: Sequence[Probe],
    *,
    mode: Mode,
    global_hooks: bool = False,
    backward: bool = False,
    always_call: bool = False,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    steps: int = 1,
    after_run: Callable[[HookSession], None] | None = None,
    only: Sequence[nn.Module] | None = None,
) -> RunOutcome:
    """Run forward ``steps`` times (and backward once if asked) inside a HookSession.

    A RunError (the model raised) is caught and returned with the records of the
    calls that did run, so the command can still print them before exiting 4.
    """
    from hookcli.session import HookSession

    assert prepared.inputs is not None
    args, kwargs = prepared.inputs.args, dict(prepared.inputs.kwargs)
    error: RunError | None = None
    output: Any = None
    loss_value: float | None = None
    from hookcli.loading import keep_cwd

    with (
        keep_cwd(),
        HookSession(  # the working folder as found, whatever forward does
            prepared.model,
            probes,
            mode=mode,
            global_hooks=global_hooks,
            backward=backward,
            always_call=always_call,
            only=only,
        ) as session,
    ):
        try:
            for _ in range(steps):
                output = session.forward(args, kwargs)
            if backward or session.backward_needed:
                if loss_fn is None:
                    from hookcli.losses import reduce_output

                    loss = reduce_output(output, "sum")
                else:
                    loss = loss_fn(output)
                loss_value = None if loss.is_meta else float(loss.detach())  # meta: no value
                session.backward(loss)
        except RunError as err:
            error = err
        session.finish()
        note_meta_assumptions(session, prepared.settings)
        if after_run is not None:
            after_run(session)
        records = session.records
    return RunOutcome(
        records=records,
        probes=tuple(probes),
        error=error,
        loss=loss_value,
    )


_BATCHNORM_MARKERS = (
    "Expected more than 1 value per channel when training",
    "Expected more than 1 spatial element when training",
)
_TARGETS_MARKERS = ("targets should not be none when in training mode",)
_TRAIN_MODE_HINTS = (
    (
        _BATCHNORM_MARKERS,
        "in train mode batch norm needs more than one value per channel: pass a larger "
        "batch (-b 2) or --mode eval",
    ),
    (
        _TARGETS_MARKERS,
        "in train mode a torchvision detection model needs targets (boxes and labels) and "
        "returns losses: pass --mode eval to run it on images alone",
    ),
)


def with_train_mode_hint(error: RunError | None, mode: Mode) -> RunError | None:
    """A failure that train mode causes (batch norm on a batch of one, a detection model
    wanting targets): say how to get past it."""
    if error is None or mode is not Mode.TRAIN:
        return error
    for markers, hint in _TRAIN_MODE_HINTS:
        if any(m in error.message for m in markers):
            hinted = RunError(f"{error.message}; hint: {hint}", module=error.module)
            hinted.__cause__ = error.__cause__
            return hinted
    return error


def note_meta_assumptions(session: HookSession, settings: dict[str, Any] | None = None) -> None:
    """On meta, the value stand-ins the run used: one stderr line, and the report's
    ``settings.meta_assumptions`` (docs/models.md#values-on-meta)."""
    if not session.meta_assumed:
        return
    from hookcli.metavalues import ASSUMPTIONS

    stated = [f"{ASSUMPTIONS[k]} ({n}x)" for k, n in sorted(session.meta_assumed.items())]
    if settings is not None:
        settings["meta_assumptions"] = stated
    progress(
        "hookcli: note: on meta, values were synthesized: "
        + "; ".join(stated)
        + "; run on cpu for the model's exact control flow"
    )


def emit(
    report: Report,
    out: OutputOptions,
    columns: Sequence[Column] = (),
    totals: Sequence[tuple[str, str]] = (),
) -> int:
    """Render the report and write it to stdout or ``--output``; 1 if a check failed.

    ``columns`` and ``totals`` default to the report's own table layout.
    """
    from hookcli.render import render

    text = render(report, out.format, columns or report.columns, totals or report.table_totals)
    write_text(text, out)
    return conclude(report, out)


def emit_outcome(
    report: Report, error: BaseException | None, out: OutputOptions, columns: Sequence[Column] = ()
) -> int:
    """``emit`` the report (as far as the run got), then raise the run's ``error``."""
    code = emit(report, out, columns)
    if error is not None:
        raise error
    return code


def conclude(report: Report, out: OutputOptions) -> int:
    """After the report is written: --baseline, --annotate, --junit, the step summary.

    The exit status: 1 if a check failed or the baseline differs, else 0.
    """
    from hookcli.ci import conclude as ci_conclude

    return ci_conclude(report, out)


def _discard_rest(stream: TextIO) -> None:
    """Point a stream whose reader is gone at /dev/null, so the flush at exit is quiet."""
    import os

    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def write_text(text: str, out: OutputOptions) -> None:
    """Write rendered text to ``--output`` (atomically, folders created) or stdout (also
    for ``-o -``)."""
    from hookcli.atomic import atomic_write_text, is_stdout

    if out.output is None or is_stdout(out.output):
        stream = report_stream()
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:  # the reader stopped early (| head): not an error
            _discard_rest(stream)
        return
    atomic_write_text(out.output, text, "--output")
    progress(f"report written to {out.output}")
