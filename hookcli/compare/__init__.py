"""``compare``: two models (or one model under two settings) on the same inputs, call by call.

    align.py     which call of B answers which call of A: same names, ``--map`` rules,
                 else a sequence alignment of the two call sequences (type, output shapes)
    metrics.py   per output tensor: max abs, relative L2, cosine, SQNR, NaN/Inf, the
                 tolerance test (``torch.testing.assert_close``'s defaults by dtype)
    settings.py  ``--vs KEY=VALUE``: what the B side changes (amp, dtype, device, ...)
    record.py    the probes: record a side's calls; A's tensors lent to B in step; the
                 local mode's substitution of A's inputs and outputs
    weights.py   ``--copy-weights``: A's parameters into B through the alignment
    runner.py    the command's run: build both sides, run, align, measure, the report

Nothing here is imported by the shared core. Importing this package does not import torch.
"""
