"""Imports run one way: no cycle among frink_cli's modules, and the layers point down.

Every `import` / `from ... import` of a frink_cli module counts, function-local ones too
(a lazy import that dodges a cycle is still a cycle); only imports under
`if TYPE_CHECKING:` are left out, since they never run. A package's `__init__` stands
for the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "frink_cli"
PKG = "frink_cli"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(tree: ast.AST, here: str, is_pkg: bool) -> set[str]:
    """The absolute names of everything imported under `tree`, TYPE_CHECKING blocks skipped."""
    found: set[str] = set()
    package = here if is_pkg else here.rpartition(".")[0]
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import name`: the submodule pkg.name when there is one, else pkg
            found.update(f"{prefix}.{a.name}" for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the frink_cli modules it imports (names that are not modules resolve to
    the module that defines them)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = set()
        for imported in _imports(tree, name, path.name == "__init__.py"):
            while imported and imported not in files:
                imported = imported.rpartition(".")[0]
            if imported.startswith(PKG) and imported != name:
                deps.add(imported)
        graph[name] = deps
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _in(name: str, package: str) -> bool:
    full = f"{PKG}.{package}"
    return name == full or name.startswith(full + ".")


def test_no_import_cycle() -> None:
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _violations(lower: tuple[str, ...], upper: tuple[str, ...]) -> list[str]:
    return [
        f"{src} imports {dep}"
        for src, deps in sorted(_graph().items())
        if any(_in(src, p) for p in lower)
        for dep in sorted(deps)
        if any(_in(dep, p) for p in upper)
    ]


def test_formats_only_read_files() -> None:
    assert _violations(("formats",), ("archs", "model", "graph", "backends")) == []


def test_model_and_graph_do_not_import_archs() -> None:
    assert _violations(("model", "graph"), ("archs",)) == []


def test_archs_do_not_import_a_backend() -> None:
    assert _violations(("archs",), ("backends",)) == []


def test_graph_does_not_import_a_backend() -> None:
    """graph/ is the interface and the composition; the NumPy ops are a backend (host/)."""
    assert _violations(("graph",), ("backends",)) == []
