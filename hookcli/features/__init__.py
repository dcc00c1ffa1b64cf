"""``features``: the tensors chosen modules output (or take in), saved to a file.

    probe.py    ``FeatureProbe``: forward hooks keeping the matched modules' tensors
    runner.py   the command's run: the report, the file, ``--png``
    plot.py     the feature grid PNG (``--png``)

Importing this package does not import torch.
"""
