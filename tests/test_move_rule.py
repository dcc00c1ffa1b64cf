"""One rule for moving inputs, whatever their source (issue 28): drawn inputs and
``example_input_array`` (``inputs.grammar._move``) and ``--input-file`` /
``--inputs-from`` (``inputs.files.move``) rebuild the same containers the same way.

Checked against the values themselves: every tensor of the result is on the target
device (``meta`` here), floating ones in the asked dtype, integer ones untouched, and
each container keeps its own type and what it carries beside its items."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple
from typing import Any

import pytest
import torch

from hookcli.inputs.files import move as files_move
from hookcli.inputs.grammar import _move as drawn_move
from hookcli.structures import iter_named_tensors

META = torch.device("meta")
Pair = namedtuple("Pair", "a b")


class TaggedList(list):  # type: ignore[type-arg]
    def __init__(self, items: Any, tag: str) -> None:  # a constructor that is not list's
        super().__init__(items)
        self.tag = tag


class TaggedDict(dict):  # type: ignore[type-arg]
    tag = "class"


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    n: int = 3


@dataclasses.dataclass
class WithDerived:
    x: torch.Tensor
    cached: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.cached = self.x * 2


def values() -> dict[str, Any]:
    t = torch.ones(2, 3)
    ints = torch.arange(4)
    tagged_dict = TaggedDict(w=t)
    tagged_dict.extra = "kept"  # type: ignore[attr-defined]
    factory: defaultdict[str, Any] = defaultdict(list, {"w": t})
    return {
        "list subclass": TaggedList([t, ints], tag="mine"),
        "dict subclass": tagged_dict,
        "defaultdict": factory,
        "OrderedDict": OrderedDict([("b", t), ("a", ints)]),
        "namedtuple": Pair(t, [ints, {"k": t}]),
        "frozen dataclass": Frozen(t),
        "dataclass with an init=False field": WithDerived(t),
        "torch.Size beside a tensor": (torch.Size([2, 3]), t),
    }


@pytest.mark.parametrize("name", list(values()))
@pytest.mark.parametrize("mover", [drawn_move, files_move], ids=["drawn", "file"])
def test_every_tensor_moves_and_containers_keep_their_type(name: str, mover: Any) -> None:
    value = values()[name]
    moved = mover(value, META, torch.float16)
    before = list(iter_named_tensors(value, "x"))
    after = list(iter_named_tensors(moved, "x"))
    assert [p for p, _ in after] == [p for p, _ in before], name
    for (path, old), (_, new) in zip(before, after, strict=True):
        assert new.device == META, (name, path)
        assert new.shape == old.shape, (name, path)
        want = torch.float16 if old.is_floating_point() else old.dtype
        assert new.dtype == want, (name, path)
    assert type(moved) is type(value), name
    for (_, old), _t in zip(before, after, strict=True):
        assert old.device.type == "cpu"  # the caller's value is left as it was


def test_what_a_container_carries_beside_its_items_is_kept() -> None:
    v = values()
    moved = drawn_move(v["list subclass"], META, None)
    assert moved.tag == "mine"
    moved = files_move(v["dict subclass"], META, None)
    assert moved.extra == "kept" and isinstance(moved, TaggedDict)
    moved = files_move(v["defaultdict"], META, None)
    assert moved.default_factory is list and moved["new"] == []
    moved = drawn_move(v["OrderedDict"], META, None)
    assert list(moved) == ["b", "a"]
    moved = files_move(v["frozen dataclass"], META, None)
    assert moved.n == 3
    moved = drawn_move(v["torch.Size beside a tensor"], META, None)
    assert moved[0] == torch.Size([2, 3])


def test_both_sources_give_the_same_result() -> None:
    for name, value in values().items():
        a = drawn_move(value, META, None)
        b = files_move(value, META, None)
        assert type(a) is type(b), name
        assert [(p, t.device, t.dtype) for p, t in iter_named_tensors(a, "x")] == [
            (p, t.device, t.dtype) for p, t in iter_named_tensors(b, "x")
        ], name
