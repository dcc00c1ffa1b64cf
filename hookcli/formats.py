"""``Format``, the report formats (``--format``), apart from ``hookcli.options``: ``hookcli
watch`` checks its ``--format`` before it starts COMMAND and needs no other option type
then. ``hookcli.options`` re-exports it, the one name everything else uses."""

from __future__ import annotations

import enum


class Format(str, enum.Enum):
    """Report format (``--format``)."""

    TABLE = "table"
    JSON = "json"
    CSV = "csv"
    MARKDOWN = "markdown"
    HTML = "html"
