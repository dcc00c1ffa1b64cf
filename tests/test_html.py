"""``--format html`` without a browser: every command writes one self-contained page whose
embedded JSON is the ``--format json`` report of the same run, that nothing can break out
of, and that stays small. (The page in a real browser: tests/test_html_browser.py.)"""

from __future__ import annotations

import json
import math
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hookcli.html import render_html, script_json
from tests.conftest import invoke
from tests.fixtures import html_models

# A command line per command that writes a report, each on a small model, fast.
LENET = "sample_models:LeNet"
COMMANDS: dict[str, list[str]] = {
    "inspect": ["inspect", "sample_models:TiedEmbeddingLM"],
    "grads": ["grads", "sample_models.faulty:UnusedBranch"],
    "buffers": ["buffers", "sample_models:BNMLP"],
    "params": ["params", "sample_models:TiedEmbeddingLM"],
    "registrations": ["registrations", LENET],
    "trace": ["trace", LENET, "--backward"],
    "stats": ["stats", "tests.fixtures.html_models:NaNDeep"],
    "features": ["features", LENET, "--layer", "conv*"],
    "cost": ["cost", LENET],
    "profile": ["profile", LENET, "--backward", "--warmup", "0", "--repeat", "1"],
    "ablate": ["ablate", LENET, "--layer", "conv*", "--layer", "fc*"],
    "models": ["models", "--source", "samples"],
}
# Commands whose report holds timings: two runs differ, so their page is compared with the
# JSON of the same Report object rather than of another run.
TIMED = {"trace", "profile"}
VOID = {"meta", "link", "br", "hr", "img", "input", "wbr", "col", "area", "base", "source"}


