"""Golden files for every output format on small sample models.

Regenerate with ``pytest tests/test_golden.py --update-golden`` (``make golden``)
and review the diff: a golden change is a product change.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import invoke

GOLDEN = Path(__file__).parent / "golden"
EXT = {"table": "txt", "json": "json", "csv": "csv", "markdown": "md"}
CASES = {
    "net": ["inspect", "sample_models:Net"],
    "lenet": ["inspect", "sample_models:LeNet"],
    "custom_linear": ["inspect", "sample_models:CustomLinearLayer"],
    "tied": ["inspect", "sample_models:TiedEmbeddingLM", "--depth", "1"],
    "two_input_dict": ["inspect", "sample_models:TwoInputDictOutput"],
    "lstm": ["inspect", "sample_models:LSTMModel"],
    "transformer_kw": [
        "inspect",
        "sample_models:TinyTransformer",
        "-i",
        "int64:2x6:0..100",
        "-i",
        "mask=bool:2x6:1..2",
        "--depth",
        "2",
    ],
}


@pytest.mark.parametrize("fmt", list(EXT))
@pytest.mark.parametrize("case", list(CASES))
def test_golden(case: str, fmt: str, update_golden: bool) -> None:
    result = invoke(*CASES[case], "--format", fmt)
    assert result.exit_code == 0, result.stderr
    path = GOLDEN / f"{case}.{EXT[fmt]}"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.stdout, encoding="utf-8")
    assert path.exists(), f"missing golden {path}: run pytest --update-golden"
    assert result.stdout == path.read_text(encoding="utf-8")
