"""The sweep's last rough spots (issue 28): option values that were taken silently, a
report that landed on stderr, and an .npy header version that was not checked."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import invoke

ROOT = Path(__file__).resolve().parent.parent


def usage_error(result, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hookcli: error: "), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--desync-tol", "nan"),
        ("--desync-tol", "inf"),
        ("--dist-timeout", "nan"),
        ("--dist-timeout", "-1"),
        ("--dist-timeout", "0"),
        ("--dist-timeout", "inf"),
    ],
)
def test_distributed_numbers_must_be_finite_and_in_range(option: str, value: str) -> None:
    # nan compares false: a desync tolerance of nan passed every check
    command = "grads" if option == "--desync-tol" else "inspect"
    result = invoke(command, "sample_models:Net", option, value)
    usage_error(result, option)


def test_in_range_distributed_numbers_still_pass() -> None:
    result = invoke("grads", "sample_models:Net", "--desync-tol", "0.5", "--dist-timeout", "5")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("pattern", ["", "  "])
def test_an_empty_models_filter_is_an_error_not_every_model(pattern: str) -> None:
    result = invoke("models", "--filter", pattern)
    usage_error(result, "--filter", "empty")


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_output_to_a_name_of_stdout_lands_on_stdout(name: str) -> None:
    if not Path(name).exists():  # not every system has each name; /dev/stdout is enough
        assert name != "/dev/stdout"
        return
    run = subprocess.run(
        [sys.executable, "-m", "hookcli", "inspect", "sample_models:Net", "-f", "json", "-o", name],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)  # all of it on stdout, none on stderr
    assert "{" not in run.stderr
    from sample_models import Net

    assert report["totals"]["params"] == sum(p.numel() for p in Net().parameters())


def test_an_npy_v3_header_claiming_more_than_the_file_holds_is_corrupt(tmp_path: Path) -> None:
    # numpy writes version 3.0 when a structured dtype's field names are not latin-1
    dtype = np.dtype([("\u03b1", "<f4")])
    buf = tmp_path / "probe.npy"
    np.save(buf, np.zeros(2, dtype=dtype))
    assert buf.read_bytes()[6:8] == b"\x03\x00"  # this numpy does write 3.0 for it
    shape = (10**6, 10**6)
    header = repr({"descr": dtype.descr, "fortran_order": False, "shape": shape})
    text = header.encode("utf-8")
    pad = (-(8 + 4 + len(text) + 1)) % 64
    body = text + b" " * pad + b"\n"
    path = tmp_path / "huge.npy"
    path.write_bytes(b"\x93NUMPY\x03\x00" + struct.pack("<I", len(body)) + body + b"\0" * 32)
    claimed = 4 * 10**12
    result = invoke("inspect", "sample_models:Net", "--input-file", str(path))
    usage_error(result, f"--input-file {path}", "corrupt file", f"{claimed:,} bytes")


def test_an_honest_npy_v3_header_is_read_past(tmp_path: Path) -> None:
    """The 3.0 check reads the header and lets a sound file through to np.load."""
    from hookcli.inputs.files import _check_numpy_sizes

    path = tmp_path / "ok.npy"
    np.save(path, np.zeros(3, dtype=np.dtype([("\u03b1", "<f4")])))
    _check_numpy_sizes(path, ".npy")  # no error
    assert torch.from_numpy(np.load(path)["\u03b1"].copy()).shape == (3,)