class PageParser(HTMLParser):
    """Every element opened is closed in order (SVG's self-closing ones aside); collects
    the scripts' texts and every URL-bearing attribute."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []
        self.errors: list[str] = []
        self._script: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
                self.urls.append((tag, k, v or ""))
        if tag in VOID:
            return
        self.stack.append(tag)
        if tag == "script":
            self._script, self._text = dict(attrs), []

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href", "xlink:href"):
                self.urls.append((tag, k, v or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._text.append(data)


def parse_page(text: str) -> PageParser:
    """The page parsed, asserted well formed and self-contained."""
    assert text.startswith("<!DOCTYPE html>")
    parser = PageParser()
    parser.feed(text)
    parser.close()
    assert not parser.errors, parser.errors[:5]
    assert parser.stack == [], parser.stack
    for tag, attr, url in parser.urls:  # nothing to fetch: in-page references and data only
        assert url.startswith(("#", "data:")), (tag, attr, url)
    assert "link" not in parser.tags and "iframe" not in parser.tags
    assert not re.search(r"@import|url\((?!#|data:)", text), "a stylesheet fetch"
    assert not re.search(r"\b(fetch|XMLHttpRequest|WebSocket|EventSource|importScripts)\b", text)
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)"', text)
    assert csp, "no Content-Security-Policy"
    policy = dict(d.strip().split(" ", 1) for d in csp.group(1).split(";"))
    assert policy["default-src"] == "'none'"  # nothing is fetched: no connect, font, frame
    assert re.fullmatch(r"'sha256-[A-Za-z0-9+/=]+'", policy["script-src"])  # the page's own only
    assert policy["img-src"] == "data:"
    return parser


def embedded(parser: PageParser, name: str = "hookcli-report") -> Any:
    texts = [t for attrs, t in parser.scripts if attrs.get("id") == name]
    assert len(texts) == 1, name
    assert texts[0].count("<") == 0 and texts[0].count(">") == 0
    return json.loads(texts[0])


def page_of(args: list[str], *extra: str) -> tuple[str, PageParser]:
    result = invoke(*args, *extra, "--format", "html")
    assert result.exit_code == 0, (result.exit_code, result.stderr[-2000:])
    return result.stdout, parse_page(result.stdout)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_writes_a_self_contained_page(command: str) -> None:
    text, parser = page_of(COMMANDS[command])
    report = embedded(parser)
    assert report["schema"] == "hookcli.report/1" and report["command"] == command
    # one script runs (the page's own); the others are data
    kinds = [attrs.get("type") for attrs, _ in parser.scripts]
    assert kinds.count(None) == 1 and kinds.count("application/json") == len(kinds) - 1
    assert "This chart could not be drawn" not in text
    again = invoke(*COMMANDS[command], "--format", "json")
    assert again.exit_code == 0
    if command not in TIMED:
        assert report == json.loads(again.stdout)  # the same report --format json prints
    elif command == "trace":  # the same events, in the same order; only the times differ
        untimed = ("seq", "event", "module", "type", "depth", "call", "shapes")
        events = [[e.get(k) for k in untimed] for e in report["events"]]
        assert events == [[e.get(k) for k in untimed] for e in json.loads(again.stdout)["events"]]


def test_a_timed_page_embeds_its_own_runs_json() -> None:
    """profile through the Python API: the page of one Report holds exactly that Report's
    JSON text (only escaped for the script element)."""
    import torch

    import hookcli
    from sample_models import LeNet

    report = hookcli.profile(LeNet(), torch.randn(1, 1, 32, 32), backward=True, repeat=1, warmup=0)
    page = report.render("html")
    parser = parse_page(page)
    raw = next(t for a, t in parser.scripts if a.get("id") == "hookcli-report")
    assert raw == script_json(report.to_json())
    assert embedded(parser) == json.loads(report.to_json())


def test_output_file_by_suffix_and_by_format(tmp_path: Path) -> None:
    """-o FILE.html alone picks html; -f html -o FILE writes it whatever the suffix; stdout
    stays empty; -f json -o FILE.html is json."""
    page = tmp_path / "r.html"
    result = invoke("inspect", LENET, "-o", str(page))
    assert result.exit_code == 0 and result.stdout == ""
    parse_page(page.read_text())
    other = tmp_path / "report.txt"
    assert invoke("inspect", LENET, "-f", "html", "-o", str(other)).exit_code == 0
    assert other.read_text().startswith("<!DOCTYPE html>")
    as_json = tmp_path / "r2.html"
    assert invoke("inspect", LENET, "-f", "json", "-o", str(as_json)).exit_code == 0
    json.loads(as_json.read_text())


def test_exit_codes_and_one_line_errors(tmp_path: Path) -> None:
    # a failed check: exit 1, the page still written, the badge says FAIL
    result = invoke(
        "grads", "sample_models.faulty:UnusedBranch", "--fail-on", "unused", "-f", "html"
    )
    assert result.exit_code == 1
    parser = parse_page(result.stdout)
    assert embedded(parser)["checks"][0]["passed"] is False
    assert 'class="badge fail"' in result.stdout
    # the model raised: exit 4, the page holds the rows that ran and the error, as text
    result = invoke("stats", "tests.fixtures.html_models:RaisesHostile", "-f", "html")
    assert result.exit_code == 4
    parser = parse_page(result.stdout)
    assert html_models.SCRIPT in embedded(parser)["error"]
    assert "&lt;/script&gt;&lt;script&gt;alert(2)" in result.stdout
    # bad input: one line, exit 2, no page
    for args in (
        ["inspect", LENET, "-f", "htm"],
        ["inspect", LENET, "-f", "html", "-o", str(tmp_path)],
        ["diff", str(tmp_path / "missing.json"), str(tmp_path / "missing.json"), "-f", "html"],
    ):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.stderr)
        assert result.stdout == ""
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr


def test_hostile_names_render_as_text() -> None:
    """Module names, a class name, a setting and an error message written as markup reach
    the page only escaped; the embedded JSON cannot end its script element."""
    args = ["grads", "tests.fixtures.html_models:HostileNames", "-k", "tag=</script><b>x</b>"]
    text, parser = page_of(args)
    report = embedded(parser)
    names = {r["name"] for r in report["layers"]}
    assert set(html_models.NAMES) <= names
    assert any(r["type"] == "<svg onload=alert(4)>Linear" for r in report["layers"])
    assert report["settings"]["kwargs"] == {"tag": "</script><b>x</b>"}
    # three script elements, whatever the names say: no name opened or closed one
    assert len(parser.scripts) == 3 and text.count("<script") == 3
    assert text.count("</script>") == 3
    for raw in ("<img src=x", "<svg onload", "<b>x</b>", "<!--<script>", "\u2028"):
        assert raw not in text, raw
    assert "img" not in parser.tags and "b" not in parser.tags
    # in the header (Jinja2) and in the chart (matplotlib's SVG text) they are escaped text
    # (the kwargs setting, a mapping, is a small table: its key a header, its value a cell)
    assert '<th scope="row">tag</th><td>&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;</td>' in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "could not be drawn" not in text  # "$x^2$" was not read as mathtext
    # the tied pair is marked from the report alone
    tied = {r["name"]: r.get("shared_with") for r in report["layers"] if r.get("shared_with")}
    assert tied == {"head": ["out.weight"], "out": ["head.weight"]}


@given(st.text())
def test_script_json_reads_back_and_closes_nothing(value: str) -> None:
    text = script_json(json.dumps({"k": value, "l": [value]}))
    assert json.loads(text) == {"k": value, "l": [value]}
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in text


def test_page_assets_close_nothing() -> None:
    """The page's own script and style hold nothing that ends their element early."""
    from importlib import resources

    for name in ("tree.js", "page.css"):
        text = resources.files("hookcli.html").joinpath(name).read_text()
        assert "</" not in text and "<!--" not in text, name


