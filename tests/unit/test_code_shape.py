"""The shape of services/ and shared/ (migrations aside), read with `ast`: no module over 500
lines, no class over 300, and no import cycle between modules (imports under
`if TYPE_CHECKING:` aside; an import inside a function counts, it is a cycle all the same).

Past those sizes a newcomer stops reading and starts searching. The allow-lists below name what
is still being split; each entry goes when its module or class is split, and a test fails while
an entry names something that no longer needs it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "shared")
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300

MODULES_ALLOWED_OVER: set[str] = set()
CLASSES_ALLOWED_OVER: set[str] = set()
CYCLES_ALLOWED: set[frozenset[str]] = set()


def _sources() -> dict[str, Path]:
    """Module name -> file, for every module of the packages (a package is its __init__)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


SOURCES = _sources()


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _long_classes(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_CLASS_LINES:
                found[f"{_rel(path)}::{node.name}"] = length
    return found


def test_no_module_over_500_lines():
    over = {_rel(p): n for p in SOURCES.values() if (n := _lines(p)) > MAX_MODULE_LINES}
    unexpected = {m: n for m, n in over.items() if m not in MODULES_ALLOWED_OVER}
    assert not unexpected, f"modules over {MAX_MODULE_LINES} lines (split them along their concerns): {unexpected}"
    stale = MODULES_ALLOWED_OVER - set(over)
    assert not stale, f"no longer over {MAX_MODULE_LINES} lines: remove from MODULES_ALLOWED_OVER: {sorted(stale)}"


def test_no_class_over_300_lines():
    over: dict[str, int] = {}
    for path in SOURCES.values():
        over.update(_long_classes(path))
    unexpected = {c: n for c, n in over.items() if c not in CLASSES_ALLOWED_OVER}
    assert not unexpected, f"classes over {MAX_CLASS_LINES} lines: {unexpected}"
    stale = CLASSES_ALLOWED_OVER - set(over)
    assert not stale, f"no longer over {MAX_CLASS_LINES} lines: remove from CLASSES_ALLOWED_OVER: {sorted(stale)}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of the tree but those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The modules of the packages that one import statement loads by name."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in SOURCES}
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    targets = set()
    for alias in node.names:
        full = f"{base}.{alias.name}"
        if full in SOURCES:
            targets.add(full)
        elif base in SOURCES:
            targets.add(base)
    return targets


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in SOURCES.items():
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text())):
            edges |= _targets(module, path, node)
        graph[module] = edges - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_graph_sees_imports_of_every_kind():
    graph = import_graph()
    assert "shared.catalog.models" in graph["shared.catalog.repository.jobs"]  # from a.b import (names)
    assert "services.cluster.spark_standalone" in graph["services.cli.service_commands"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    found = cycles(import_graph())
    unexpected = [sorted(c) for c in found if c not in CYCLES_ALLOWED]
    assert not unexpected, f"import cycles (move what both need into a module of its own): {unexpected}"
    stale = [sorted(c) for c in CYCLES_ALLOWED if c not in found]
    assert not stale, f"no longer a cycle: remove from CYCLES_ALLOWED: {stale}"
