"""Issue 28, input files: mapping files mixing numbered and named keys (B11), 0-d arrays
in .npy/.npz, a header claiming more data than the file holds (R14), and inputs nested
deeper than Python's recursion limit (R15); also arrays saved in the other byte order.

The expectations are independent of hookcli: a recording model saves exactly what its
forward received, and that is compared with what numpy, safetensors and torch.load give
for the same file.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from numpy.lib import format as npformat
from torch import nn

import hookcli
from tests.conftest import invoke, invoke_json

RECORDER = '''
import torch
from torch import nn

SEEN = {seen!r}


class Recorder(nn.Module):
    """forward(x, mask=None): saves what it received, returns x * 2 (+ mask)."""

    def forward(self, x, mask=None):
        torch.save({{"x": x, "mask": mask}}, SEEN)
        y = x["a"] if isinstance(x, dict) else x
        return y * 2 if mask is None else y * 2 + mask.sum()


class Deep(nn.Module):
    """forward(x): x is a tensor inside lists nested to any depth."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        depth = 0
        while isinstance(x, list):
            x, depth = x[0], depth + 1
        torch.save({{"x": x, "depth": depth}}, SEEN)
        return self.fc(x)


def deep_inputs():
    v = torch.arange(3, dtype=torch.float32)
    for _ in range({depth}):
        v = [v]
    return (v,)  # the args: one input, the nested list
