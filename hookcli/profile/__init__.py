"""``profile``: where the time goes, per module, forward and backward.

    hooks.py    the timing hooks: forward-pre/forward (and full backward-pre/backward)
                on every module, writing clock stamps into preallocated arrays
    clocks.py   the clocks: perf_counter_ns, CUDA events, synchronize-then-read
    figures.py  per-call stamps -> per-module medians and spreads (inclusive and self)
    plan.py     the options, checked (``ProfilePlan``), and the raw measurements
    runner.py   plan_profile, the counting pass (cost's CostProbe), warmup, the timed
                repeats against bare forwards, the report
    trace.py    the Chrome trace-event file (Perfetto, chrome://tracing)
    render.py   table columns, totals lines, the --plot bar chart

Nothing here is imported by the shared core; ``hookcli.api.profile`` and the command
(``runner.cli_command``) call ``runner.plan_profile`` and ``runner.run_profile``.
Importing this package does not import torch.
"""
