"""Layering: the runbook (what the user declared) never depends on the benchmark machinery."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNBOOK = Path(__file__).resolve().parents[2] / "src" / "gpuvm" / "runbook"


def imported_modules(path: Path) -> set[str]:
    """Every absolute module an import statement in the file names, lazy imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(RUNBOOK.rglob("*.py")), ids=lambda p: p.name)
def test_runbook_modules_do_not_import_bench(path):
    bench = sorted(n for n in imported_modules(path) if n == "gpuvm.bench" or n.startswith("gpuvm.bench."))
    assert not bench, f"{path.name} imports {', '.join(bench)}"