def test_without_matplotlib_the_page_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    text, parser = page_of(COMMANDS["grads"])
    assert "pip install &#39;hookcli[plot]&#39;" in text
    assert "<svg" not in text
    assert embedded(parser)["command"] == "grads"


def test_diff_page_embeds_both_reports_and_their_alignment(tmp_path: Path) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    for path, seed in ((old, "0"), (new, "1")):
        result = invoke("grads", LENET, "--seed", seed, "-f", "json", "-o", str(path))
        assert result.exit_code == 0
    result = invoke("diff", str(old), str(new), "-f", "html")
    assert result.exit_code == 1  # they differ: exit 1, page written
    parser = parse_page(result.stdout)
    as_json = invoke("diff", str(old), str(new), "-f", "json")
    assert embedded(parser) == json.loads(as_json.stdout)
    assert embedded(parser, "hookcli-old") == json.loads(old.read_text())
    assert embedded(parser, "hookcli-new") == json.loads(new.read_text())
    page = embedded(parser, "hookcli-page")
    layers = page["diff"]["lists"]["layers"]
    assert [p[0] for p in layers] == [
        r["name"] or "(root)" for r in json.loads(new.read_text())["layers"]
    ]
    assert all(p[1] == p[2] for p in layers)


def test_diff_alignment_keeps_removed_rows_in_place() -> None:
    from hookcli.diff import aligned_rows

    old = {"layers": [{"name": n} for n in ("", "a", "b", "c", "d")]}
    new = {"layers": [{"name": n} for n in ("", "a", "c", "e")]}
    assert aligned_rows(old, new)["layers"] == [
        ["(root)", 0, 0],
        ["a", 1, 1],
        ["b", 2, None],
        ["c", 3, 2],
        ["d", 4, None],
        ["e", None, 3],
    ]


# The bound docs/html.md states: resnet50's grads page, every row and the chart.
SIZE_BOUND = 2_000_000


def test_resnet50_grads_page_stays_under_the_bound() -> None:
    text, parser = page_of(["grads", "resnet50", "-i", "1x3x64x64"])
    assert len(text.encode()) <= SIZE_BOUND, len(text.encode())
    assert len(embedded(parser)["layers"]) > 150


