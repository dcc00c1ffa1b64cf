"""profile on models as their projects write them (issue 29, point 7).

Container rows and folded time are checked on synthetic stamps (exact sums, no clock);
backward spans on diffusers- and whisper-shaped models from the command line, by which
rows have them and how the spans nest (never by how long anything took).
"""

from __future__ import annotations

from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hookcli.profile.figures import CallTree, Timings
from hookcli.profile.rows import containers, table_rows
from tests.conftest import run_hookcli as hookcli
from tests.conftest import run_json as report

ROOT = Path(__file__).resolve().parent.parent
FIX = "tests/fixtures/cost_real.py"


# -- container rows and folding, on synthetic stamps ---------------------------------------------

# (root) -> encoder -> encoder.blocks.0, encoder.blocks.1 (in the ModuleList encoder.blocks,
# never called), encoder.conv; one pass, stamps in ns (1 ms = 1e6)
NAMES = ("", "encoder", "encoder.blocks.0", "encoder.blocks.1", "encoder.conv")
PARENTS = (-1, 0, 1, 1, 1)
STARTS = (0, 1_000_000, 2_000_000, 5_000_000, 9_000_000)
ENDS = (12_000_000, 11_000_000, 5_000_000, 9_000_000, 10_000_000)
TYPES = {
    "": "Model",
    "encoder": "Encoder",
    "encoder.blocks": "ModuleList",
    "encoder.blocks.0": "Block",
    "encoder.blocks.1": "Block",
    "encoder.conv": "Conv1d",
}


def _measured() -> Any:
    tree = CallTree(
        names=NAMES,
        types=tuple(TYPES[n] for n in NAMES),
        depths=tuple(0 if not n else n.count(".") + 1 for n in NAMES),
        parents=PARENTS,
        module_ids=tuple(range(len(NAMES))),
    )
    timings = Timings(tree, 1, array("q", STARTS), array("q", ENDS))
    probe = SimpleNamespace(call_cost=lambda i: SimpleNamespace(flops=10 * (i + 1)))
    return SimpleNamespace(tree=tree, timings=timings, probe=probe)


def _slot_rows(m: Any) -> list[dict[str, Any]]:
    t = m.timings
    return [
        {
            "name": n,
            "type": TYPES[n],
            "depth": m.tree.depths[i],
            "calls": 1,
            "forward_ms": t.incl[0][i] / 1e6,
            "forward_self_ms": t.self_[0][i] / 1e6,
            "flops": 10 * (i + 1),
        }
        for i, n in enumerate(NAMES)
    ]


def test_container_found_with_its_outermost_calls() -> None:
    m = _measured()
    (c,) = containers(m.tree, TYPES)
    assert (c.name, c.type, c.depth, c.top_calls) == ("encoder.blocks", "ModuleList", 2, (2, 3))


@pytest.mark.parametrize("depth", [None, 0, 1, 2, 3])
def test_self_times_of_shown_rows_add_up_to_the_root(depth: int | None) -> None:
    m = _measured()
    rows = table_rows(m, _slot_rows(m), backward=False, depth=depth, types=TYPES)
    by = {r["name"]: r for r in rows}
    blocks = by["encoder.blocks"]
    assert blocks["called"] is False and blocks["calls"] == 0
    assert blocks["forward_ms"] == 3.0 + 4.0  # the two blocks' inclusive times
    assert blocks["flops"] == 30 + 40
    shown = [r for r in rows if depth is None or r["depth"] <= depth]
    assert sum(r["forward_self_ms"] for r in shown) == pytest.approx(12.0)  # the root's
    if depth == 1:  # encoder carries its subtree
        assert by["encoder"]["folded"] and by["encoder"]["forward_self_ms"] == 10.0
    if depth == 2:  # the ModuleList row carries the blocks; encoder keeps its own self
        assert blocks["folded"] and blocks["forward_self_ms"] == 7.0
        assert by["encoder"]["forward_self_ms"] == 2.0 and not by["encoder"]["folded"]
    if depth is None:
        assert blocks["forward_self_ms"] == 0.0 and not any(r["folded"] for r in rows)


