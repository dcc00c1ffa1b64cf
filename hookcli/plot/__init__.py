"""PNG output. matplotlib is the optional ``plot`` extra, imported only when asked for.

One module per picture: ``gradflow`` (``grads --plot``), ``features`` (``features --png``).
"""

from __future__ import annotations

from typing import Any

from hookcli.errors import UsageError


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or exit 2 saying what to install."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "PNG output needs matplotlib: pip install 'hookcli[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt
