"""Every test under tests/real is of the ``real`` tier (``make test-real``).

The packages come from the ``real`` extra. A package the registry could not give is a
failure of the tier, never a skip: ``need(name)`` imports it or fails the test.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real)


def need(name: str) -> ModuleType:
    """Import a published package of the ``real`` extra, failing (never skipping) without it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:  # pragma: no cover - a broken install
        pytest.fail(f"{name} is not importable ({e}); `make test-real` installs the real extra")