'''

DEPTH = 3 * sys.getrecursionlimit()  # deeper than any recursive walk can go


@pytest.fixture
def model_file(tmp_path: Path) -> tuple[Path, Path]:
    seen = tmp_path / "seen.pt"
    path = tmp_path / "recorder.py"
    path.write_text(RECORDER.format(seen=str(seen), depth=DEPTH))
    return path, seen


def one_error_line(result, code: int, *words: str) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hookcli: error: "), result.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def seen_by_forward(seen: Path) -> dict[str, Any]:
    return torch.load(seen, weights_only=True)


# -- B11: numbered (positional) and named (keyword) keys mix in a mapping file --------


def _mixed(tmp_path: Path, fmt: str) -> tuple[Path, dict[str, torch.Tensor]]:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    mask = rng.standard_normal((2, 4)).astype(np.float32)
    path = tmp_path / f"mixed.{fmt}"
    if fmt == "npz":
        np.savez(path, **{"0": x, "mask": mask})
        with np.load(path) as f:
            expected = {k: torch.from_numpy(f[k]) for k in f.files}
    else:
        from safetensors.torch import load_file, save_file

        save_file({"0": torch.from_numpy(x), "mask": torch.from_numpy(mask)}, str(path))
        expected = load_file(str(path))
    return path, expected


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_numbered_and_named_keys_mix(
    tmp_path: Path, model_file: tuple[Path, Path], fmt: str
) -> None:
    model, seen = model_file
    path, expected = _mixed(tmp_path, fmt)
    report = invoke_json("inspect", f"{model}:Recorder", "--input-file", str(path))
    got = seen_by_forward(seen)
    assert torch.equal(got["x"], expected["0"])  # key '0': the first positional input
    assert torch.equal(got["mask"], expected["mask"])  # key 'mask': the keyword input
    assert [(i["name"], i["shape"]) for i in report["inputs"]] == [
        ("x", [2, 4]),
        ("mask", [2, 4]),
    ]


def test_dotted_name_nests_under_a_number(tmp_path: Path, model_file: tuple[Path, Path]) -> None:
    model, seen = model_file
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(3, dtype=np.int64)
    m = np.full((1,), 0.5, dtype=np.float32)
    path = tmp_path / "nested.npz"
    np.savez(path, **{"0.a": a, "0.b": b, "mask": m})
    invoke_json("inspect", f"{model}:Recorder", "--input-file", str(path))
    got = seen_by_forward(seen)
    assert set(got["x"]) == {"a", "b"}
    assert torch.equal(got["x"]["a"], torch.from_numpy(a))
    assert torch.equal(got["x"]["b"], torch.from_numpy(b))
    assert torch.equal(got["mask"], torch.from_numpy(m))


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        (("0", "2", "mask"), ("numbered names must be 0, 1, ... without gaps", "0, 2")),
        (("0", "my-mask"), ("'my-mask'", "neither a number", "Python identifier")),
        (("\u00b2",), ("'\u00b2'", "neither a number")),  # str.isdigit, but no int()
    ],
)
def test_bad_names_in_a_mapping_file(
    tmp_path: Path, model_file: tuple[Path, Path], keys: tuple[str, ...], words: tuple[str, ...]
) -> None:
    model, _ = model_file
    path = tmp_path / "bad.npz"
    np.savez(path, **{k: np.zeros(2, np.float32) for k in keys})
    result = invoke("inspect", f"{model}:Recorder", "--input-file", str(path))
    line = one_error_line(result, 2, f"--input-file {path}", *words)
    assert "[dict]" not in line and "wrap it" not in line  # no hint that cannot apply


def test_a_pt_dict_with_a_bad_key_names_the_file_and_a_hint_that_applies(
    tmp_path: Path, model_file: tuple[Path, Path]
) -> None:
    model, _ = model_file
    path = tmp_path / "d.pt"
    torch.save({"0": torch.zeros(2), "mask": torch.zeros(2)}, path)
    result = invoke("inspect", f"{model}:Recorder", "--input-file", str(path))
    line = one_error_line(result, 2, f"--input-file {path}", "'0'", "save [dict]")
    assert "wrap it" not in line


# -- 0-d arrays stay 0-d ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["npy", "npz", "pt"])
def test_a_0d_array_stays_0d(tmp_path: Path, model_file: tuple[Path, Path], fmt: str) -> None:
    model, seen = model_file
    value = np.array(3.5, dtype=np.float32)
    path = tmp_path / f"scalar.{fmt}"
    if fmt == "npy":
        np.save(path, value)
        expected = torch.from_numpy(np.load(path))
    elif fmt == "npz":
        np.savez(path, x=value)
        with np.load(path) as f:
            expected = torch.from_numpy(f["x"])
    else:
        torch.save(torch.tensor(3.5), path)
        expected = torch.load(path, weights_only=True)
    assert expected.shape == ()  # what numpy / torch give: no dimension
    report = invoke_json("inspect", f"{model}:Recorder", "--input-file", str(path))
    got = seen_by_forward(seen)["x"]
    assert got.shape == expected.shape and torch.equal(got, expected)
    assert report["inputs"][0]["shape"] == []


def test_a_fortran_ordered_array_keeps_its_shape_and_values(
    tmp_path: Path, model_file: tuple[Path, Path]
) -> None:
    model, seen = model_file
    value = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    path = tmp_path / "f.npy"
    np.save(path, value)
    invoke_json("inspect", f"{model}:Recorder", "--input-file", str(path))
    assert torch.equal(seen_by_forward(seen)["x"], torch.from_numpy(np.load(path).copy()))


def test_an_array_in_the_other_byte_order_arrives_in_native_order(
    tmp_path: Path, model_file: tuple[Path, Path]
) -> None:
    model, seen = model_file
    path = tmp_path / "be.npy"
    swapped = np.dtype(np.float32).newbyteorder("S")  # the byte order this host does not use
    np.save(path, (np.arange(5) / 3).astype(swapped))
    assert not np.load(path).dtype.isnative
    expected = torch.from_numpy(np.load(path).astype(np.float32))  # same numbers, native
    invoke_json("inspect", f"{model}:Recorder", "--input-file", str(path))
    got = seen_by_forward(seen)["x"]
    assert got.dtype == torch.float32 and torch.equal(got, expected)


# -- R14: a header claiming more data than the file holds is a corrupt file ----------


def _header_only(shape: tuple[int, ...], data: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


@pytest.mark.parametrize(
    "shape",
    [(10**6, 10**6), (2**62,), (10, 10)],  # terabytes, more than int64 bytes, 400 bytes
)
def test_npy_claiming_more_than_the_file_holds_is_corrupt(
    tmp_path: Path, model_file: tuple[Path, Path], shape: tuple[int, ...]
) -> None:
    model, _ = model_file
    path = tmp_path / "huge.npy"
    path.write_bytes(_header_only(shape, b"\0" * 32))
    claimed = 4 * int(np.prod(shape, dtype=object))
    assert path.stat().st_size < claimed  # the file cannot hold what its header says
    result = invoke("inspect", f"{model}:Recorder", "--input-file", str(path))
    one_error_line(result, 2, f"--input-file {path}", "corrupt file", f"{claimed:,} bytes")


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_npz_member_claiming_more_than_it_holds_is_corrupt(
    tmp_path: Path, model_file: tuple[Path, Path], compression: int
) -> None:
    model, _ = model_file
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        archive.writestr("x.npy", _header_only((10**6, 10**6), b"\0" * 32))
    result = invoke("inspect", f"{model}:Recorder", "--input-file", str(path))
    one_error_line(result, 2, f"--input-file {path}", "corrupt file", "'x'")


def test_an_npz_member_that_is_not_an_array_is_exit_2(
    tmp_path: Path, model_file: tuple[Path, Path]
) -> None:
    model, _ = model_file
    path = tmp_path / "raw.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.txt", b"hello")
    result = invoke("inspect", f"{model}:Recorder", "--input-file", str(path))
    one_error_line(result, 2, f"--input-file {path}", "not a NumPy array")


# -- R15: inputs nested deeper than the recursion limit ------------------------------


@pytest.mark.parametrize("command", ["inspect", "stats", "grads", "cost"])
def test_inputs_nested_past_the_recursion_limit(
    model_file: tuple[Path, Path], command: str
) -> None:
    model, seen = model_file
    report = invoke_json(
        command, f"{model}:Deep", "--inputs-from", f"{model}:deep_inputs", "--seed", "3"
    )
    got = seen_by_forward(seen)
    assert got["depth"] == DEPTH
    assert torch.equal(got["x"], torch.arange(3, dtype=torch.float32))
    assert report["inputs"] == [{"name": "x" + "[0]" * DEPTH, "shape": [3], "dtype": "float32"}]


def _nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


class _Unwrap(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.seen: list[tuple[int, torch.Tensor]] = []

    def forward(self, x: Any) -> torch.Tensor:
        depth = 0
        while isinstance(x, list):
            x, depth = x[0], depth + 1
        self.seen.append((depth, x))
        return self.fc(x)


def test_api_and_example_input_array_nested_past_the_recursion_limit() -> None:
    torch.manual_seed(0)
    model = _Unwrap().eval()
    x = torch.randn(4, 3)
    by_call = hookcli.inspect(model, _nest(x, DEPTH))
    model.example_input_array = (_nest(x, DEPTH),)  # the args: one input
    by_example = hookcli.inspect(model)
    assert [(d, torch.equal(t, x)) for d, t in model.seen] == [(DEPTH, True)] * 2
    for report in (by_call, by_example):
        assert report.inputs == (
            {"name": "x" + "[0]" * DEPTH, "shape": [4, 3], "dtype": "float32"},
        )
        rows = {r["name"]: r for r in report.layers}
        assert rows["fc"]["output_shapes"] == [[4, 2]]
