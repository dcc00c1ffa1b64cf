"""``--format html``: one self-contained, offline page per report.

The page embeds the report's JSON (the text ``--format json`` prints, with ``<``, ``>``,
``&``, U+2028 and U+2029 written as ``\\uXXXX`` escapes so that it cannot end its
``<script>`` element) and renders from it: the header, the checks as badges and the
totals from a Jinja2 template (``page.html.j2``, autoescaped), the rows as a tree table
built in the browser by ``tree.js`` (the one hand-written script), and one chart per
command as inline SVG drawn by matplotlib's SVG backend (``charts.py``: one mapping from a
command to its chart). Templates and assets are package data; nothing is fetched.

Like ``hookcli.render``, it renders a Report and never touches a model (docs/html.md).
"""

from __future__ import annotations

from hookcli.html.page import render_html, script_json

__all__ = ["render_html", "script_json"]
