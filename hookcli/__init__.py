"""hookcli: a command-line inspector for PyTorch models, built on PyTorch's hooks.

The public Python surface is small: the CLI (``hookcli.cli.app``), the error
tree (``hookcli.errors``) and the report records (``hookcli.report``).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
