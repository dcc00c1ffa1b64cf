"""Every ``$ hookcli ...`` example in README.md and docs/*.md, re-run and compared with the page.

The syntax a page uses (docs/development.md, "Examples in the docs" says it for writers):

- A code block (fenced, or indented by four spaces) holds one or more commands, each a
  line starting with ``$ `` (a line ending in ``\\`` continues on the next), followed by
  what it prints: stdout and stderr together, as in a terminal.
- A line ``...`` stands for any number of lines the page leaves out; ``...`` inside a
  line stands for any text within that line. Nowhere else may the output differ.
- ``$ echo $?`` prints the previous command's exit status, compared like any output;
  ``# exit N`` as the last line of an output says the same without a command.
- An HTML comment on the line before the block (a blank line may sit between) holds
  directives for the whole block, separated by ``;``:
  ``<!-- docs-check: mask COLUMN, COLUMN -->`` does not compare the table columns with
  those headers (timings, machine-dependent memory); ``<!-- docs-check: mask-re REGEX -->``
  does not compare the text REGEX matches in any line; ``<!-- docs-check: skip REASON -->``
  does not run the block and says why (the test reports it as skipped with REASON).

Figures, names and exit statuses are compared exactly; runs of spaces are compared as one
space (table widths follow the values, and masked values change them). Each block runs in
a fresh folder that holds links to ``sample_models``, ``tests`` and ``docs/examples``, so
the commands may write files. Blocks whose models are not torchvision, ``hf:`` or ``timm:``
ones run in ``make test``; the others are marked slow. ``make docs-check`` runs them all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-check:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```|~~~)")
EXIT = re.compile(r"^# exit (\d+)$")
# Blocks with these models build torchvision/hf/timm models: seconds each, so slow.
# hookcli watch runs a training command, not a MODEL: its blocks run in make test.
SLOW_MODEL = re.compile(
    r"hookcli (?!watch )\w+ (?!sample_models|tests[./]|docs/examples|os:|torch\.nn)\S"
)
SEP = "\x1edocs-check-end"
# ``torch<2.14: mask Saved`` applies the directive after the colon on those torch only.
TORCH_COND = re.compile(r"^torch\s*(<|>=)\s*(\d+\.\d+)\s*:\s*(.+)$")
# torchrun's own log lines ("W1124 06:34:28.398000 23478 torch/distributed/run.py:982] ...",
# "[rank0]:[W1124 ...") and the failure summary it prints after a rank exits non-zero
# are torchrun's, not hookcli's: dropped before the comparison.
TORCHRUN_LOG = re.compile(r"^(\[rank\d+\]:)?\[?[WEI]\d{4} \d\d:\d\d:\d\d")


@dataclass
class Command:
    line: int  # 1-based line of the ``$`` in the page
    text: str  # the command, continuation lines joined
    expected: list[str] = field(default_factory=list)
    exit_code: int | None = None


@dataclass
class Block:
    page: str
    line: int
    commands: list[Command]
    mask_columns: list[str] = field(default_factory=list)
    mask_res: list[str] = field(default_factory=list)
    skip: str | None = None
    fails_with: str | None = None  # the block's feature is missing on this torch

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks_of(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(ROOT))
    found: list[Block] = []
    i = 0
    while i < len(lines):
        start = i
        fence = FENCE.match(lines[i])
        if fence:
            indent = len(fence.group(1))
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence.group(2)):
                j += 1
            body = [ln[indent:] for ln in lines[i + 1 : j]]
            first = i + 2  # 1-based line of the body's first line
            i = j + 1
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            body = [ln[4:] for ln in lines[i:j]]
            first = i + 1
            i = j
        else:
            i += 1
            continue
        block = _parse(page, start + 1, first, body, lines[:start])
        if block is not None:
            found.append(block)
    return found


def _parse(page: str, line: int, first: int, body: list[str], before: list[str]) -> Block | None:
    commands: list[Command] = []
    k = 0
    while k < len(body):
        text = body[k]
        if text.startswith("$ "):
            cmd = Command(first + k, text[2:])
            while cmd.text.endswith("\\") and k + 1 < len(body):
                k += 1
                cmd.text = cmd.text[:-1].rstrip() + " " + body[k].strip()
            commands.append(cmd)
        elif commands:
            commands[-1].expected.append(text.rstrip())
        k += 1
    if not any(re.search(r"(^|[\s;])hookcli\s", c.text) for c in commands):
        return None
    for cmd in commands:
        while cmd.expected and not cmd.expected[-1].strip():
            cmd.expected.pop()
        if cmd.expected and (m := EXIT.match(cmd.expected[-1].strip())):
            cmd.exit_code = int(m.group(1))
            cmd.expected.pop()
            while cmd.expected and not cmd.expected[-1].strip():
                cmd.expected.pop()
    block = Block(page, line, commands)
    j = len(before) - 1
    while j >= 0 and not before[j].strip():
        j -= 1
    if j >= 0 and (d := DIRECTIVE.match(before[j])):
        for part in filter(None, (p.strip() for p in d.group(1).split(";"))):
            if (cond := TORCH_COND.match(part)) is not None:
                if not _torch_holds(cond.group(1), cond.group(2)):
                    continue  # a directive for other torch versions
                part = cond.group(3)
            word, _, rest = part.partition(" ")
            if word == "skip":
                block.skip = rest or "no reason given"
            elif word == "mask":
                block.mask_columns += [c.strip() for c in rest.split(",") if c.strip()]
            elif word == "mask-re":
                block.mask_res.append(rest)
            elif word == "fails-with":
                block.fails_with = rest
            else:
                raise ValueError(f"{page}:{j + 1}: unknown docs-check directive {word!r}")
    return block


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in _blocks_of(page)]


# -- normalising and comparing ---------------------------------------------------------------


RULE = re.compile(r"\s*-+(\s+-+)+\s*")


def _mask_tables(lines: list[str], columns: list[str]) -> list[str]:
    """Replace the cells under the named headers with ``*`` (the spans come from the
    ``-----  ----`` rule under the header, so they hold for this output's widths)."""
    if not columns:
        return lines
    out = list(lines)
    spans: list[tuple[int, int]] = []
    masked: list[int] = []
    for n, ln in enumerate(lines):
        if RULE.fullmatch(ln) and n > 0:
            spans = [(m.start(), m.end()) for m in re.finditer(r"-+", ln)]
            header = lines[n - 1]
            masked = [
                i
                for i, (a, b) in enumerate(spans)
                if any(c == header[a:b].strip() for c in columns)
            ]
            continue
        if not ln.strip() or ln.strip() == "...":
            if not ln.strip():
                spans, masked = [], []
            continue
        if masked:
            chars = list(ln.ljust(spans[-1][1]))
            for i in reversed(masked):
                a, b = spans[i]
                # a right-aligned wide value may start before the rule: take the whole token
                while a > 0 and chars[a - 1] != " ":
                    a -= 1
                while b < len(chars) and chars[b] != " ":
                    b += 1
                chars[a:b] = " * "
            out[n] = "".join(chars)
    return out


def normalise(lines: list[str], block: Block) -> list[str]:
    lines = _mask_tables(lines, block.mask_columns)
    out = []
    for ln in lines:
        for rx in block.mask_res:
            ln = re.sub(rx, "*", ln)
        if RULE.fullmatch(ln):  # a table's rule is as wide as its values: its columns count
            ln = re.sub(r"-+", "-", ln)
        out.append(" ".join(ln.split()))
    while out and not out[-1]:
        out.pop()
    return out


def _pattern(expected: list[str]) -> re.Pattern[str]:
    parts = []
    for ln in expected:
        if ln == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(r"[^\n]*?".join(re.escape(p) for p in ln.split("...")) + r"\n")
    return re.compile("".join(parts))


def matches(expected: list[str], actual: list[str]) -> bool:
    return _pattern(expected).fullmatch("".join(a + "\n" for a in actual)) is not None


def _first_miss(expected: list[str], actual: list[str]) -> str:
    """The first line of the page that the output does not have (in order), for the message."""
    pos = 0
    for ln in expected:
        if ln == "...":
            continue
        rx = re.compile(r"[^\n]*?".join(re.escape(p) for p in ln.split("...")))
        for k in range(pos, len(actual)):
            if rx.fullmatch(actual[k]):
                pos = k + 1
                break
        else:
            return ln
    return "(every shown line is there; the output has lines the page does not mark with ...)"


# -- running ---------------------------------------------------------------------------------


def _workdir(tmp: Path) -> Path:
    for name in ("sample_models", "tests"):
        (tmp / name).symlink_to(ROOT / name)
    (tmp / "docs").mkdir()
    (tmp / "docs" / "examples").symlink_to(ROOT / "docs" / "examples")
    return tmp


def run_block(block: Block, tmp: Path) -> list[tuple[str, int]]:
    """Run the block's commands in one bash, in order; each one's output and exit status."""
    script = ["set +e"]
    for cmd in block.commands:
        script.append(f"( {cmd.text}\n) 2>&1; __rc=$?; printf '\\n{SEP} %d\\n' $__rc; (exit $__rc)")
    env = dict(os.environ)
    for key in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "FORCE_COLOR", "HOOKCLI_FULL_EXIT"):
        env.pop(key, None)
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="120",
        NO_COLOR="1",
        TERM="dumb",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(_workdir(tmp)),
        PYTHONWARNINGS="ignore",
    )
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    results = []
    rest = done.stdout
    for _ in block.commands:
        out, _, rest = rest.partition(SEP + " ")
        code, _, rest = rest.partition("\n")
        if out.endswith("\n"):
            out = out[:-1]
        results.append((out, int(code) if code.strip() else -1))
    return results