def test_render_html_from_the_api_is_the_cli_page() -> None:
    """Report.render("html") is what --format html prints (one renderer)."""
    import hookcli
    from sample_models import LeNet

    report = hookcli.inspect(LeNet())
    page = report.render("html")
    assert render_html(report, columns=report.columns) == page
    parse_page(page)


def test_hostile_strings_in_every_templated_place_stay_text() -> None:
    """A report whose settings, totals, checks, notes, inputs and error hold markup and
    quotes: the page has no element or attribute the report did not put there."""
    from hookcli.report import CheckResult, Report, Row

    evil = '"\' onmouseover="alert(1)" x=\'<img src=x onerror=alert(2)></script>&amp;'
    report = Report(
        command="grads",
        model={"spec": evil, "class": evil},
        settings={"device": "cpu", evil: evil, "kwargs": {"k": evil}},
        inputs=({"name": evil, "shape": [1], "dtype": evil},),
        layers=(Row.of({"name": evil, "type": evil, "depth": 0, "call": 0}),),
        totals={evil: evil, "unused_params": [evil], "nonfinite_origin": evil},
        checks=(CheckResult(evil, False, evil, (evil, evil)),),
        notes=(evil,),
        error=evil,
    )
    text = render_html(report)
    parser = parse_page(text)
    assert embedded(parser)["model"]["spec"] == evil
    assert "img" not in parser.tags and "<img" not in text
    assert not {"onmouseover", "x", "onerror", "src"} & _attribute_names(text)


