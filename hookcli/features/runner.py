"""``features``: the command's run, from the parsed options to the exit status.

``cli_command`` checks ``--out``/``--png``, selects the modules, runs the model once with
``FeatureProbe`` (saying where a failing model raised), saves the tensors (``.pt``,
``.npz``, ``.safetensors``, written atomically) and the PNG grid, and emits the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.atomic import atomic_write, check_target
from hookcli.errors import UsageError
from hookcli.options import Mode

if TYPE_CHECKING:
    from typing import Unpack

    import torch

    from hookcli.commandargs import RunArgs
    from hookcli.errors import RunError
    from hookcli.features.probe import FeatureProbe
    from hookcli.pipeline import Prepared
    from hookcli.session import CallRecord


def cli_command(
    *,
    layer: list[str],
    out: Path | None,
    png: Path | None,
    channels: int,
    **common: Unpack[RunArgs],
) -> int:
    """The features command's run (``hookcli features``): select, run, save, emit."""
    from hookcli.commandargs import command_options
    from hookcli.layers import layer_rows, shape_columns
    from hookcli.options import HookKind
    from hookcli.pipeline import emit_outcome, prepare, progress
    from hookcli.render import fmt_bytes, fmt_int, fmt_text
    from hookcli.report import Column

    if out is not None:
        _check_out(out)
        check_target(out, "--out")
    if png is not None:
        check_target(png, "--png")
        from hookcli.plot import require_matplotlib

        require_matplotlib()
    mopts, ropts, outopts = command_options(common, Mode.EVAL, None)

    from hookcli.features.probe import FeatureProbe
    from hookcli.globs import select_modules

    prepared = prepare(mopts, ropts)
    if prepared.settings["device"] == "meta":
        raise UsageError("features needs values: --device meta holds shapes only")
    selected = select_modules(prepared.model, layer)

    probe = FeatureProbe()
    records, error = _run(prepared, probe, [m for _, m in selected], ropts.mode)
    kinds = (HookKind.PRE, HookKind.FORWARD)
    rows, _ = layer_rows(records, prepared.model, kinds=kinds, probes=[probe], containers=False)
    tensors = probe.tensors()
    total_bytes = sum(t.numel() * t.element_size() for t in tensors.values())

    notes: list[str] = []
    png_written = False
    ran = {r.module_id for r in records}
    idle = [name or "(root)" for name, m in selected if id(m) not in ran]
    if idle:
        notes.append(f"matched but never called: {', '.join(idle)}")
    if error is None:
        if out is not None:
            for note in save_tensors(out, tensors):
                progress(note)
            progress(f"saved {len(tensors)} tensor(s) to {out}")
            notes.append(
                f"saved {len(tensors)} tensor(s), {fmt_bytes(total_bytes, binary=False)}, to {out}"
            )
        else:
            notes.append("nothing saved: pass --out FILE (.pt, .npz, .safetensors)")
        if png is not None:
            from hookcli.features.plot import render_png

            data, skipped = render_png(list(tensors.items()), channels)
            if skipped:
                progress(f"not drawn in --png (not a 1-4-D floating tensor): {', '.join(skipped)}")
            if data:
                atomic_write(png, lambda f: f.write(data))
                png_written = True
                progress(f"feature grid written to {png}")
                notes.append(f"feature grid: {png}")
            else:
                progress("--png: nothing to draw, no file written")
    else:
        notes.append("nothing saved: the model raised")

    report = prepared.report(
        "features",
        prepared.settings,
        layers=rows,
        totals={
            "matched": [name for name, _ in selected],
            "tensors": len(tensors),
            "bytes": total_bytes,
            "out": str(out) if out is not None and error is None else None,
            "png": str(png) if png_written else None,
        },
        notes=tuple(notes),
        error=error.message if error else None,
    )
    columns = [
        *shape_columns(kinds),
        Column("keys", "Saved as", fmt_text),
        Column("bytes", "Bytes", fmt_int, "right"),
    ]
    return emit_outcome(report, error, outopts, columns)


SUFFIXES = (".pt", ".npz", ".safetensors")


def _check_out(out: Path) -> str:
    """The format of ``--out`` from its suffix; exit 2 when unknown or not installed."""
    suffix = out.suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(
            f"--out {out}: unknown file type {suffix or '(none)'}; use {', '.join(SUFFIXES)}"
        )
    if suffix == ".safetensors":
        try:
            import safetensors.torch  # noqa: F401
        except ImportError:
            raise UsageError(
                "--out .safetensors needs the safetensors package: "
                "pip install 'hookcli[safetensors]' (or use .pt / .npz)"
            ) from None
    return suffix


def _numpy_arrays(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, Any], list[str]]:
    """Arrays for .npz; bfloat16 (unknown to numpy) goes up to float32."""
    import torch

    arrays: dict[str, Any] = {}
    widened = []
    for key, t in tensors.items():
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
            widened.append(key)
        arrays[key] = t.numpy()
    return arrays, widened


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Write ``tensors`` to ``path`` in the format its suffix names; notes for stderr."""
    suffix = _check_out(path)
    notes: list[str] = []
    if suffix == ".pt":
        import torch

        atomic_write(path, lambda f: torch.save(tensors, f))
    elif suffix == ".npz":
        import numpy as np

        arrays, widened = _numpy_arrays(tensors)
        if widened:
            notes.append(f"bfloat16 saved as float32 in .npz: {', '.join(widened)}")
        atomic_write(path, lambda f: np.savez(f, **arrays))
    else:
        from safetensors.torch import save

        data = save({k: t.contiguous() for k, t in tensors.items()})
        atomic_write(path, lambda f: f.write(data))
    return notes


def _run(
    prepared: Prepared, probe: FeatureProbe, selected: list[Any], mode: Mode
) -> tuple[tuple[CallRecord, ...], RunError | None]:
    """One forward with hooks on ``selected`` only: the records and any model failure."""
    from hookcli.errors import RunError
    from hookcli.pipeline import run_session

    outcome = run_session(prepared, [probe], mode=mode, only=selected)
    records, error = outcome.records, outcome.error
    cause = None if error is None else error.__cause__
    if error is not None and cause is not None:
        from hookcli.errors import first_line
        from hookcli.failure import failed_call

        # Only the selected modules are hooked; the traceback names the one that raised.
        where = failed_call(cause, prepared.model)
        if where is not None:
            error = RunError(where.message(first_line(cause)), module=where.name)
            error.__cause__ = cause
    return records, error