def drop_torchrun_noise(lines: list[str]) -> list[str]:
    out: list[str] = []
    rules = -1  # inside torchrun's ChildFailedError: count its rules of '=' (2 close it)
    for ln in lines:
        if rules < 0 and ln.startswith("Traceback (most recent call last):"):
            rules = 0
            continue
        if rules >= 0:
            if re.fullmatch(r"=+", ln):
                rules += 1
                if rules == 2:
                    rules = -1
            continue
        if not TORCHRUN_LOG.match(ln):
            out.append(ln)
    return out


def _params() -> list[object]:
    params = []
    for block in all_blocks():
        marks = []
        if any(SLOW_MODEL.search(c.text) or c.text.startswith("torchrun") for c in block.commands):
            marks.append(pytest.mark.slow)
        if block.skip:
            marks.append(pytest.mark.skip(reason=block.skip))
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


# The pages show what every torch of the matrix prints (noxfile.py). Where a torch's
# output truly differs (the floor keeps other tensors for backward, so saved bytes
# differ; torch's own error texts change), the block carries a directive for those
# versions only: ``<!-- docs-check: torch<2.14: mask Saved -->``.


def _torch_holds(op: str, version: str) -> bool:
    """Whether the installed torch is ``op`` (``<`` or ``>=``) ``version`` (major.minor)."""
    import torch

    have = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    want = tuple(int(p) for p in version.split("."))
    return have < want if op == "<" else have >= want


