"""features on a model that raises: the cost of naming where it failed.

In one process: ``features --layer layer1`` on resnet50 (batch 2) whose ``fc`` has the
wrong width, so forward raises in ``fc``, a module that is not hooked. The failed run
(session, forward, locating the module from the traceback) against a bare forward that
raises the same way; median of interleaved runs. Before issue 10 item 20 features ran
forward a second time with every module hooked to find the module (about 2x).
"""

from __future__ import annotations

import statistics
import time


def main(batch: int = 2, repeats: int = 5) -> None:
    import torch
    from torch import nn

    from hookcli.commands.features import _run
    from hookcli.globs import select_modules
    from hookcli.options import Mode, ModelOptions, RunOptions
    from hookcli.pipeline import prepare
    from hookcli.probes.features import FeatureProbe

    prepared = prepare(ModelOptions("resnet50"), RunOptions(inputs=(f"{batch}x3x224x224",)))
    model, x = prepared.model, prepared.inputs.args[0]
    model.fc = nn.Linear(1000, 10)  # 2048 features arrive: fc raises
    model.eval()
    selected = [m for _, m in select_modules(model, ["layer1"])]

    def bare() -> None:
        try:
            with torch.inference_mode():
                model(x)
        except RuntimeError:
            pass

    def hooked() -> str:
        _, error = _run(prepared, FeatureProbe(), selected, Mode.EVAL)
        assert error is not None
        return error.message

    message = hooked()
    bare()
    ratios = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        bare()
        t1 = time.perf_counter()
        hooked()
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    print(f"failure named: {message[:80]}...")
    print(
        f"features failed run / bare failed forward (resnet50, batch {batch}): "
        f"{statistics.median(ratios):.2f}x (median of {repeats})"
    )


if __name__ == "__main__":
    main()