def test_whisper_depth_2_shows_the_blocks() -> None:
    rep = report("profile", f"{FIX}:WhisperLike", "-d", "2", "--warmup", "0", "--repeat", "1")
    rows = {r["name"]: r for r in rep["modules"]}
    for name in ("encoder.blocks", "decoder.blocks"):
        assert rows[name]["called"] is False and rows[name]["type"] == "ModuleList"
        assert rows[name]["folded"] is True
        assert rows[name]["forward_self_ms"] == rows[name]["forward_ms"]
        assert rows[name]["flops"] > 0
    assert all(r["depth"] <= 2 for r in rep["modules"])
    assert not any(n.startswith("encoder.blocks.") for n in rows)
    text = hookcli("profile", f"{FIX}:WhisperLike", "-d", "2", "--warmup", "0", "--repeat", "1")
    assert "encoder.blocks" in text.stdout and "folded" in text.stdout


def test_plot_draws_the_folded_rows(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "top.png"
    rep = report(
        "profile", f"{FIX}:WhisperLike", "-d", "2", "--warmup", "0", "--repeat", "1",
        "--plot", str(out),
    )  # fmt: skip
    assert out.stat().st_size > 0
    # the chart is drawn from the report's rows by self time: the containers are among them
    top = sorted(rep["modules"], key=lambda r: -r["forward_self_ms"])[:20]
    assert {"encoder.blocks", "decoder.blocks"} <= {r["name"] for r in top}


# -- backward through tuples, dicts, dataclasses, keyword inputs ------------------------------------


def test_unet_backward_for_tuple_dict_and_dataclass_outputs() -> None:
    rep = report("profile", f"{FIX}:UNetLike", "--backward", "--warmup", "1", "--repeat", "1")
    rows = {r["name"] or "(root)": r for r in rep["modules"]}
    # down_blocks.0: called with keywords, returns (h, (skip, skip)); mid_block a dict;
    # the root a dataclass: PyTorch's module backward hooks see none of them
    for name in ("down_blocks.0", "mid_block", "(root)", "down_blocks"):
        assert rows[name]["backward_ms"] is not None, name
    assert not [r for r in rep["modules"] if r["backward_ms"] is None]
    # the spans nest: a block's backward holds its layers' (one pass: exact stamps)
    parent = rows["down_blocks.0"]["backward_ms"]
    for child in ("conv1", "conv2", "temb", "down"):
        assert rows[f"down_blocks.0.{child}"]["backward_ms"] <= parent
    assert rows["(root)"]["backward_ms"] >= rows["down_blocks.0"]["backward_ms"]


def test_integer_input_module_timed_by_its_parameters() -> None:
    rep = report("profile", f"{FIX}:WhisperLike", "--backward", "--warmup", "0", "--repeat", "1")
    rows = {r["name"]: r for r in rep["modules"]}
    assert rows["decoder.token_embedding"]["backward_ms"] is not None
    assert not [r for r in rep["modules"] if r["backward_ms"] is None]


def test_no_backward_time_is_explained() -> None:
    args = ("profile", f"{FIX}:TwoLookups", "--backward", "--warmup", "0", "--repeat", "1")
    rep = report(*args)
    rows = {r["name"] or "(root)": r for r in rep["modules"]}
    assert rows["mask"]["backward_ms"] == 0.0  # nothing of it runs in backward
    assert rows["embed"]["backward_ms"] is None
    assert "serve several calls" in rows["embed"]["backward_why"]
    assert rows["(root)"]["backward_ms"] is not None
    assert rows["(root)"]["backward_self_why"]
    for r in rep["modules"]:
        assert r["backward_ms"] is not None or r.get("backward_why"), r["name"]
    text = hookcli(*args).stdout
    assert "no backward time for embed: none of its input tensors needs a gradient" in text