@pytest.mark.docs
@pytest.mark.parametrize("block", _params())
def test_example_prints_what_the_page_shows(block: Block, tmp_path: Path) -> None:
    if block.fails_with is not None:
        check_refused(block, tmp_path)
        return
    problems = []
    for cmd, (out, code) in zip(block.commands, run_block(block, tmp_path), strict=True):
        lines = out.splitlines()
        if cmd.text.startswith("torchrun"):
            lines = drop_torchrun_noise(lines)
        actual = normalise(lines, block)
        expected = normalise(cmd.expected, block)
        where = f"{block.page}:{cmd.line}: $ {cmd.text}"
        if not matches(expected, actual):
            import difflib

            diff = "\n".join(
                difflib.unified_diff(
                    cmd.expected, out.splitlines(), "page", "printed now", lineterm="", n=2
                )
            )
            problems.append(
                f"{where}\n  first shown line not printed: {_first_miss(expected, actual)!r}\n"
                f"  (compared with runs of spaces as one{', masked' if block.mask_columns or block.mask_res else ''};"
                f" '...' on its own line skips lines)\n{diff}"
            )
        if cmd.exit_code is not None and code != cmd.exit_code:
            problems.append(f"{where}\n  exit status {code}, the page says {cmd.exit_code}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


def check_refused(block: Block, tmp_path: Path) -> None:
    """``fails-with TEXT``: on this torch the block's feature is missing, and hookcli must
    say so: every ``hookcli`` command exits 2 (under torchrun: torchrun fails) with its
    own one-line error holding TEXT. The page's output is not compared; the block runs."""
    assert block.fails_with
    problems = []
    for cmd, (out, code) in zip(block.commands, run_block(block, tmp_path), strict=True):
        if not re.search(r"(^|[\s;])hookcli\s", cmd.text):
            continue
        errors = [ln for ln in out.splitlines() if ln.startswith("hookcli: error: ")]
        # torchrun ends with 1 when a rank fails; each rank's own status is hookcli's 2
        ok_code = code != 0 if cmd.text.startswith("torchrun") else code == 2
        if not ok_code or not errors or block.fails_with not in errors[-1]:
            problems.append(
                f"{block.page}:{cmd.line}: $ {cmd.text}\n  on this torch it should exit 2 "
                f"with an error holding {block.fails_with!r}; exit {code}, printed:\n{out[-1500:]}"
            )
        elif "Traceback" in out and "ChildFailedError" not in out:
            problems.append(f"{block.page}:{cmd.line}: a traceback besides the error:\n{out}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


def test_the_syntax_is_understood() -> None:
    """The parser finds the examples: a page's ``$ hookcli`` lines all belong to blocks."""
    blocks = all_blocks()
    seen = {(b.page, c.line) for b in blocks for c in b.commands}
    missing = []
    for page in PAGES:
        for n, ln in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            rel = str(page.relative_to(ROOT))
            if re.match(r"^\s*\$ .*\bhookcli\s", ln) and (rel, n) not in seen:
                missing.append(f"{rel}:{n}")
    assert not missing, f"example lines outside any block the test reads: {missing}"
    assert len(blocks) > 40


def test_masking_and_trims() -> None:
    """The comparison itself: a trim matches lines, a masked column ignores its values."""
    block = Block("x", 1, [], mask_columns=["took (ms)"])
    table = ["Seq  Event    took (ms)", "---  -------  ---------", "  0  forward     8.631"]
    other = ["Seq  Event    took (ms)", "---  -------  ---------", "  0  forward  1234.5"]
    assert matches(normalise(table, block), normalise(other, block))
    wrong = ["Seq  Event    took (ms)", "---  -------  ---------", "  1  forward     8.631"]
    assert not matches(normalise(table, block), normalise(wrong, block))
    # a rule as wide as other values still has its columns; one column more does not
    wider = ["Seq  Event    took (ms)", "---  -------  ----------", "  0  forward  12345.67"]
    assert matches(normalise(table, block), normalise(wider, block))
    extra = ["Seq  Event    took (ms)", "---  -------  ---------  --", "  0  forward     8.631"]
    assert not matches(normalise(table, block), normalise(extra, block))
    plain = Block("x", 1, [])
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert not matches(["a", "d"], ["a", "b", "d"])
    assert matches(["x ... y"], ["x 1 2 y"])
    assert not matches(normalise(["1,234"], plain), normalise(["1,235"], plain))


def test_fails_with_checks_the_refusal(tmp_path: Path) -> None:
    """``fails-with`` passes only on hookcli's own exit-2 line holding the text."""
    refused = Command(1, "hookcli models --filter ''")
    block = Block("x", 1, [refused], fails_with="is empty")
    for sub in ("a", "b", "c"):
        (tmp_path / sub).mkdir()
    check_refused(block, tmp_path / "a")  # exit 2, and the line says so
    with pytest.raises(pytest.fail.Exception):
        check_refused(Block("x", 1, [refused], fails_with="newer torch"), tmp_path / "b")
    ran = Command(1, "hookcli --version")  # exit 0, no model: fast
    with pytest.raises(pytest.fail.Exception):
        check_refused(Block("x", 1, [ran], fails_with="is empty"), tmp_path / "c")  # exit 0
    parsed = _parse(
        "p", 3, 4, ["$ hookcli models"], ["<!-- docs-check: torch<99.0: fails-with x -->"]
    )
    assert parsed is not None and parsed.fails_with == "x"
    parsed = _parse(
        "p", 3, 4, ["$ hookcli models"], ["<!-- docs-check: torch<1.0: fails-with x -->"]
    )
    assert parsed is not None and parsed.fails_with is None
