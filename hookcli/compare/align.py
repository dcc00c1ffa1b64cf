"""Which call of B answers which call of A.

Three ways, tried in this order (``--align auto``):

- ``--map 'A_PATTERN=B_PATTERN'`` rules: ``{i}`` (also ``{j}``, ``{k}``, ``{n}``) matches
  an index, any other ``{word}`` one name component; a rule also maps the modules under
  a matched name (``transformer.h.{i}=model.layers.{i}`` sends ``transformer.h.0.mlp``
  to ``model.layers.0.mlp``);
- the same qualified name;
- the call sequences, aligned like a diff (``difflib.SequenceMatcher``) on
  (type, output shapes) tokens, then, inside each stretch that differs, on output
  shapes alone (a Linear against a transformers Conv1D), then on type alone (an
  Embedding whose output has a leading 1 on one side).

A module called several times is paired call by call: for names and rules, each call of
A with B's call at the same place (the partner of its parent call, after the partner of
the call before it there), else A's call k with B's call k; in sequence order otherwise.
Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hookcli.errors import UsageError

METHODS = ("auto", "names", "order")
_INDEX = frozenset("ijkn")


@dataclass(frozen=True)
class CallInfo:
    """One module call of a side, as the alignment sees it."""

    index: int  # the order calls began
    name: str
    type: str
    call: int
    depth: int
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    parent: int | None = None  # the call it ran inside (its index; None: none)


@dataclass(frozen=True)
class Rule:
    """``A_PATTERN=B_PATTERN``."""

    text: str
    a: str
    b: str
    regex: re.Pattern[str]

    def apply(self, name: str) -> str | None:
        """B's name for A's ``name`` (or a module under it), or None."""
        m = self.regex.match(name)
        if m is None:
            return None
        rest = name[m.end() :]
        out = self.b
        for key, value in m.groupdict().items():
            out = out.replace("{" + key + "}", value)
        if not out:
            return rest.removeprefix(".")
        return out + rest


def _root(text: str) -> str:
    return "" if text.strip() == "(root)" else text.strip()


def parse_rule(text: str) -> Rule:
    """``'transformer.h.{i}.attn=model.layers.{i}.self_attn'`` -> Rule (exit 2 if malformed)."""
    a, sep, b = text.partition("=")
    if not sep or "=" in b:
        raise UsageError(f"--map {text!r}: write A_PATTERN=B_PATTERN (one '=')")
    for side, part in (("left", a), ("right", b)):
        if not part.strip():
            raise UsageError(
                f"--map {text!r}: the {side} side is empty; write (root) for the model itself"
            )
    a, b = _root(a), _root(b)
    names_a = re.findall(r"\{(\w+)\}", a)
    names_b = re.findall(r"\{(\w+)\}", b)
    if len(set(names_a)) != len(names_a):
        raise UsageError(f"--map {text!r}: a placeholder appears twice on the left")
    missing = sorted(set(names_b) - set(names_a))
    if missing:
        raise UsageError(f"--map {text!r}: {{{missing[0]}}} on the right is not on the left")
    pattern = ""
    pos = 0
    for m in re.finditer(r"\{(\w+)\}", a):
        pattern += re.escape(a[pos : m.start()])
        key = m.group(1)
        pattern += f"(?P<{key}>\\d+)" if key in _INDEX else f"(?P<{key}>[^.]+)"
        pos = m.end()
    pattern += re.escape(a[pos:])
    # the name itself, or a module under it
    regex = re.compile(f"^{pattern}(?=$|\\.)" if a else "^$")
    return Rule(text, a, b, regex)


def parse_rules(texts: Sequence[str]) -> tuple[Rule, ...]:
    out = []
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(parse_rule(line))
    return tuple(out)


def map_name(name: str, rules: Sequence[Rule]) -> tuple[str, str]:
    """(B's name, how): by the first rule that matches, else the same name."""
    for rule in rules:
        target = rule.apply(name)
        if target is not None:
            return target, "rule"
    return name, "name"


@dataclass(frozen=True)
class Alignment:
    """A's call index -> B's call index, how each pair was found, and who has no partner."""

    method: str  # names | order
    pairs: dict[int, int]
    how: dict[int, str]  # name | rule | order | shapes | type
    unaligned_a: tuple[int, ...]
    unaligned_b: tuple[int, ...]
    notes: tuple[str, ...] = ()  # --map rules that matched no call
    # A's calls of a module called several times paired by call number though their
    # places differ (another parent call, other input shapes): compared, never named
    # the first divergence
    doubtful: frozenset[int] = frozenset()
    # pairs in which a call never returned (a failed pass): compared never, but where
    # B's failing call sits among A's calls
    opened_pairs: dict[int, int] = dataclasses.field(default_factory=dict)


def _places(calls: Sequence[CallInfo]) -> dict[int, tuple[int | None, int | None]]:
    """Each call's place: (its parent call, the call before it among the parent's)
    (indices; None: the root, the first)."""
    out: dict[int, tuple[int | None, int | None]] = {}
    last: dict[int | None, int] = {}  # parent -> its latest child
    for c in sorted(calls, key=lambda c: c.index):
        out[c.index] = (c.parent, last.get(c.parent))
        last[c.parent] = c.index
    return out


def _at_place(
    c: CallInfo,
    same: CallInfo | None,
    by_place: dict[tuple[int | None, int | None], list[CallInfo]],
    taken: set[int],
    pairs: dict[int, int],
    place_a: dict[int, tuple[int | None, int | None]],
    place_b: dict[int, tuple[int | None, int | None]],
) -> tuple[CallInfo | None, str | None]:
    """B's call for A's call ``c`` of a module called several times, and what differs
    where it falls back to the call number: B's call at the same place with the same
    input shapes (``same``, B's call of the same number, first); else the first call of
    B, not yet paired, in the partner of the parent with the same input shapes (among
    calls alike, the order kept); else ``same``, with ``"parent"`` where it sits in
    another parent call than the partner of c's, or ``"shapes"`` where its input shapes
    differ from c's. The call before c is the nearest earlier one in its parent call that
    has a partner (a call A alone makes there is skipped). Where c's parent call has no
    partner, ``same``: no place to match."""
    parent, before = place_a[c.index]
    if parent is not None and parent not in pairs:
        return same, None
    want_parent = None if parent is None else pairs[parent]
    while before is not None and before not in pairs:  # (a call of A's alone: e in r(e(a)))
        before = place_a[before][1]  # the nearest earlier call there that has a partner
    want_before = None if before is None else pairs[before]

    def shaped(d: CallInfo) -> bool:
        return d.input_shapes == c.input_shapes

    at = [
        d
        for d in by_place.get((want_parent, want_before), ())
        if d.index not in taken and shaped(d)
    ]
    if same is not None and same in at:
        return same, None
    if at:
        return min(at, key=lambda d: d.index), None
    fits = [
        d
        for (p, _), ds in by_place.items()
        if p == want_parent
        for d in ds
        if d.index not in taken and shaped(d)
    ]
    if same is not None and same in fits:
        return same, None
    if fits:
        return min(fits, key=lambda d: d.index), None
    if same is None:
        return None, None
    if place_b[same.index][0] != want_parent:
        return same, "parent"
    return same, None if shaped(same) else "shapes"


def _by_names(
    calls_a: Sequence[CallInfo],
    calls_b: Sequence[CallInfo],
    rules: Sequence[Rule],
    opened: tuple[Sequence[CallInfo], Sequence[CallInfo]] = ((), ()),
) -> tuple[dict[int, int], dict[int, str], list[str], set[int], dict[int, int]]:
    """A's call -> B's of the name the rules (or the same name) give. A module called
    once on each side pairs at once; a module called several times pairs each call of A
    with B's call at the same place (its parent call's partner, after the partner of the
    call before it there), so that B calling them in another order (``r(b(x))`` before
    ``r(a(x))``) pairs the calls that do the same work; a call with no such match pairs
    by call number, as before, and where the places then differ (other parents, other
    input shapes) it is ``doubtful``. Also the notes saying both. ``opened``: each
    side's calls that never returned (a failed pass): paired as places (the parent calls
    of those that returned inside them), never in the pairs returned."""
    unfinished = {c.index for c in opened[0]}, {c.index for c in opened[1]}
    calls_a = sorted([*calls_a, *opened[0]], key=lambda c: c.index)
    calls_b = sorted([*calls_b, *opened[1]], key=lambda c: c.index)
    b_at = {(c.name, c.call): c for c in calls_b}
    count_a: dict[str, int] = {}
    for c in calls_a:
        count_a[c.name] = count_a.get(c.name, 0) + 1
    place_a, place_b = _places(calls_a), _places(calls_b)
    # B's calls by name, then by place (parent call, the call before it there)
    by_name_b: dict[str, dict[tuple[int | None, int | None], list[CallInfo]]] = {}
    count_b: dict[str, int] = {}
    for c in calls_b:
        by_name_b.setdefault(c.name, {}).setdefault(place_b[c.index], []).append(c)
        count_b[c.name] = count_b.get(c.name, 0) + 1
    pairs: dict[int, int] = {}
    how: dict[int, str] = {}
    taken: set[int] = set()
    moved: dict[str, list[tuple[int, int]]] = {}
    differ: dict[tuple[str, str], list[int]] = {}  # (name, what) -> A's call numbers
    doubtful_a: set[int] = set()
    for c in sorted(calls_a, key=lambda c: c.index):  # parents, earlier siblings first
        target, kind = map_name(c.name, rules)
        same = b_at.get((target, c.call))
        if same is not None and same.index in taken:
            same = None
        pick = same
        if count_a[c.name] > 1 or count_b.get(target, 0) > 1:
            by_place = by_name_b.get(target, {})
            pick, what = _at_place(c, same, by_place, taken, pairs, place_a, place_b)
            if what is not None:
                differ.setdefault((c.name, what), []).append(c.call)
                if what == "parent":
                    doubtful_a.add(c.index)
        if pick is None:
            continue
        if pick.call != c.call and not {c.index, pick.index} & set().union(*unfinished):
            moved.setdefault(c.name, []).append((c.call, pick.call))
        pairs[c.index] = pick.index
        how[c.index] = kind
        taken.add(pick.index)
    opened_pairs: dict[int, int] = {}
    for i, j in list(pairs.items()):  # (a call that never returned: nothing to compare)
        if i in unfinished[0] or j in unfinished[1]:
            opened_pairs[i] = j
            del pairs[i], how[i]
            doubtful_a.discard(i)
    notes = []
    for name, moves in moved.items():
        pairs_text = ", ".join(f"A's #{i} <-> B's #{j}" for i, j in moves)
        notes.append(
            f"{name or '(root)'}: B calls it in another order; its calls are paired by their "
            f"place in the parent call (after the same call there), not by number: {pairs_text}"
        )
    for (name, what), calls in differ.items():
        numbers = ", ".join(f"#{i}" for i in calls)
        if what == "parent":
            notes.append(
                f"{name or '(root)'}: call(s) {numbers} paired by number, though B's runs in "
                "another parent call than A's (another call order?): compared, but never "
                "named the first divergence; check with --align order or --map"
            )
        else:
            notes.append(
                f"{name or '(root)'}: call(s) {numbers} paired by number, though A's and B's "
                "differ in their input shapes and no call of B at that place matches them"
            )
    return pairs, how, notes, doubtful_a, opened_pairs


_LEVELS = ("type+shapes", "shapes", "type")


def _token(c: CallInfo, level: int) -> tuple[object, ...]:
    if level == 0:
        return (c.type, c.output_shapes)
    if level == 1:
        return (c.output_shapes,)
    return (c.type,)


def _match(
    calls_a: Sequence[CallInfo],
    calls_b: Sequence[CallInfo],
    level: int,
    pairs: dict[int, int],
    how: dict[int, str],
) -> None:
    """Equal stretches pair; each stretch that differs on both sides is matched again on
    the next, looser token (type and shapes, then shapes, then type)."""
    ta = [_token(c, level) for c in calls_a]
    tb = [_token(c, level) for c in calls_b]
    matcher = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                pairs[calls_a[i1 + k].index] = calls_b[j1 + k].index
                how[calls_a[i1 + k].index] = "order" if level == 0 else _LEVELS[level]
        elif tag == "replace" and level + 1 < len(_LEVELS):
            _match(calls_a[i1:i2], calls_b[j1:j2], level + 1, pairs, how)


def _by_order(
    calls_a: Sequence[CallInfo], calls_b: Sequence[CallInfo]
) -> tuple[dict[int, int], dict[int, str]]:
    pairs: dict[int, int] = {}
    how: dict[int, str] = {}
    _match(calls_a, calls_b, 0, pairs, how)
    return pairs, how


def _check_rules(
    calls_a: Sequence[CallInfo], calls_b: Sequence[CallInfo], rules: Sequence[Rule]
) -> tuple[str, ...]:
    """A line for each rule that matches no module this run of A calls, or sends A's
    matches to no module B calls: a saved rule gone stale, or one for a branch this run
    does not take (a module called only in train mode), said rather than refused."""
    names_a = list(dict.fromkeys(c.name for c in calls_a))  # in call order
    names_b = {c.name for c in calls_b}
    notes = []
    for rule in rules:
        sent = [(name, t) for name in names_a if (t := rule.apply(name)) is not None]
        if not sent:
            notes.append(f"--map {rule.text!r}: its left side matches no module A called")
        elif not any(t in names_b for _, t in sent):
            name, target = sent[0]
            notes.append(
                f"--map {rule.text!r}: its right side matches no module B called (A's "
                f"{name or '(root)'} would be B's {target or '(root)'})"
            )
    return tuple(notes)


def align(
    calls_a: Sequence[CallInfo],
    calls_b: Sequence[CallInfo],
    rules: Sequence[Rule] = (),
    method: str = "auto",
    stopped: bool = False,
    opened: tuple[Sequence[CallInfo], Sequence[CallInfo]] = ((), ()),
) -> Alignment:
    """Pair the calls: ``names`` (rules, then same names), ``order`` (the sequences), or
    ``auto``: names where they pair at least half of A's calls (or rules are given),
    else order. ``stopped``: a side's run stopped (the model raised): half of the shorter
    side's calls. ``opened``: the calls of a failed pass that never returned (A's, B's),
    which place the calls that returned inside them."""
    if method not in METHODS:
        raise UsageError(f"--align must be one of {', '.join(METHODS)}, got {method!r}")
    notes = _check_rules(calls_a, calls_b, rules)
    pairs, how, order_notes, doubtful, opened_pairs = _by_names(calls_a, calls_b, rules, opened)
    used = "names"
    base = min(len(calls_a), len(calls_b)) if stopped else len(calls_a)
    enough = bool(rules) or 2 * len(pairs) >= base
    if method == "order" or (method == "auto" and not enough):
        pairs, how = _by_order(calls_a, calls_b)
        used = "order"
        order_notes, doubtful = [], set()
    taken = set(pairs.values())
    return Alignment(
        method=used,
        pairs=pairs,
        how=how,
        unaligned_a=tuple(c.index for c in calls_a if c.index not in pairs),
        unaligned_b=tuple(c.index for c in calls_b if c.index not in taken),
        notes=(*notes, *order_notes),
        doubtful=frozenset(doubtful),
        opened_pairs=opened_pairs if used == "names" else {},
    )


def check_print_map(gates: Sequence[str], fmt: str) -> None:
    """``--print-map`` prints the alignment as ``--map`` rules (text for ``--map-file``)
    and compares nothing: ``--fail-on`` cannot be checked and ``-f`` has nothing to shape."""
    if gates:
        raise UsageError(
            f"--print-map prints the alignment only, so --fail-on {','.join(gates)} cannot be "
            "checked: drop one of them"
        )
    if fmt != "table":
        raise UsageError(
            f"--print-map writes --map rules as text (for --map-file), not -f {fmt}: drop -f "
            "(the JSON report's calls hold each pair as name and partner)"
        )


def rules_from_pairs(pairs: Sequence[tuple[str, str]], keep: Sequence[str] = ()) -> list[str]:
    """``--map`` rules that reproduce the module pairs: indices generalised to ``{i}`` where
    the same indices appear on both sides in the same order; pairs with equal names left out
    (the names already pair them) unless ``keep`` names them, and the modules of ``keep``
    given a literal rule of their own. The deeper rules come first (the first rule that
    matches wins, and a rule also maps the modules under its name), a literal before a
    pattern of its depth."""
    lines: list[str] = []
    seen: dict[str, str] = {}
    literal: list[str] = []
    for a, b in pairs:
        if a == b and a not in keep:
            continue
        ta, tb = _template(a, b)
        if a in keep or ta is None or tb is None or seen.get(ta, tb) != tb:
            literal.append(f"{a or '(root)'}={b or '(root)'}")
            continue
        if ta not in seen:
            seen[ta] = tb
            lines.append(f"{ta or '(root)'}={tb or '(root)'}")
    out = lines + [line for line in literal if line not in lines]

    def key(line: str) -> tuple[int, bool]:
        left = _root(line.partition("=")[0])
        return (-(left.count(".") + 1 if left else 0), "{" in left)

    return sorted(out, key=key)


def _label(name: str, call: int) -> str:
    return (name or "(root)") + (f" #{call}" if call else "")


def print_map(
    calls_a: Sequence[CallInfo], calls_b: Sequence[CallInfo], alignment: Alignment
) -> tuple[str, list[str]]:
    """The alignment as ``--map`` rules (``--print-map``'s text, for ``--map-file``) and a
    note for stderr. A rule pairs call k of one of A's modules with call k of one module
    of B: a module whose calls pair otherwise (torchvision's one ReLU per block, called
    twice, against timm's act1 and act2) is left out, named in ``#`` lines; one whose calls
    pair with the calls of B's module of its name, in another order, needs no rule (the
    names pair it by place, as the alignment does). The rules are
    tried on the two call sequences before they are printed: every module they cover
    (by a rule or by its name) pairs as the alignment pairs it."""
    by_b = {c.index: c for c in calls_b}
    calls_of: dict[str, list[CallInfo]] = {}
    for c in calls_a:
        calls_of.setdefault(c.name, []).append(c)
    target: dict[str, str] = {}
    left_out: dict[str, str] = {}
    by_place: dict[str, str] = {}  # paired with B's module of its name, at other numbers
    for name, cs in calls_of.items():
        got = [(c.call, by_b[j]) for c in cs if (j := alignment.pairs.get(c.index)) is not None]
        if not got:
            continue
        what = ", ".join(f"#{k} with {_label(b.name, b.call)}" for k, b in got)
        if len({b.name for _, b in got}) == 1 and all(k == b.call for k, b in got):
            target[name] = got[0][1].name
        elif all(b.name == name for _, b in got):
            by_place[name] = what  # the names pair them by place: no rule needed
        else:
            left_out[name] = what
    covered = dict(target)
    keep: list[str] = []  # modules a pattern or a shorter rule sends elsewhere: literal rules
    while True:
        lines = rules_from_pairs(list(covered.items()), keep)
        paired, *_ = _by_names(calls_a, calls_b, parse_rules(lines))
        wrong = [
            n for n in covered
            if any(paired.get(c.index) != alignment.pairs.get(c.index) for c in calls_of[n])
        ]  # fmt: skip
        if not wrong:
            break
        for n in wrong:
            if n in keep:  # a literal rule of its own is not enough (its partner is taken)
                del covered[n]
                keep.remove(n)
                left_out[n] = "the rules would pair it otherwise"
            else:
                keep.append(n)
    for n, what in by_place.items():  # (unless the rules now pair them otherwise)
        if any(paired.get(c.index) != alignment.pairs.get(c.index) for c in calls_of[n]):
            left_out[n] = what
    total = len(alignment.pairs)
    same = sum(1 for i, j in alignment.pairs.items() if paired.get(i) == j)
    head = f"# --map rules for {alignment.method} alignment ({total} calls"
    head += ")" if same == total else f"; these rules pair {same} of them as it does)"
    notes: list[str] = []
    text = [head]
    if left_out:
        names = list(left_out)
        text += [
            f"# left out: {len(names)} module(s) of A whose calls pair with several modules "
            "of B, or with calls of",
            "# other numbers: a rule pairs call k with call k of one module"
            + ("; --align order pairs them" if alignment.method == "order" else ""),
        ]
        text += [f"#   {n or '(root)'}: {why}" for n, why in left_out.items()]
        more = f" (+{len(names) - 4})" if len(names) > 4 else ""
        notes.append(
            f"--print-map: {len(names)} module(s) of A pair with B call by call as no --map "
            f"rule can say ({', '.join(n or '(root)' for n in names[:4])}{more}): the map "
            "leaves them out (its # lines)"
            + ("; --align order pairs them" if alignment.method == "order" else "")
        )
    return "\n".join([*text, *lines]) + "\n", notes


def _template(a: str, b: str) -> tuple[str | None, str | None]:
    pa, pb = a.split("."), b.split(".")
    da = [p for p in pa if p.isdigit()]
    db = [p for p in pb if p.isdigit()]
    if da != db:
        return a, b  # literal
    letters = "ijkn"
    if len(da) > len(letters):
        return None, None
    ia = iter(letters)
    out_a = [("{" + next(ia) + "}") if p.isdigit() else p for p in pa]
    ib = iter(letters)
    out_b = [("{" + next(ib) + "}") if p.isdigit() else p for p in pb]
    return ".".join(out_a), ".".join(out_b)
