"""The html pages in a real browser: headless Chromium from the system's packages, driven by
Playwright (``make test-browser``; never a downloaded browser).

Each page is loaded with every network request blocked and fails on any console error; the
tree table is clicked, searched and sorted; the numbers it shows are read back and compared
with the report's JSON; the hostile names' page runs no script; the 7B page's first render
is timed (printed, not asserted).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import invoke
from tests.fixtures import html_models
from tests.test_html import COMMANDS

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_MS = 20_000  # any one wait in a page; the whole file runs in about a minute
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str | None:
    given = os.environ.get("HOOKCLI_CHROMIUM")
    if given:
        return given
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def _unavailable(why: str) -> None:
    # make test-browser sets HOOKCLI_REQUIRE_BROWSER: there a missing browser fails the run
    if os.environ.get("HOOKCLI_REQUIRE_BROWSER"):
        pytest.fail(why)
    pytest.skip(f"needs playwright and chromium: {why} (make test-browser installs them)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed")
    path = _chromium()
    if path is None:
        _unavailable("no chromium on PATH")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=["--no-sandbox"], timeout=60_000)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A page opened offline: every request but the page itself aborted and counted, every
    console error, page error and dialog recorded."""

    def __init__(self, browser: Any, path: Path, width: int = 1400, height: int = 1000) -> None:
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.page.set_default_timeout(TIMEOUT_MS)
        url = path.resolve().as_uri()

        def route(r: Any) -> None:
            if r.request.url == url:
                r.continue_()
            else:
                self.requests.append(r.request.url)
                r.abort()

        self.page.route("**/*", route)
        self.page.on(
            "console",
            lambda m: (
                self.errors.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        start = time.perf_counter()
        self.page.goto(url)
        self.page.wait_for_selector("body[data-ready='1']")
        self.load_s = time.perf_counter() - start

    def check_clean(self) -> None:
        assert self.requests == [], self.requests
        assert self.errors == [], self.errors
        assert self.dialogs == [], self.dialogs

    def report(self, name: str = "hookcli-report") -> Any:
        return self.page.evaluate(f"JSON.parse(document.getElementById('{name}').textContent)")

    def shown(self) -> list[dict[str, Any]]:
        """The rows on screen: index into the list, name cell text, and each cell's text,
        data key and title."""
        return self.page.evaluate(
            """() => Array.from(document.querySelectorAll('#tree tbody tr')).map(tr => ({
                i: Number(tr.dataset.i),
                cls: tr.className,
                name: (tr.querySelector('td.tree .nm') || {}).textContent || null,
                tags: Array.from(tr.querySelectorAll('.tag')).map(t => t.textContent),
                cells: Array.from(tr.querySelectorAll('td[data-k]')).map(td => ({
                    k: td.dataset.k, text: td.firstChild.textContent,
                    title: (td.querySelector('span[title]') || {}).title || null})),
            }))"""
        )

    def close(self) -> None:
        self.page.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every command's page, and the special ones, written once for the module."""
    folder = tmp_path_factory.mktemp("pages")
    out: dict[str, Path] = {}
    for command, args in COMMANDS.items():
        path = folder / f"{command}.html"
        result = invoke(*args, "-o", str(path))
        assert result.exit_code == 0, (command, result.stderr[-1000:])
        out[command] = path
    old, new = folder / "old.json", folder / "new.json"
    for path, seed in ((old, "0"), (new, "1")):
        assert (
            invoke(
                "grads", "sample_models:LeNet", "--seed", seed, "-o", str(path), "-f", "json"
            ).exit_code
            == 0
        )
    out["diff"] = folder / "diff.html"
    assert invoke("diff", str(old), str(new), "-o", str(out["diff"])).exit_code == 1
    special = {
        "hostile": [
            "grads",
            "tests.fixtures.html_models:HostileNames",
            "-k",
            "tag=</script><b>x</b>",
        ],
        "nan": ["stats", "tests.fixtures.html_models:NaNDeep"],
        "wide": ["inspect", "tests.fixtures.html_models:wide"],
    }
    for name, args in special.items():
        out[name] = folder / f"{name}.html"
        result = invoke(*args, "-o", str(out[name]))
        assert result.exit_code == 0, (name, result.stderr[-1000:])
    out["raises"] = folder / "raises.html"
    assert (
        invoke(
            "stats", "tests.fixtures.html_models:RaisesHostile", "-o", str(out["raises"])
        ).exit_code
        == 4
    )
    # watch: a real training run, its page written by the watching parent
    out["watch"] = folder / "watch.html"
    run = subprocess.run(
        [sys.executable, "-m", "hookcli", "watch", "--out", str(folder / "run"), "-o",
         str(out["watch"]), "--", sys.executable, str(REPO / "docs" / "examples" /
         "watch_train.py"), "--steps", "12"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-1000:]
    return out


ALL_PAGES = [*sorted(COMMANDS), "diff", "hostile", "nan", "wide", "raises", "watch"]


@pytest.mark.parametrize("name", ALL_PAGES)
def test_page_loads_offline_without_errors(browser: Any, pages: dict[str, Path], name: str) -> None:
    page = Page(browser, pages[name])
    try:
        page.check_clean()
        report = page.report()
        primary = page.report("hookcli-page")["primary"]
        rows = report.get(primary) or []
        shown = page.page.locator("#tree tbody tr").count()
        assert 1 <= shown <= len(rows) if rows else shown == 0
        # the checks as badges, one per check, pass or fail as the report says
        for check in report["checks"]:
            badge = page.page.locator(f".badge[data-check='{check['name']}']")
            assert badge.get_attribute("class") == f"badge {'pass' if check['passed'] else 'fail'}"
        # every chart drew an SVG or (diff) its widget filled
        for fig in page.page.locator("figure.chart").all():
            assert fig.locator("svg").count() + fig.locator(".widget table").count() >= 1
    finally:
        page.close()


def _number(text: str) -> float:
    """A number as the page shows it: 1,234 / 0.1235 / 1.235e-05 / 12.50 KiB / nan."""
    text = text.strip()
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    m = re.fullmatch(r"(-?[\d.,e+-]+) (B|KiB|MiB|GiB|TiB)", text)
    if m:
        return float(m.group(1).replace(",", "")) * units[m.group(2)]
    return float(text.replace(",", ""))


def _close(shown: float, value: float, rel: float) -> bool:
    if math.isnan(value):
        return math.isnan(shown)
    return math.isclose(shown, value, rel_tol=rel, abs_tol=0.0) or shown == value


@pytest.mark.parametrize("name", [*sorted(COMMANDS), "diff"])
def test_the_numbers_shown_are_the_reports(browser: Any, pages: dict[str, Path], name: str) -> None:
    """Every cell on screen (all rows expanded, every JSON key shown) against the report: the
    title holds the exact value, the text its four significant digits (or bytes in KiB)."""
    page = Page(browser, pages[name])
    try:
        report = page.report()
        config = page.report("hookcli-page")
        rows = report.get(config["primary"]) or []
        if page.page.locator("#expand-all").is_visible():
            page.page.click("#expand-all")
        page.page.check("#all-columns")
        shown = page.shown()
        assert len(shown) == len(rows)
        checked = 0
        for tr in shown:
            row = rows[tr["i"]]
            if "name" in row and tr["name"] is not None:
                assert tr["name"] == (row["name"] or "(root)")
            for cell in tr["cells"]:
                value = row.get(cell["k"])
                if isinstance(value, bool) or value is None:
                    assert cell["text"] in ("yes", "no", "-")
                elif isinstance(value, (int, float)):
                    assert float(cell["title"]) == value  # the exact figure
                    if cell["k"] in config["percent"]:  # a fraction shown as a percentage
                        assert cell["text"] == f"{100 * value:.1f}%", (cell, value)
                        checked += 1
                        continue
                    rel = 5e-3 if cell["text"].endswith("B") else 5e-4
                    assert _close(_number(cell["text"]), float(value), rel), (cell, value)
                    checked += 1
                elif isinstance(value, str):
                    assert cell["text"] == value
        # totals: each cell's data-v is the JSON value, its text the same number
        for key, value in (report.get("totals") or {}).items():
            cell = page.page.locator(f"#totals tr[data-key='{key}'] > td")
            assert json.loads(cell.get_attribute("data-v")) == value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                text = cell.text_content().split(" (")[0]
                assert _close(_number(text), float(value), 5e-4), (key, text, value)
                checked += 1
        assert checked > 0
        page.check_clean()
    finally:
        page.close()


def test_tree_expands_collapses_searches_and_sorts(browser: Any, pages: dict[str, Path]) -> None:
    page = Page(browser, pages["nan"])  # blocks.{0,1,2}.{0,1}, head: three levels
    p = page.page
    try:
        report = page.report()
        names = [r["name"] for r in report["layers"]]

        def visible() -> list[str]:
            return [r["name"] for r in page.shown()]

        p.fill("#depth", "1")
        p.click("#expand-depth")
        assert visible() == ["(root)", "blocks", "head"]
        # expand one module: its children appear right below it, built on demand
        p.locator("#tree tr", has_text="blocks").first.locator(".tog").click()
        assert visible() == ["(root)", "blocks", "blocks.0", "blocks.1", "blocks.2", "head"]
        p.locator(
            "#tree tr[data-i]", has=p.locator(".nm", has_text=re.compile("^blocks.1$"))
        ).locator(".tog").click()
        assert visible()[3:6] == ["blocks.1", "blocks.1.0", "blocks.1.1"]
        # collapse it again: its subtree goes
        p.locator("#tree tr", has_text="blocks").first.locator(".tog").click()
        assert visible() == ["(root)", "blocks", "head"]
        p.click("#expand-all")
        assert visible() == [n or "(root)" for n in names]
        p.click("#collapse-all")
        assert visible() == ["(root)"]
        # search by type keeps the ancestors; by name too; clearing restores the tree
        p.fill("#search", "tanh")
        p.wait_for_function("() => document.querySelectorAll('#tree tbody tr.match').length === 1")
        assert visible() == ["(root)", "blocks", "blocks.2", "blocks.2.1"]
        assert "1 of" in p.text_content("#row-count")
        p.fill("#search", "blocks.1")
        p.wait_for_function("() => document.querySelectorAll('#tree tbody tr.match').length === 3")
        assert visible() == ["(root)", "blocks", "blocks.1", "blocks.1.0", "blocks.1.1"]
        p.fill("#search", "")
        p.wait_for_function("() => !document.querySelector('#tree tbody tr.match')")
        assert visible() == ["(root)"]
        # sort by a numeric column: siblings ordered by it, descending then ascending
        p.click("#expand-all")
        p.check("#all-columns")
        header = p.locator("#tree th[data-key='params']")
        header.click()
        assert header.get_attribute("aria-sort") == "descending"

        def children_params(parent: str) -> list[int]:
            kids = [
                r for r in report["layers"] if r["name"].rpartition(".")[0] == parent and r["name"]
            ]
            order = {r["name"]: r["params"] for r in kids}
            return [order[n] for n in visible() if n in order]

        top = children_params("")
        assert top == sorted(top, reverse=True) and len(top) == 2
        header.click()
        assert header.get_attribute("aria-sort") == "ascending"
        assert children_params("") == sorted(top)
        page.check_clean()
    finally:
        page.close()


def test_nan_origin_is_shown_at_first(browser: Any, pages: dict[str, Path]) -> None:
    """The first NaN/Inf is two levels down; the page opens its ancestors and marks it."""
    page = Page(browser, pages["nan"])
    try:
        origin = page.report()["totals"]["nonfinite_origin"]
        assert origin == "blocks.1.1"
        marked = [r for r in page.shown() if "origin" in r["cls"].split()]
        assert [r["name"] for r in marked] == [origin]
        assert "first NaN/Inf" in marked[0]["tags"]
        page.page.click("#collapse-all")
        page.page.click("#goto-origin")
        assert [r["name"] for r in page.shown() if "origin" in r["cls"].split()] == [origin]
        assert page.page.locator("#chart-stats svg").count() == 1
        page.check_clean()
    finally:
        page.close()


def test_tied_parameters_are_marked(browser: Any, pages: dict[str, Path]) -> None:
    page = Page(browser, pages["inspect"])  # TiedEmbeddingLM: lm_head.weight is embed.weight
    try:
        page.page.click("#expand-all")
        tied = {r["name"] for r in page.shown() if "tied" in r["tags"]}
        assert tied == {"embed", "lm_head"}
    finally:
        page.close()
    page = Page(browser, pages["params"])
    try:
        tied = {r["cells"][0]["text"] for r in page.shown() if "tied" in r["tags"]}
        assert tied == {"embed.weight", "lm_head.weight"}
    finally:
        page.close()


def test_hostile_names_run_no_script(browser: Any, pages: dict[str, Path]) -> None:
    for name in ("hostile", "raises"):
        page = Page(browser, pages[name])
        p = page.page
        try:
            p.click("#expand-all") if p.locator("#expand-all").is_visible() else None
            p.check("#all-columns")
            if name == "hostile":  # the names as search results too
                p.fill("#search", "<")
                p.wait_for_function(
                    "() => document.querySelectorAll('#tree tbody tr.match').length === 4"
                )
                p.fill("#search", "")
                p.wait_for_function("() => !document.querySelector('#tree tbody tr.match')")
            page.check_clean()  # no alert() ran: the dialog list is empty
            assert (
                p.evaluate("document.querySelectorAll('img, iframe, object, embed, b').length") == 0
            )
            assert p.evaluate("document.querySelectorAll('script').length") == 3
            assert p.evaluate("document.querySelectorAll('[onerror], [onload]').length") == 0
            shown = " ".join(r["name"] or "" for r in page.shown())
            if name == "hostile":
                for text in html_models.NAMES:
                    assert text in shown, text
                types = [c["text"] for r in page.shown() for c in r["cells"] if c["k"] == "type"]
                assert "<svg onload=alert(4)>Linear" in types
                assert "</script><b>x</b>" in p.text_content("#header")
            else:
                assert html_models.SCRIPT in p.text_content("#error")
        finally:
            page.close()


def test_diff_side_by_side_highlights_what_diff_found(browser: Any, pages: dict[str, Path]) -> None:
    page = Page(browser, pages["diff"])
    try:
        report = page.report()
        found = {(d["item"], d["key"]) for d in report["differences"] if d["where"] == "layers"}
        marked = page.page.evaluate(
            """() => Array.from(document.querySelectorAll("table.sbs[data-where='layers'] td.differs.new"))
                 .map(td => [td.closest('tr').dataset.item, td.dataset.k])"""
        )
        assert {tuple(m) for m in marked} == found and found
        old, new = page.report("hookcli-old"), page.report("hookcli-new")
        by_name = {r["name"] or "(root)": r for r in old["layers"]}
        cells = page.page.evaluate(
            """() => Array.from(document.querySelectorAll("table.sbs[data-where='layers'] td.old.differs"))
                 .map(td => [td.closest('tr').dataset.item, td.dataset.k, td.title])"""
        )
        for item, key, title in cells:
            assert float(title) == by_name[item][key]
        assert {r["name"] or "(root)" for r in new["layers"]} == set(by_name)
        page.check_clean()
    finally:
        page.close()


def test_two_thousand_rows_open_without_freezing(browser: Any, pages: dict[str, Path]) -> None:
    page = Page(browser, pages["wide"])
    p = page.page
    try:
        rows = len(page.report()["layers"])
        assert rows > 2000
        assert p.locator("#tree tbody tr").count() < 100  # folded at first
        start = time.perf_counter()
        p.click("#expand-all")
        assert p.locator("#tree tbody tr").count() == rows
        expand_s = time.perf_counter() - start
        p.fill("#search", "layernorm")
        p.wait_for_function(
            "() => document.querySelectorAll('#tree tbody tr.match').length === 400"
        )
        print(f"\n{rows} rows: loaded in {page.load_s:.2f} s, expand all {expand_s:.2f} s")
        page.check_clean()
    finally:
        page.close()


@pytest.fixture(scope="module")
def llama_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """inspect hf:llama:causal-lm --device meta: 6.7 B parameters, a wide table."""
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("llama") / "llama.html"
    result = invoke("inspect", "hf:llama:causal-lm", "--device", "meta", "-o", str(path))
    assert result.exit_code == 0, result.stderr[-2000:]
    return path


def test_llama_7b_on_meta_first_render(browser: Any, llama_page: Path) -> None:
    """inspect hf:llama:causal-lm --device meta (6.7 B parameters): the page opens folded;
    the first render is timed and printed (no timed assertion)."""
    path = llama_page
    page = Page(browser, path)
    p = page.page
    try:
        rows = len(page.report()["layers"])
        first_ms = float(p.evaluate("document.body.dataset.firstRenderMs"))
        dom_ms = p.evaluate(
            "performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"
        )
        shown = p.locator("#tree tbody tr").count()
        start = time.perf_counter()
        p.click("#expand-all")
        assert p.locator("#tree tbody tr").count() == rows
        expand_s = time.perf_counter() - start
        size = path.stat().st_size
        print(
            f"\nllama 7B (meta): {rows} rows, page {size / 1e6:.2f} MB; first render "
            f"{first_ms:.1f} ms ({shown} rows), DOM ready {dom_ms:.0f} ms, loaded {page.load_s:.2f} s; "
            f"expand all {expand_s:.2f} s"
        )
        assert shown < rows
        page.check_clean()
    finally:
        page.close()


def test_a_watch_run_draws_its_steps(browser: Any, pages: dict[str, Path]) -> None:
    page = Page(browser, pages["watch"])
    try:
        page.check_clean()
        report = page.report()
        assert [s["step"] for s in report["steps"]] == list(range(1, 13))
        for chart in ("watch-lines", "watch-heatmap"):
            assert page.page.locator(f"#chart-{chart} svg").count() == 1, chart
    finally:
        page.close()


def test_watch_page_shows_zeros_as_the_table_does_and_totals_as_tables(
    browser: Any, pages: dict[str, Path]
) -> None:
    """A real run's page: the Zeros column reads as the printed table reads it (a
    percentage with one decimal, from the JSON's fraction), and the nested totals
    (``models``, ``files``) and the ``thresholds`` setting are tables, not JSON."""
    page = Page(browser, pages["watch"])
    try:
        page.check_clean()
        page.page.click("#expand-all")
        rows = page.report()["layers"]
        zeros = [
            (rows[r["i"]]["act_zero_frac"], c["text"])
            for r in page.shown()
            for c in r["cells"]
            if c["k"] == "act_zero_frac" and rows[r["i"]].get("act_zero_frac") is not None
        ]
        assert zeros, "no Zeros cell on the page"
        for fraction, text in zeros:
            assert text == f"{100 * fraction:.1f}%", (fraction, text)
        for key in ("models", "files"):
            cell = page.page.locator(f"tr[data-key='{key}'] > td")
            assert cell.locator("table.nested").count() >= 1, key
            assert "{" not in cell.inner_text(), cell.inner_text()
        steps = page.page.locator("tr[data-key='models'] > td table.nested th", has_text="steps")
        assert steps.count() >= 1
    finally:
        page.close()


# -- read at a glance: wide tables, colours, values on hover, inspect's chart --------------


def test_every_column_of_a_wide_table_is_reached_at_1280px(browser: Any, llama_page: Path) -> None:
    """At 1280 x 800 the llama page's table, every row open and every JSON key shown, is
    wider than its box: the box's scroll bar is on screen with its header, a wheel turned
    sideways over it scrolls it, and its last column's header is then on screen (the
    topmost element at its centre)."""
    page = Page(browser, llama_page, 1280, 800)
    p = page.page
    try:
        p.click("#expand-all")
        p.check("#all-columns")  # the widest the table gets
        box = p.locator("#rows .scroll").first
        last = p.locator("#tree thead th").last
        sizes = box.evaluate("b => [b.scrollWidth, b.clientWidth]")
        assert sizes[0] > sizes[1], sizes  # wider than its box: the case to check
        box.evaluate("b => b.scrollIntoView()")
        frame = box.evaluate(
            "b => { const r = b.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }"
        )
        # the whole box, its bottom edge (the horizontal scroll bar) too, fits the window
        assert frame[3] <= 800 and frame[2] <= 1280, frame
        p.mouse.move((frame[0] + frame[2]) / 2, (frame[1] + frame[3]) / 2)
        p.mouse.wheel(sizes[0], 0)
        p.wait_for_function(
            "() => { const b = document.querySelector('#rows .scroll');"
            " return b.scrollLeft + b.clientWidth >= b.scrollWidth - 1; }"
        )
        seen = last.evaluate(
            """th => { const r = th.getBoundingClientRect();
                 const box = th.closest('.scroll').getBoundingClientRect();
                 const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
                 return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                         boxRight: box.right, hit: hit === th || th.contains(hit)}; }"""
        )
        assert seen["left"] >= 0 and seen["right"] <= min(1280, seen["boxRight"] + 0.5), seen
        assert seen["top"] >= 0 and seen["bottom"] <= 800, seen
        assert seen["hit"], (last.text_content(), seen)
        page.check_clean()
    finally:
        page.close()


MARKS = """svg => Array.from(svg.querySelectorAll('.mark')).map(m => {
    const shape = m.tagName === 'g' ? m.querySelector('path') : m;
    const t = Array.from(m.children).find(c => c.tagName === 'title');
    return {series: m.dataset.series, fill: getComputedStyle(shape).fill,
            title: t ? t.textContent : null}; })"""
CHART_PAGES = ["inspect", "grads", "stats", "cost", "profile", "ablate", "diff", "nan", "watch"]


@pytest.mark.parametrize("name", CHART_PAGES)
def test_every_mark_has_a_value_on_hover_and_each_series_its_colour(
    browser: Any, pages: dict[str, Path], name: str
) -> None:
    """Every bar, point, cell and area drawn has a non-empty SVG <title>; within a chart,
    the series' fill colours differ; a totals cell shown abbreviated has its exact
    figure as a title."""
    page = Page(browser, pages[name])
    try:
        svgs = page.page.locator("figure.chart .svg > svg").all()
        assert svgs, name
        for svg in svgs:
            marks = svg.evaluate(MARKS)
            assert marks, svg.evaluate("s => s.closest('figure').id")
            assert all(m["title"] and m["title"].strip() for m in marks), marks
            # every group drawn with values (bars, points, cells) has its marks titled
            bare = svg.evaluate(
                """s => Array.from(s.querySelectorAll('[id^=hookcli-tip-]'))
                     .filter(g => !g.classList.contains('mark') && !g.querySelector('.mark'))
                     .map(g => g.id)"""
            )
            assert bare == [], bare
            first: dict[str, str] = {}
            for m in marks:
                first.setdefault(m["series"], m["fill"])
            fills = list(first.values())
            assert len(set(fills)) == len(fills), first
        for cell in page.page.locator("#totals td[data-v]").all():
            value = json.loads(cell.get_attribute("data-v"))
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                text = cell.inner_text()
                if text != str(value):
                    assert float(cell.locator("span").get_attribute("title")) == value
        page.check_clean()
    finally:
        page.close()


def test_cost_memory_parts_have_their_own_colours(browser: Any, pages: dict[str, Path]) -> None:
    """Saved and peak activations (the case that shared a colour) differ, and each part's
    title carries the report's figure."""
    page = Page(browser, pages["cost"])
    try:
        marks = page.page.locator("#chart-cost-memory svg").evaluate(MARKS)
        fills = {m["series"]: m["fill"] for m in marks}
        assert fills["saved activations"] != fills["peak activations"], fills
        totals = page.report()["totals"]
        for series, key in (("saved activations", "saved_bytes"),
                            ("peak activations", "peak_activation_bytes")):  # fmt: skip
            titles = [m["title"] for m in marks if m["series"] == series]
            assert titles and f"({totals[key]:,} bytes)" in titles[0], (titles, totals[key])
    finally:
        page.close()


def test_watch_heatmap_has_a_title_per_cell(browser: Any, pages: dict[str, Path]) -> None:
    """One titled cell per module and logged step, each with that step's grad norm."""
    page = Page(browser, pages["watch"])
    try:
        steps = [s for s in page.report()["steps"] if isinstance(s.get("modules"), dict)]
        names = {n for s in steps for n in s["modules"]}
        marks = page.page.locator("#chart-watch-heatmap svg").evaluate(MARKS)
        assert len(marks) == len(names) * len(steps)
        by_title = {m["title"] for m in marks}
        s = steps[-1]
        for n, entry in s["modules"].items():
            g = entry.get("grad_norm")
            if isinstance(g, float) and math.isfinite(g) and g > 0:
                shown = [t for t in by_title if t.startswith(f"{n or '(root)'}, step {s['step']}:")]
                assert len(shown) == 1
                assert math.isclose(float(shown[0].rsplit(" ", 1)[1]), g, rel_tol=5e-4)
    finally:
        page.close()


def test_inspect_chart_shows_where_the_parameters_are(browser: Any, tmp_path: Path) -> None:
    """inspect resnet18: an icicle with an area per module with parameters; the root's
    area holds sum(p.numel()) of the torchvision model, the modules' own parameters add
    up to it, and each area is its own plus its children's."""
    torchvision = pytest.importorskip("torchvision")
    total = sum(p.numel() for p in torchvision.models.resnet18().parameters())
    path = tmp_path / "resnet18.html"
    result = invoke("inspect", "resnet18", "-o", str(path))
    assert result.exit_code == 0, result.stderr[-2000:]
    page = Page(browser, path)
    try:
        marks = page.page.locator("#chart-inspect-params svg").evaluate(MARKS)
        areas: dict[str, tuple[int, int]] = {}
        for m in marks:
            found = re.fullmatch(r"(.+): ([\d,]+) params \(own ([\d,]+) params\)", m["title"])
            assert found, m["title"]
            name, sub, own = found.groups()
            areas[name] = (int(sub.replace(",", "")), int(own.replace(",", "")))
        assert areas["(root)"][0] == total
        assert sum(own for _, own in areas.values()) == total
        for name, (sub, own) in areas.items():
            kids = [
                v[0] for k, v in areas.items()
                if k != "(root)" and k.rpartition(".")[0] == ("" if name == "(root)" else name)
            ]  # fmt: skip
            assert sub == own + sum(kids), name
        # the areas' widths follow the parameters: the root spans what its children span
        width = page.page.locator("#chart-inspect-params svg .mark").first.evaluate(
            "g => g.getBBox().width"
        )
        assert width > 0
        page.check_clean()
    finally:
        page.close()
