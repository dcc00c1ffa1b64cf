"""`hookcli compare`'s refusals and notes found by a hostile sweep: each bad use is exit 2
(or 3 for a bad weights file) with one line naming the option the user wrote, and no output
path may replace a file the run reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import invoke

M = "tests.test_compare_models"
MODELS = Path(__file__).with_name("test_compare_models.py")


def one_line(result) -> str:  # type: ignore[no-untyped-def]
    err = result.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# -- F: an output that names an input file ----------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "compare"])
def test_output_naming_the_model_file_is_refused_and_the_file_kept(
    tmp_path: Path, command: str
) -> None:
    victim = tmp_path / "victim.py"
    shutil.copy(MODELS, victim)
    before = victim.read_bytes()
    extra = ["--vs", "amp=bf16"] if command == "compare" else []
    result = invoke(command, f"{victim}:MLPNet", *extra, "-i", "4x16", "-o", str(victim))
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert "a file this run reads" in one_line(result)
    assert victim.read_bytes() == before


def test_output_naming_weights_kwargs_or_b_files_is_refused(tmp_path: Path) -> None:
    import torch

    from tests.test_compare_models import MLPNet

    weights = tmp_path / "w.pt"
    torch.save(MLPNet().state_dict(), weights)
    kw = tmp_path / "k.json"
    kw.write_text("{}")
    b_file = tmp_path / "b.py"
    shutil.copy(MODELS, b_file)
    cases = [
        (["--vs", f"weights={weights}", "--junit", str(weights)], weights),
        (["--vs", "amp=bf16", "--b-kwargs-file", str(kw), "-o", str(kw)], kw),
    ]
    for extra, target in cases:
        before = target.read_bytes()
        result = invoke("compare", f"{M}:MLPNet", "-i", "4x16", *extra)
        assert result.exit_code == 2, (extra, result.exit_code, result.stderr)
        assert str(target) in one_line(result)
        assert target.read_bytes() == before
    before = b_file.read_bytes()
    result = invoke("compare", f"{M}:MLPNet", f"{b_file}:MLPNet", "-i", "4x16", "-o", str(b_file))
    assert result.exit_code == 2 and "MODEL B" in one_line(result)
    assert b_file.read_bytes() == before