def _attribute_names(text: str) -> set[str]:
    names: set[str] = set()

    class Attrs(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            names.update(k for k, _ in attrs)

        handle_startendtag = handle_starttag

    Attrs().feed(text)
    return names


def test_a_watch_report_draws_its_steps() -> None:
    """The watch entry of the chart mapping, on the documented ``steps`` shape: the loss
    and grad norm lines and the modules x steps heatmap; without steps, a note."""
    from hookcli.report import Report, Row

    layers = tuple(
        Row.of({"name": n, "type": "Linear", "depth": 1 if n else 0, "call": 0})
        for n in ("", "fc1", "fc2")
    )
    steps = tuple(
        Row.of(
            {
                "step": s,
                "loss": 2.0 / s,
                "grad_norm": "nan" if s == 4 else 1.0 / s,
                "modules": {
                    "fc1": {"grad_norm": 0.5 / s},
                    "fc2": {"grad_norm": "inf" if s == 4 else 0.1},
                },
            }
        )
        for s in range(1, 5)
    )
    report = Report(
        command="watch",
        model={"spec": "train.py", "class": "Net"},
        settings={},
        layers=layers,
        lists={"steps": steps},
    )
    text = render_html(report)
    parser = parse_page(text)
    assert embedded(parser)["steps"][3]["grad_norm"] == "nan"
    assert 'id="chart-watch-lines"' in text and 'id="chart-watch-heatmap"' in text
    assert text.count("<svg") == 2 and "data:image/png;base64," in text
    bare = render_html(Report(command="watch", model={}, settings={}, layers=layers))
    assert "carries no per-step series" in bare and "<svg" not in bare


def test_the_page_assets_are_package_data() -> None:
    """A wheel carries the template, style and script: pyproject's package-data for
    hookcli.html names every non-Python file of the package."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["hookcli.html"]
    assets = [
        p.name
        for p in (root / "hookcli" / "html").iterdir()
        if p.suffix not in (".py", ".pyc") and p.is_file()
    ]
    assert {"page.html.j2", "page.css", "tree.js"} <= set(assets)
    for name in assets:
        assert any(fnmatch.fnmatch(name, pat) for pat in patterns), name


def _watch_report(grad_norms: list[float], **totals: Any) -> Any:
    from hookcli.report import Report, Row

    steps = tuple(
        Row.of({"step": s, "loss": 2.0 / s, "grad_norm": g})
        for s, g in enumerate(grad_norms, start=1)
    )
    return Report(
        command="watch",
        model={"spec": "train.py", "class": "Net"},
        settings={"thresholds": {"max_grad_norm": 1000.0, "max_update_ratio": 1.0}},
        layers=(),
        lists={"steps": steps},
        totals=totals,
    )


def _grad_norm_ticks(text: str) -> list[str]:
    """The y tick labels of the total grad norm's axis (the lines chart's second axes),
    read from the SVG as XML."""
    import xml.etree.ElementTree as ET

    start = text.index('id="chart-watch-lines"')
    start = text.index("<svg", start)
    root = ET.fromstring(text[start : text.index("</svg>", start) + len("</svg>")])
    axes = next(g for g in root.iter() if g.get("id") == "axes_2")
    out = []
    for g in axes.iter():
        if (g.get("id") or "").startswith("ytick_"):
            out += [(t.text or "").strip() for t in g.iter() if t.tag.endswith("text")]
    return [t for t in out if t]


@pytest.mark.parametrize(
    "grad_norms, expected",
    [
        ([1.0] * 30, {"1"}),  # clipped at 1 on every step
        ([1.0 - 1e-6 * (s % 3) for s in range(30)], {"1"}),  # 0.999998 .. 1
        ([0.5 * 10 ** (-s / 10) for s in range(30)], {"0.1", "1e-2", "1e-3"}),
        ([3.0 + s for s in range(30)], {"10"}),
        ([2e3 + s for s in range(30)], {"1000"}),
        ([2e3 * 1.2**s for s in range(30)], {"1e4", "1e5"}),
    ],
    ids=["clipped", "tiny-range", "decades", "under-a-decade", "thousands", "large"],
)
def test_the_watch_grad_norm_axis_reads_as_numbers_each_once(
    grad_norms: list[float], expected: set[str]
) -> None:
    """Log ticks at powers of ten only, written as 1, 0.1, 1e-2 (never "10 x 10^-1"),
    each once, and at least one on a range smaller than a decade."""
    text = render_html(_watch_report(grad_norms))
    ticks = _grad_norm_ticks(text)
    assert ticks, "no tick label on the grad norm axis"
    assert len(ticks) == len(set(ticks)), ticks
    assert expected <= set(ticks), ticks
    for t in ticks:
        assert re.fullmatch(r"1e-?\d+|\d+(\.\d+)?", t), t
        value = float(t)
        assert abs(math.log10(value) - round(math.log10(value))) < 1e-12, t
    lo, hi = min(grad_norms), max(grad_norms)
    assert any(lo / 10 < float(t) < hi * 10 for t in ticks)  # a label near the values


def test_nested_totals_and_settings_are_tables_not_json() -> None:
    """watch's ``models`` (a list of objects with a list of objects inside), ``files`` (an
    object with a list) and the ``thresholds`` setting read as small tables, every key
    a header and every value a cell; the JSON stays in data-v."""
    models = [
        {
            "model": "Net",
            "steps": 30,
            "loss_first": 2.5,
            "ranks": [{"process": "rank 0", "loss_last": 0.5}, {"process": "rank 1"}],
        },
        {"model": "Head", "steps": 12},
    ]
    files = {"out": "run<1>", "steps": ["steps.rank0.jsonl", "steps.rank1.jsonl"]}
    text = render_html(_watch_report([1.0, 0.5], models=models, files=files))
    parser = parse_page(text)
    assert embedded(parser)["totals"]["models"] == models

    class Cells(HTMLParser):
        """The text of each totals row's cell and of the threshold setting, by key."""

        def __init__(self) -> None:
            super().__init__()
            self.key: str | None = None
            self.depth = 0
            self.texts: dict[str, list[str]] = {}
            self.headers: dict[str, list[str]] = {}
            self._th = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = dict(attrs)
            if self.key is None and (a.get("data-key") or a.get("data-setting")):
                self.key = a.get("data-key") or a.get("data-setting")
                self.depth = 0
                self.texts[self.key] = []
                self.headers[self.key] = []
            elif self.key is not None:
                self.depth += tag in ("tr", "dd")
                self._th = tag == "th"

        def handle_endtag(self, tag: str) -> None:
            if self.key is None:
                return
            self._th = False
            if tag in ("tr", "dd"):
                if self.depth == 0:
                    self.key = None
                else:
                    self.depth -= 1

        def handle_data(self, data: str) -> None:
            if self.key is not None and data.strip():
                (self.headers if self._th else self.texts)[self.key].append(data.strip())

    cells = Cells()
    cells.feed(text)
    for key in ("models", "files", "thresholds"):
        assert not any("{" in t or "[" in t for t in cells.texts[key]), (key, cells.texts[key])
    assert cells.headers["models"][:4] >= ["model", "steps", "loss_first", "ranks"] or set(
        ["model", "steps", "loss_first", "ranks", "process", "loss_last"]
    ) <= set(cells.headers["models"])
    assert {"Net", "Head", "30", "12", "2.5", "rank 0", "rank 1", "0.5"} <= set(
        cells.texts["models"]
    )
    assert cells.texts["models"].count("-") >= 2  # Head has no loss_first, rank 1 no loss_last
    assert {"out", "steps"} <= set(cells.headers["files"])
    assert {"run<1>", "steps.rank0.jsonl, steps.rank1.jsonl"} <= set(cells.texts["files"])
    assert "run&lt;1&gt;" in text  # escaped as text
    assert set(cells.headers["thresholds"]) == {"max_grad_norm", "max_update_ratio"}
    assert cells.texts["thresholds"] == ["1,000", "1"] or cells.texts["thresholds"] == ["1000", "1"]


