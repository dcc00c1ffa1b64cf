"""Example inputs: what the model is run on.

    grammar.py  the input grammar (docs/reference.md "Inputs") -> seeded example
                tensors; family defaults, ``example_input_array``
    files.py    real inputs: ``--input-file FILE`` and ``--inputs-from SPEC``

Part of the shared core. Importing this package does not import torch.
"""
