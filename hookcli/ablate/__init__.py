"""``ablate``: replace what a module outputs (or passes back) and measure the effect.

    passes.py   the clean pass and one pass per target, with the hooks that ablate
                (``run_ablations``), the ops and the measures
    runner.py   the command's plan and run: targets from the patterns, the report, CSV
    checks.py   ``--fail-if``: thresholds on the measures

Nothing here is imported by the shared core. Importing this package does not import torch.
"""
