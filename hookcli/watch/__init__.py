"""``watch``: a real training run, watched from outside with global hooks.

    bootstrap/   the ``sitecustomize`` that ``hookcli watch`` puts first on PYTHONPATH
    boot.py      what it calls once torch is imported: installs the monitor
    config.py    the options passed through the environment; defaults
    monitor.py   the in-process monitor: global optimizer step hooks, step boundaries
    track.py     what it holds per model; records.py the step and nonfinite records
    figures.py   how it takes norms, copies and output statistics; --nan-origin's part
    clipping.py  the grad norm before clipping (torch's clipping functions, observed)
    closure.py   closure steps (optimizer.step(closure): Lightning, LBFGS)
    scaler.py    GradScaler: the unscaled loss, skipped iterations
    zerograd.py  iterations the script discards (zero_grad with no step)
    registry.py  who owns which parameter; sinks.py the steps files; frames.py tracebacks
    merge.py     reading the steps files of every process (rank)
    summary.py   the ``watch`` Report; checks.py its CI gates
    runner.py    ``hookcli watch -- COMMAND``: process group, signals, live status
    plot.py      ``--plot``; session.py the Python twin ``hookcli.watch(model)``

Importing this package does not import torch.
"""
