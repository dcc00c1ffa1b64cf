"""The JSON Schema of hookcli's reports (``hookcli.report/1``), shipped as package data.

Every command's ``--format json`` output validates against ``report.schema.json``
(JSON Schema draft 2020-12); docs/reference.md describes the keys in words::

    import json, jsonschema, hookcli.schema
    jsonschema.validate(json.load(open("report.json")), hookcli.schema.load())

This module imports neither torch nor jsonschema at import time.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["FILENAME", "SCHEMA_ID", "load", "text", "validate"]

FILENAME = "report.schema.json"
SCHEMA_ID = "hookcli.report/1"  # the value of every report's "schema" key


@cache
def text() -> str:
    """The schema file's text, exactly as shipped."""
    return resources.files(__name__).joinpath(FILENAME).read_text(encoding="utf-8")


def load() -> dict[str, Any]:
    """The report schema as a fresh dict (callers may change their copy)."""
    schema: dict[str, Any] = json.loads(text())
    return schema


def validate(report: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``report`` (a parsed JSON report) is valid.

    Needs the ``jsonschema`` package (``pip install jsonschema``); it is not a
    dependency of hookcli itself.
    """
    try:
        import jsonschema
    except ImportError as err:
        raise ImportError(
            "hookcli.schema.validate needs the jsonschema package: pip install jsonschema"
        ) from err
    jsonschema.Draft202012Validator(load()).validate(report)
