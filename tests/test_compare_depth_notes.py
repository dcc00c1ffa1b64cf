"""`hookcli compare`: --print-map rules that round-trip through --map-file, --depth, and the
notes in every format. Models for the CLI are loaded as tests.test_compare_depth_notes:NAME.

Oracles: the pairs of an `--align order` run (what --print-map writes must pair the same
way), and plain PyTorch hooks for the figures of a row that --depth folds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from tests.conftest import invoke, invoke_json

M = "tests.test_compare_models"
HERE = "tests.test_compare_depth_notes"


# -- models (as a port writes them: a renamed tree, an extra input) ----------------------------


class Enc(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        return self.out(torch.relu(self.fc(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = Enc()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.enc(x))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        return self.out(torch.relu(self.proj(x)))


class Ported(nn.Module):
    """Net with ``enc`` renamed ``encoder`` and ``enc.fc`` renamed ``encoder.proj``."""

    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.encoder(x))


class Scale(nn.Module):
    def forward(self, x, y=None):
        return x * 2 if y is None else x + y


class Two(nn.Module):
    """``f`` gets one tensor, or with ``extra`` two: B's call cannot be fed A's input."""

    def __init__(self, extra=False):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.f = Scale()
        self.extra = extra

    def forward(self, x):
        h = self.lin(x)
        return self.f(h, h) if self.extra else self.f(h)


# -- --print-map round-trips through --map-file --------------------------------------------------


def _pairs(report: dict) -> dict[tuple[str, int], tuple[str | None, int | None]]:
    return {(r["name"], r["call"]): (r["partner"], r["partner_call"]) for r in report["calls"]}


def _round_trip(tmp_path: Path, a: str, b: str, *args: str) -> tuple[dict, dict, str, str]:
    """The --align order run's pairs (the oracle), the map it prints, and the pairs of the
    run given that map."""
    oracle = _pairs(invoke_json("compare", a, b, *args, "--align", "order"))
    printed = invoke("compare", a, b, *args, "--align", "order", "--print-map")
    assert printed.exit_code == 0, printed.stderr
    path = tmp_path / "map.txt"
    path.write_text(printed.stdout)
    mapped = _pairs(invoke_json("compare", a, b, *args, "--map-file", str(path)))
    return oracle, mapped, printed.stdout, printed.stderr


def test_print_map_round_trips_torchvision_against_timm_resnet(tmp_path: Path) -> None:
    """torchvision's BasicBlock calls one ``relu`` twice; timm's has ``act1`` and ``act2``:
    no rule pairs call 0 and call 1 of one module with two modules, so the map leaves
    those modules out and names them, and everything else it pairs as --align order does."""
    oracle, mapped, text, err = _round_trip(
        tmp_path, "resnet18", "timm:resnet18", "-i", "1x3x64x64"
    )
    partners: dict[str, set[tuple[str | None, bool]]] = {}
    for (name, call), (partner, pcall) in oracle.items():
        if partner is not None:
            partners.setdefault(name, set()).add((partner, pcall == call))
    split = {n for n, ps in partners.items() if len(ps) > 1 or not all(same for _, same in ps)}
    assert split == {f"layer{i}.{j}.relu" for i in range(1, 5) for j in range(2)}
    named = set(re.findall(r"^#   (\S+):", text, re.M))
    assert named == split, text
    assert "--align order" in err and "layer1.0.relu" in err
    rules = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    lefts = [ln.partition("=")[0] for ln in rules]
    assert len(lefts) == len(set(lefts)), rules  # no two rules for one pattern
    covered = [k for k in oracle if k[0] not in split]
    assert covered and all(mapped[k] == oracle[k] for k in covered), [
        (k, oracle[k], mapped[k]) for k in covered if mapped[k] != oracle[k]
    ]
    aligned = sum(1 for k in covered if oracle[k][0] is not None)
    assert f"these rules pair {aligned} of them" in text.splitlines()[0]


def test_print_map_puts_a_child_rule_before_its_parents(tmp_path: Path) -> None:
    """``enc=encoder`` also sends ``enc.fc`` to ``encoder.fc``: the rule for ``enc.fc``
    must come first, or the map pairs it with nothing."""
    oracle, mapped, text, _ = _round_trip(tmp_path, f"{HERE}:Net", f"{HERE}:Ported", "-i", "2x8")
    assert oracle[("enc.fc", 0)] == ("encoder.proj", 0)
    assert mapped == oracle, text
    assert "left out" not in text


def test_print_map_needs_no_rule_for_calls_the_names_pair_by_place(tmp_path: Path) -> None:
    """B calls r on the b branch first: the names pair A's r #0 with B's r #1 by place
    (plain hooks: the same values), so the map leaves nothing out, advises nothing, and
    pairs as the names alignment does."""
    from tests.test_compare_inputs import Order, _plain_calls

    torch.manual_seed(0)
    ra = _plain_calls(Order().eval(), "r")
    torch.manual_seed(0)
    rb = _plain_calls(Order(swap=True).eval(), "r")
    assert torch.equal(ra[0], rb[1]) and torch.equal(ra[1], rb[0])
    args = ("compare", "tests.test_compare_inputs:Order", "tests.test_compare_inputs:Order",
            "--b-kwargs", "swap=True")  # fmt: skip
    printed = invoke(*args, "--print-map")
    assert printed.exit_code == 0, printed.stderr
    assert "left out" not in printed.stdout and "--align order" not in printed.stderr
    path = tmp_path / "map.txt"
    path.write_text(printed.stdout)
    mapped = _pairs(invoke_json(*args, "--map-file", str(path)))
    assert mapped[("r", 0)] == ("r", 1) and mapped[("r", 1)] == ("r", 0)


# -- --depth -------------------------------------------------------------------------------------


def test_depth_folds_rows_and_a_folded_row_shows_what_its_subtree_adds() -> None:
    """--depth 2 on the decoder with block 1's attention unscaled: rows stop at the blocks;
    h.1's local error is its whole subtree's (B's block on A's input to it, from plain
    hooks), and the totals and first divergence still cover every call."""
    args = ["compare", f"{M}:Decoder", f"{M}:Decoder", "--b-kwargs", "bug='scale'"]
    full = invoke_json(*args)
    report = invoke_json(*args, "--depth", "2")
    assert {r["depth"] for r in report["calls"]} == {0, 1, 2}
    assert [r["name"] for r in report["calls"]] == [
        r["name"] for r in full["calls"] if r["depth"] <= 2
    ]
    assert report["totals"]["calls_a"] == full["totals"]["calls_a"] > len(report["calls"])
    assert report["first_divergence"]["module"] == "h.1.attn"  # a call the rows hide
    assert report["settings"]["depth"] == 2
    from tests.test_compare_models import Decoder

    torch.manual_seed(0)
    a = Decoder().eval()
    x = a.example_input_array
    torch.manual_seed(0)
    b = Decoder(bug="scale").eval()
    seen: dict[str, torch.Tensor] = {}
    handle = a.h[1].register_forward_hook(
        lambda m, args, out: seen.update(inp=args[0].clone(), out=out.clone())
    )
    try:
        with torch.no_grad():
            a(x)
    finally:
        handle.remove()
    with torch.no_grad():
        mine = b.h[1](seen["inp"])
    ref, got = seen["out"].double(), mine.double()
    expected = float((got - ref).norm() / ref.norm())
    rows = {r["name"]: r for r in report["calls"]}
    assert expected > 0.01
    assert abs(rows["h.1"]["local_rel_l2"] - expected) <= 1e-6 * expected
    assert rows["h.0"]["local_rel_l2"] == 0 and rows["h.2"]["local_rel_l2"] == 0
    assert {r["name"]: r["local_rel_l2"] for r in full["calls"]}["h.1"] == 0  # unfolded
    assert report["first_divergence_local"]["module"] == "h.1"
    table = invoke(*args, "--depth", "2")
    assert table.exit_code == 0, table.stderr
    line = next(ln for ln in table.stdout.splitlines() if ln.strip().startswith("h.1 "))
    assert "first divergence inside" in line
    assert "h.1.attn " not in table.stdout.split("Aligned:")[0]  # no row below depth 2


# -- notes in JSON and Markdown; settings.map ----------------------------------------------------


def _check(report: dict) -> None:
    import hookcli.schema

    hookcli.schema.validate(report)


def test_idle_vs_note_is_in_json_and_markdown() -> None:
    note = "--vs seed=5 changes nothing here"
    args = ["compare", f"{M}:MLPNet", "--vs", "seed=5", "-i", "2x16"]
    table = invoke(*args)
    assert note in table.stdout
    report = invoke_json(*args)
    _check(report)
    assert any(n.startswith(note) for n in report["notes"]), report["notes"]
    md = invoke(*args, "-f", "markdown")
    assert md.exit_code == 0, md.stderr
    assert any(ln.startswith(f"- {note}") for ln in md.stdout.splitlines()), md.stdout[:800]


def test_map_rules_and_their_notes_are_in_json(tmp_path: Path) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("# saved\nfc3=last\n\nact=relu\n")
    report = invoke_json(
        "compare", f"{M}:MLPNet", "tests.test_compare:Renamed", "-i", "4x16",
        "--map", "fc1=nosuch", "--map", "fc2=middle", "--map-file", str(rules),
    )  # fmt: skip
    _check(report)
    assert report["settings"]["map"] == ["fc1=nosuch", "fc2=middle", "fc3=last", "act=relu"]
    said = [n for n in report["notes"] if "'fc1=nosuch'" in n]
    assert len(said) == 1 and "its right side matches no module B called" in said[0]


def test_local_kept_inputs_note_is_in_json() -> None:
    args = ["compare", f"{HERE}:Two", f"{HERE}:Two", "--b-kwargs", "extra=True", "-i", "2x16"]
    table = invoke(*args)
    assert table.exit_code == 0, table.stderr
    report = invoke_json(*args)
    _check(report)
    kept = [n for n in report["notes"] if "kept their own inputs" in n]
    assert len(kept) == 1 and kept[0] in table.stdout
    assert kept[0].startswith("local mode: 1 call(s) of B")
    md = invoke(*args, "-f", "markdown").stdout
    assert f"- {kept[0]}" in md.splitlines()


def test_every_table_note_is_in_json() -> None:
    """The table's lines between its header and the rows are the JSON's notes, in order."""
    args = ["compare", f"{M}:MLPNet", "--vs", "dtype=float32", "--vs", "seed=3", "-i", "4x16"]
    table = invoke(*args).stdout.splitlines()
    report = json.loads(invoke(*args, "-f", "json").stdout)
    assert table[1 : table.index("")] == report["notes"]
    assert len(report["notes"]) == 4


def test_depth_marks_the_row_above_a_hidden_failed_call() -> None:
    result = invoke(
        "compare", "tests.test_compare_failure:Chain", "tests.test_compare_failure:Chain",
        "--b-kwargs", "bad=True", "-i", "2x4", "--depth", "0",
    )  # fmt: skip
    assert result.exit_code == 4, result.stderr
    rows = result.stdout.split("---\n", 1)[1].split("\n\n")[0].splitlines()
    assert len(rows) == 1 and rows[0].startswith("(root) <- failed inside (B)"), rows
