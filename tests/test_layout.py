"""The layout of hookcli/ (docs/development.md "Layout"), read from the source with ast.

- no import circles between hookcli's modules (lazy and type-checking imports included);
- the shared core imports no capability package (a capability imports the core);
- a command module is its Typer signature plus one call: at most 200 lines;
- a runner takes a launch strategy (``hookcli.distributed``) and uses its public names only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "hookcli"

# One package per capability: its probe, runner, checks and rendering helpers.
CAPABILITIES = (
    "hookcli.ablate",
    "hookcli.compare",
    "hookcli.cost",
    "hookcli.distributed",
    "hookcli.features",
    "hookcli.grads",
    "hookcli.inspect",
    "hookcli.profile",
    "hookcli.stats",
    "hookcli.watch",
)
# What may import a capability: the public API, the CLI and the commands.
ENTRY_POINTS = (
    "hookcli",
    "hookcli.__main__",
    "hookcli.api",
    "hookcli.cli",
    "hookcli.commands",
    "hookcli.entry",  # the console script: hookcli watch takes its fast path from here
)
MAX_COMMAND_LINES = 200


def _module_name(path: Path) -> tuple[str, list[str]]:
    """``hookcli/cost/probe.py`` -> ('hookcli.cost.probe', its package's parts)."""
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), parts
    return ".".join(parts), parts[:-1]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    tree: ast.AST, package: list[str], modules: set[str], *, type_checking: bool
) -> set[str]:
    """Every hookcli module an import anywhere in the file names (functions included).

    ``from a import b`` names ``a.b`` when that is a module, else ``a``. Imports under
    ``if TYPE_CHECKING:`` count only with ``type_checking`` (they never run).
    """
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for a in node.names:
                found.add(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules}


def _graph(*, type_checking: bool) -> dict[str, set[str]]:
    """hookcli's modules -> the hookcli modules each one imports."""
    trees = {}
    for path in sorted(ROOT.rglob("*.py")):
        name, package = _module_name(path)
        trees[name] = (ast.parse(path.read_text(), str(path)), package)
    modules = set(trees)
    return {
        name: _imports(tree, package, modules, type_checking=type_checking) - {name}
        for name, (tree, package) in trees.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in packages)


def test_the_graph_sees_lazy_and_relative_imports() -> None:
    """The reader itself: an import inside a function counts, a TYPE_CHECKING one only
    when asked, and ``from a import b`` names the module ``a.b``."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from hookcli.report import Row\n"
        "def f():\n    from hookcli.cost import probe\n    from . import render\n"
    )
    modules = {"hookcli", "hookcli.cost", "hookcli.cost.probe", "hookcli.render", "hookcli.report"}
    runtime = _imports(tree, ["hookcli"], modules, type_checking=False)
    assert runtime == {"hookcli.cost.probe", "hookcli.render"}
    assert "hookcli.report" in _imports(tree, ["hookcli"], modules, type_checking=True)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    """No module imports itself back through others: at import time, in a function, or
    for the type checker only (a type both sides need lives below both)."""
    graph = _graph(type_checking=True)
    assert "hookcli.loading" in graph and "hookcli.cost.probe" in graph  # the tree was read
    assert _cycles(graph) == []


def test_the_core_imports_no_capability() -> None:
    """loading, inputs, session, report, render and the rest of the shared core never
    import a capability package, not even for type checking."""
    graph = _graph(type_checking=True)
    wrong = {
        name: sorted(m for m in deps if _within(m, CAPABILITIES))
        for name, deps in graph.items()
        if not _within(name, CAPABILITIES)
        and not _within(name, ENTRY_POINTS[1:])
        and name != "hookcli"
    }
    assert {k: v for k, v in wrong.items() if v} == {}


@pytest.mark.parametrize("path", sorted((ROOT / "commands").glob("*.py")), ids=lambda p: p.name)
def test_command_modules_are_short(path: Path) -> None:
    """A command module is its Typer signature plus one call into its capability."""
    assert len(path.read_text().splitlines()) <= MAX_COMMAND_LINES


def test_api_holds_no_runner() -> None:
    """api.py is the public API: its public functions are ``__all__``'s, and the runners
    (``plan_*``, ``run_*``) live with their capability, where the commands call them too."""
    tree = ast.parse((ROOT / "api.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    exported = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    )
    assert [f for f in functions if f.startswith(("plan_", "run_"))] == []
    public = {f for f in functions if not f.startswith("_")}
    assert public - set(exported) <= {"live", "on_live", "untouched"}  # the live-model helpers


# Where the launch strategies live (Local, Ddp, Fsdp): a runner may use their public names.
STRATEGIES = (
    "hookcli.distributed.strategy",
    "hookcli.distributed.ddp",
    "hookcli.distributed.fsdp",
    "hookcli.distributed.launch",
)


def _private_names(tree: ast.AST, modules: tuple[str, ...]) -> list[str]:
    """``from M import _name`` (or ``M._name``) anywhere in the file, for M in ``modules``."""
    found = []
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in modules})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            base = ast.unparse(node.value)
            if aliases.get(base, base) in modules:
                found.append(f"{aliases.get(base, base)}.{node.attr}")
    return found


def test_the_private_names_reader_sees_both_forms() -> None:
    tree = ast.parse(
        "def f():\n    from hookcli.distributed.fsdp import Fsdp, _norm\n"
        "import hookcli.distributed.ddp as d\nd._unique_params\n"
    )
    assert _private_names(tree, STRATEGIES) == [
        "hookcli.distributed.fsdp._norm",
        "hookcli.distributed.ddp._unique_params",
    ]


def test_runners_use_only_a_strategys_public_names() -> None:
    """A command's runner takes the launch as a strategy object and merges what the ranks
    found itself; it never reaches into a strategy's internals (``_`` names)."""
    outside = [p for p in sorted(ROOT.rglob("*.py")) if "distributed" not in p.parts]
    assert any(p.name == "runner.py" for p in outside)  # the runners were read
    wrong = {
        str(p.relative_to(ROOT)): names
        for p in outside
        if (names := _private_names(ast.parse(p.read_text(), str(p)), STRATEGIES))
    }
    assert wrong == {}
