"""``-i`` spellings for inputs that are not one dense drawn tensor: a 0-d tensor
(``scalar`` / ``()``), a sparse COO tensor (``sparse:DIMS:DENSITY``), and a Python value
(``py:LITERAL``, with ``tensor("SPEC")`` / ``tensor(VALUE)`` inside).

Oracle: a plain torch script drawing from ``torch.Generator().manual_seed(N)`` in the order
the inputs are declared, as docs/reference.md "Seeding" writes it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hookcli.errors import UsageError
from hookcli.inputs.grammar import build_inputs, parse_spec
from tests.conftest import invoke, invoke_json, run_json


class Anything(nn.Module):
    def forward(self, *args, **kwargs):
        return args, kwargs


def _drawn(*texts: str, seed: int = 0, **options: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    got = build_inputs(Anything(), texts, seed=seed, **options)
    return got.args, dict(got.kwargs)


def _sparse(g: torch.Generator, dims: tuple[int, ...], density: float, dtype=torch.float32):
    numel = 1
    for d in dims:
        numel *= d
    flat = torch.randint(0, numel, (max(1, round(density * numel)),), generator=g).unique()
    values = torch.randn(flat.numel(), generator=g, dtype=dtype)
    indices = torch.stack(torch.unravel_index(flat, dims))
    return torch.sparse_coo_tensor(indices, values, dims, check_invariants=True)


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout
        if a.is_sparse:
            a, b = a.coalesce(), b.coalesce()
            assert torch.equal(a.indices(), b.indices())
            assert torch.equal(a.values(), b.values())
        else:
            assert torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b


def test_zero_d_tensors_match_plain_torch() -> None:
    args, _ = _drawn("2x3", "int64:scalar:3..9", "scalar", "int32:():0..5", seed=4)
    g = torch.Generator().manual_seed(4)
    x = torch.randn((2, 3), generator=g)
    i = torch.randint(3, 9, (), generator=g)
    f = torch.randn((), generator=g)
    j = torch.randint(0, 5, (), generator=g).to(torch.int32)
    _same(list(args), [x, i, f, j])
    assert args[1].dim() == 0


def test_sparse_matches_plain_torch() -> None:
    args, kwargs = _drawn("20x30", "sparse:20x20:0.05", "adj=sparse:float64:4x5", seed=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn((20, 30), generator=g)
    a = _sparse(g, (20, 20), 0.05)
    b = _sparse(g, (4, 5), 0.1, torch.float64)  # density 0.1 by default
    _same([*args, kwargs["adj"]], [x, a, b])
    assert args[1].is_sparse and args[1].is_coalesced()
    assert 0 < args[1]._nnz() <= 20


def test_python_values_and_structures_match_plain_torch() -> None:
    args, kwargs = _drawn(
        "int64:2x5:0..10",
        'py:[{"image": tensor("3x8x8"), "original_size": (8, 8), '
        '"point_labels": tensor("int64:1x2:1..2"), "adj": tensor("sparse:3x3:0.5")}, '
        '{"image": tensor("3x4x4"), "original_size": (4, 4), "fixed": tensor([1, 2], dtype="int32")}]',
        "start_pos=py:0",
        "multimask_output=py:False",
        "scale=py:-1.5e-3",
        "step=py:tensor(5)",
        "name=py:'x=y'",
        seed=9,
    )
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 10, (2, 5), generator=g)
    first = {
        "image": torch.randn((3, 8, 8), generator=g),
        "original_size": (8, 8),
        "point_labels": torch.randint(1, 2, (1, 2), generator=g),
        "adj": _sparse(g, (3, 3), 0.5),
    }
    second = {
        "image": torch.randn((3, 4, 4), generator=g),
        "original_size": (4, 4),
        "fixed": torch.tensor([1, 2], dtype=torch.int32),
    }
    _same(list(args), [ids, [first, second]])
    _same(
        kwargs,
        {
            "start_pos": 0,
            "multimask_output": False,
            "scale": -1.5e-3,
            "step": torch.tensor(5),
            "name": "x=y",
        },
    )


def test_dtype_casts_floating_tensors_in_structures_and_batch_leaves_them() -> None:
    args, _ = _drawn("4x3", 'py:{"a": tensor("2x2"), "n": 3, "f": tensor([0.5]), "i": tensor(2)}',
                     "int64:scalar:0..4", dtype="float64", batch_size=2)  # fmt: skip
    assert args[0].shape == (2, 3)
    assert args[1]["a"].shape == (2, 2) and args[1]["a"].dtype == torch.float64
    assert args[1]["f"].dtype == torch.float64 and args[1]["i"].dtype == torch.int64
    assert args[2].shape == ()


def test_meta_keeps_integer_values_and_makes_no_float_data() -> None:
    args, _ = _drawn('py:[tensor("2x2"), tensor("int64:3:0..9"), 7]', device="meta")
    assert args[0][0].is_meta and args[0][1].is_meta and args[0][2] == 7


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("py:[1, foo]", "neither a literal nor tensor"),
        ('py:__import__("os").system("true")', "neither a literal nor tensor"),
        ("py:1 + 2", "neither a literal nor tensor"),
        ("py:[1,", "not a Python literal"),
        ("py:{[1]: 2}", "not hashable"),
        ('py:{"a": tensor("2"), "a": 2}', "given twice"),
        ('py:tensor("py:1")', "the SPEC is"),
        ('py:tensor("2x2", dtype="int32")', "dtype inside the SPEC"),
        ("py:tensor('x')", "bad input spec"),
        ('py:tensor(["a"])', "takes a number"),
        ("py:tensor(1, 2)", "takes one argument"),
        ("py:" + "9" * 5000, "not a Python literal"),
        ("sparse:int64:3x3", "not floating"),
        ("sparse:3x3:2", "DENSITY must be"),
        ("sparse:3x3:x", "DENSITY must be"),
        ("sparse:scalar", "at least one dimension"),
        ("int64:scalarx2", "DIMS must be"),
    ],
)
def test_bad_spellings_are_usage_errors_showing_the_grammar(text: str, why: str) -> None:
    with pytest.raises(UsageError, match="bad input spec") as err:
        parse_spec(text)
    assert why in err.value.message
    assert "py:LITERAL" in err.value.message
    assert len(err.value.message.splitlines()[0]) < 1200  # the spec shortened, not echoed


def test_every_existing_spelling_still_parses_as_before() -> None:
    assert parse_spec("1,3,224,224").dims == (1, 3, 224, 224)
    s = parse_spec("mask=bool:2x16:1..2")
    assert (s.name, s.dtype, s.dims, s.low, s.high, s.kind) == (
        "mask",
        "bool",
        (2, 16),
        1,
        2,
        "dense",
    )
    assert parse_spec("long:4").dtype == "int64"
    with pytest.raises(UsageError, match="unknown dtype 'foo'"):
        parse_spec("foo:2x2")
    with pytest.raises(UsageError, match="not a Python identifier"):
        parse_spec("1x=2x2")


# -- from the command line, on models that take such inputs -----------------------------


def test_llama_start_pos_as_python_int_and_as_0d_tensor() -> None:
    model = "tests.fixtures.gradoff_models:tiny_llama"
    as_int = run_json("inspect", model, "-i", "int64:2x6:0..32", "-i", "py:3")  # a real process
    assert as_int["inputs"] == [{"name": "tokens", "shape": [2, 6], "dtype": "int64"}]
    as_tensor = invoke_json("inspect", model, "-i", "int64:2x6:0..32", "-i", "int64:scalar:3..4")
    assert as_tensor["inputs"][1] == {"name": "start_pos", "shape": [], "dtype": "int64"}
    # one forward, one logits: the same value either way (start_pos is 3 in both)
    assert as_int["layers"][0]["output_shapes"] == [[2, 6, 32]]
    a = invoke_json("stats", model, "-i", "int64:2x6:0..32", "-i", "py:3")
    b = invoke_json("stats", model, "-i", "int64:2x6:0..32", "-i", "int64:():3..4")
    assert a["layers"][0]["mean"] == b["layers"][0]["mean"]


def test_pygcn_takes_a_sparse_adjacency() -> None:
    from tests.fixtures.real_models import PyGCN

    report = invoke_json("stats", "tests.fixtures.real_models:PyGCN", "-i", "7x6",
                         "-i", "sparse:7x7:0.3", "--seed", "3")  # fmt: skip
    assert report["inputs"][1] == {"name": "adj", "shape": [7, 7], "dtype": "float32"}
    torch.manual_seed(3)
    model = PyGCN().eval()
    g = torch.Generator().manual_seed(3)
    x = torch.randn((7, 6), generator=g)
    adj = _sparse(g, (7, 7), 0.3).coalesce()
    with torch.no_grad():
        out = model(x, adj)
    assert report["layers"][0]["mean"] == pytest.approx(float(out.mean()), rel=1e-6)


def test_missing_argument_behind_a_decorator_is_exit_2_with_the_signature() -> None:
    result = invoke("inspect", "tests.fixtures.gradoff_models:tiny_llama", "-i", "int64:2x6:0..32")
    assert result.exit_code == 2
    assert "missing a required argument: 'start_pos'" in result.stderr
    assert "Transformer.forward(tokens, start_pos)" in result.stderr
    assert "_contextlib" not in result.stderr