def test_a_percentage_column_is_marked_for_the_page_script() -> None:
    """The table writes watch's ``act_zero_frac`` as a percentage (fmt_pct): the page
    config names it, so the page's cell reads 25.0% and not 0.25."""
    from hookcli.report import Report, Row
    from hookcli.watch.summary import COLUMNS

    layers = (Row.of({"name": "fc", "type": "Linear", "depth": 0, "act_zero_frac": 0.25}),)
    report = Report(command="watch", model={}, settings={}, layers=layers, columns=COLUMNS)
    page = embedded(parse_page(render_html(report, columns=COLUMNS)), "hookcli-page")
    assert page["percent"] == ["act_zero_frac"]
    assert ["act_zero_frac", "Zeros"] in page["columns"]
    script = (Path(__file__).resolve().parent.parent / "hookcli" / "html" / "tree.js").read_text()
    assert "PERCENT[key]" in script and '(100 * v).toFixed(1) + "%"' in script


# -- read at a glance: values on hover, series colours, inspect's chart, one byte format ---


def _marks(text: str) -> list[tuple[str, str, str]]:
    """(series, fill, title) of every titled mark in the page's charts: a bar's group (its
    title, then its path), a point's ``<use>`` or a cell's ``<path>``."""
    groups = re.findall(
        r'<g id="[^"]*" class="mark" data-series="([^"]*)"><title>([^<]*)</title>\s*'
        r'<path[^>]*?style="fill: (#[0-9a-f]+)',
        text,
    )
    points = re.findall(
        r'<(?:use|path) class="mark" data-series="([^"]*)"[^>]*?fill: (#[0-9a-f]+)[^>]*>'
        r"<title>([^<]*)</title>",
        text,
    )
    return [(s, f, t) for s, t, f in groups] + [(s, f, t) for s, f, t in points]


