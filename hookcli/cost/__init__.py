"""``cost``: FLOPs, MACs and memory per module call; training and inference totals.

    runner.py           ``plan_cost`` (the options, checked) and ``run_cost`` (measure a
                        prepared model, build the report); ``hookcli cost`` and
                        ``hookcli.cost`` both go through them
    probe.py            ``CostProbe``: FLOPs, saved-for-backward bytes and activation
                        liveness per module call, in one measured pass
    flops.py            the FLOP formulas, per aten op
    quantized_flops.py  the formulas of quantized ops
    sizes.py            ``--max-memory``/``--max-flops`` values as people write them

Nothing here is imported by the shared core. Importing this package does not import torch.
"""
