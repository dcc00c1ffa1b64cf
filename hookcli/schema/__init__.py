"""The JSON Schemas of hookcli's reports (``hookcli.report/1``) and of the lines of
``watch``'s steps files (``hookcli.steps/1``, ``steps.schema.json``), shipped as package
data.

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

__all__ = [
    "FILENAME",
    "SCHEMA_ID",
    "STEPS_FILENAME",
    "STEPS_SCHEMA_ID",
    "load",
    "load_steps",
    "text",
    "validate",
    "validate_steps",
]

FILENAME = "report.schema.json"
SCHEMA_ID = "hookcli.report/1"  # the value of every report's "schema" key
STEPS_FILENAME = "steps.schema.json"
STEPS_SCHEMA_ID = "hookcli.steps/1"  # the "schema" of a steps file's start record


@cache
def text(filename: str = FILENAME) -> str:
    """A schema file's text, exactly as shipped (the report's by default)."""
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


def load() -> dict[str, Any]:
    """The report schema as a fresh dict (callers may change their copy)."""
    schema: dict[str, Any] = json.loads(text())
    return schema


def load_steps() -> dict[str, Any]:
    """The schema of one line of a ``watch`` steps file, as a fresh dict."""
    schema: dict[str, Any] = json.loads(text(STEPS_FILENAME))
    return schema


def validate(report: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``report`` (a parsed JSON report) is valid.

    Needs the ``jsonschema`` package (``pip install jsonschema``); it is not a
    dependency of hookcli itself.
    """
    _validator("validate", load()).validate(report)


def validate_steps(record: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``record`` (one parsed line of a steps
    file) is valid. Needs the ``jsonschema`` package."""
    _validator("validate_steps", load_steps()).validate(record)


def _validator(caller: str, schema: dict[str, Any]) -> Any:
    """jsonschema's validator of ``schema``; ImportError naming ``caller`` without it."""
    try:
        import jsonschema
    except ImportError as err:
        raise ImportError(
            f"hookcli.schema.{caller} needs the jsonschema package: pip install jsonschema"
        ) from err
    return jsonschema.Draft202012Validator(schema)
