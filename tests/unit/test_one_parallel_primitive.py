"""Parallel work returns results, not exceptions (issue 23): one primitive, `executors.group.run_group`,
for the engine, the steps, the benchmark runner and the vSphere lock. A thread pool of its own, or a
caller that catches TargetFailures to split it again into done and failed, is what this keeps out."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "gpuvm"
PRIMITIVE = SRC / "executors" / "group.py"


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_only_the_primitive_runs_a_thread_pool():
    pools = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if path != PRIMITIVE and "ThreadPoolExecutor" in names:
                pools.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert pools == []


def test_no_caller_catches_target_failures_to_split_them_again():
    caught = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None and "TargetFailures" in ast.unparse(node.type):
                caught.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert caught == []