def test_with_titles_gives_every_bar_point_and_cell_its_own() -> None:
    """Bars (one group each), a scatter's points and a mesh's cells each get their title,
    in the order drawn; a title is escaped text."""
    pytest.importorskip("matplotlib")
    from hookcli.html.charts import figure, tip, to_svg

    with figure("t", 3, 2) as fig:
        ax = fig.subplots()
        tip(ax.bar([0, 1, 2], [1, 2, 3]), ["a <1>", "b", "c"], "bars")
        tip(ax.scatter([0, 1], [1, 2]), ["p0", "p1"], "points")
        tip(ax.pcolormesh([[1.0, 2.0], [3.0, 4.0]]), ["c0", "c1", "c2", "c3"], "cells")
        svg = to_svg(fig)
    titles = re.findall(r"<title>([^<]*)</title>", svg)
    assert titles == ["a &lt;1&gt;", "b", "c", "p0", "p1", "c0", "c1", "c2", "c3"]
    assert svg.count('class="mark"') == 9
    assert len(re.findall(r'<use class="mark" data-series="points"', svg)) == 2
    assert len(re.findall(r'<path class="mark" data-series="cells"', svg)) == 4


def test_inspect_page_charts_where_the_parameters_are() -> None:
    """inspect LeNet: an area per module with parameters, titled with its subtree and own
    counts; the root's is sum(p.numel()) and the own counts add up to it."""
    pytest.importorskip("matplotlib")
    import sample_models

    total = sum(p.numel() for p in sample_models.LeNet().parameters())
    text, _ = page_of(["inspect", LENET])
    assert 'id="chart-inspect-params"' in text
    areas = {}
    for t in re.findall(r"<title>([^<]*) params \(own [\d,]+ params\)</title>", text):
        name, sub = t.rsplit(": ", 1)
        areas[name] = int(sub.replace(",", ""))
    owns = [int(o.replace(",", "")) for o in re.findall(r"\(own ([\d,]+) params\)", text)]
    assert areas["(root)"] == total and sum(owns) == total
    assert set(areas) >= {"conv1", "conv2", "fc1", "fc2"}


def test_series_have_distinct_colours_and_bytes_read_as_render_writes_them() -> None:
    """cost's memory chart: saved and peak activations differ in colour; every mark has a
    title; a totals byte count reads in KiB as hookcli's tables write it (computed here)."""
    pytest.importorskip("matplotlib")
    text, parser = page_of(["cost", LENET])
    marks = _marks(text)
    assert len(marks) == text.count('class="mark"') > 0
    assert all(title.strip() for _, _, title in marks)
    fills = {series: fill for series, fill, _ in marks}
    assert fills["saved activations"] != fills["peak activations"]
    value = embedded(parser)["totals"]["param_bytes"]
    assert 1024 <= value < 2**20
    assert f"{value:,} ({value / 1024:,.2f} KiB)" in text


def test_an_abbreviated_totals_figure_has_the_exact_one_as_title() -> None:
    from hookcli.html.page import nested_html

    assert str(nested_html(0.123456789)) == '<span title="0.123456789">0.1235</span>'
    assert str(nested_html(12345)) == '<span title="12345">12,345</span>'
    assert str(nested_html(12)) == "12"
    assert str(nested_html("a<b")) == "a&lt;b"


def test_a_long_watch_run_keeps_its_heatmap_small() -> None:
    """500 steps x 100 modules: the heatmap shows one logged step in k, at most
    MAX_CELLS titled cells, and says so."""
    pytest.importorskip("matplotlib")
    from hookcli.html import charts

    steps = [
        {"step": i, "loss": 1.0, "grad_norm": 0.5, "modules": {f"m{j}": {"grad_norm": 0.5}
         for j in range(100)}}
        for i in range(1, 501)
    ]  # fmt: skip
    heat = charts.watch_charts({"steps": steps, "layers": []}, {})[1]
    cells = heat.svg.count('class="mark"') if heat.svg else 0
    assert cells == 100 * len(range(0, 500, 13)) <= charts.MAX_CELLS  # steps 1, 14, 27, ...
    assert heat.note is not None and "one logged step in 13" in heat.note
