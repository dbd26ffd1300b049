"""No import cycles in gpuvm: a cycle is a sign that a type lives in the wrong module.

The graph is built from the source with `ast`: every `import` and `from ... import` at any level
(function-local imports count: they only hide a cycle), relative imports resolved. Only the body of
`if TYPE_CHECKING:` is left out: it is never run, it only names types for the checker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements Python may run: all of them but the body of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if _type_checking_only(node):
            assert isinstance(node, ast.If)
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def imports_of(path: Path, modules: set[str], src: Path = SRC) -> set[str]:
    """The gpuvm modules the file imports: `from X import y` names X.y where that is a module, else X."""
    me = module_name(path, src)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    edges = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:  # `import gpuvm.x.y` where y is a name, not a module
                target = target.rpartition(".")[0]
            edges.update(m for m in _run_by_import(target, me) if m in modules)
    return edges


def _run_by_import(target: str, me: str) -> list[str]:
    """What importing `target` from module `me` needs: the target, and the packages above it that
    are not above `me` (those run before `me` does; a namespace package, no file, runs nothing)."""
    parts = target.split(".")
    above_me = {".".join(me.split(".")[:n]) for n in range(1, me.count(".") + 2)}
    packages = [".".join(parts[:n]) for n in range(1, len(parts))]
    return [m for m in packages if m not in above_me] + ([target] if target and target != me else [])


def import_graph(root: Path = SRC / "gpuvm") -> dict[str, set[str]]:
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root.parent) for p in paths}
    return {module_name(p, root.parent): imports_of(p, modules, root.parent) for p in paths}


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each module of one
    imports every other, through the others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One (shortest) cycle through each component."""
    return [_one_cycle(graph, c) for c in components(graph)]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle from the component's first module back to it (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in component {sorted(component)}")


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The checker itself: function-local and relative imports are edges, TYPE_CHECKING ones not."""
    pkg = tmp_path / "gpuvm"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "other").mkdir()
    for name in ("__init__", "a", "b", "c", "sub/__init__", "sub/d", "other/__init__", "other/e"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "c.py").write_text("from gpuvm.other.e import x\n")
    (pkg / "a.py").write_text("def f():\n    from gpuvm.b import thing\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuvm import c\n"
                              "else:\n    from .sub import d\n")
    (pkg / "sub" / "d.py").write_text("from .. import a\nimport gpuvm.c\n")
    graph = import_graph(pkg)
    assert graph["gpuvm.a"] == {"gpuvm.b"}
    assert graph["gpuvm.b"] == {"gpuvm.sub", "gpuvm.sub.d"}
    assert graph["gpuvm.sub.d"] == {"gpuvm.a", "gpuvm.c"}
    assert graph["gpuvm.c"] == {"gpuvm.other", "gpuvm.other.e"}  # a package's __init__ runs first
    assert cycles(graph) == [["gpuvm.a", "gpuvm.b", "gpuvm.sub.d", "gpuvm.a"]]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_gpuvm_has_no_import_cycle(graph):
    found = [f"{' → '.join(_one_cycle(graph, c))}  (in a cycle of {len(c)}: {', '.join(sorted(c))})"
             for c in components(graph)]
    assert not found, "import cycles in src/gpuvm:\n" + "\n".join(found)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module importing `start` makes Python import (what it imports, and so on)."""
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_only_the_engine_imports_the_resolver(graph):
    """Steps, capacity, topology and the bench code take desired state from `gpuvm.desired`."""
    assert sorted(m for m, edges in graph.items() if "gpuvm.resolve" in edges) == ["gpuvm.engine"]


def test_desired_state_and_device_facts_sit_below_everything(graph):
    above = [m for m in _reach(graph, "gpuvm.desired")
             if m in ("gpuvm.resolve", "gpuvm.engine") or m.startswith(("gpuvm.steps", "gpuvm.bench"))]
    assert not above, f"gpuvm.desired imports {', '.join(sorted(above))}"
    assert _reach(graph, "gpuvm.vgpu_profiles") == set()  # a leaf: the runbook's checks read it too
