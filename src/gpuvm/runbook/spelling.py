"""An unknown field's likely meaning: the runbook's field of that place spelt closest (`cpu` → `cpus`),
read from the shipped JSON Schema (src/gpuvm/schemas/runbook.json), which describes the YAML as written."""

from __future__ import annotations

import difflib
import functools
import json
from importlib import resources
from typing import Any

Node = dict[str, Any]


@functools.cache
def _schema() -> Node:
    return json.loads(resources.files("gpuvm").joinpath("schemas", "runbook.json").read_text(encoding="utf-8"))


def _shapes(node: Node) -> list[Node]:
    """The shapes a schema node allows, its references followed (a union: each of its members)."""
    if "$ref" in node:
        return _shapes(_schema()["$defs"][node["$ref"].rsplit("/", 1)[1]])
    members = [member for key in ("anyOf", "oneOf", "allOf") for member in node.get(key, [])]
    return [shape for member in members for shape in _shapes(member)] if members else [node]


def _children(node: Node, part: str | int) -> list[Node]:
    if isinstance(part, int):
        return [shape["items"] for shape in _shapes(node) if isinstance(shape.get("items"), dict)]
    return [shape["properties"][part] for shape in _shapes(node) if part in shape.get("properties", {})]


def closest_field(path: tuple[str | int, ...]) -> str | None:
    """The field of the place `path` names (its last part: the unknown key) spelt closest to it, if any is close."""
    nodes = [_schema()]
    for part in path[:-1]:
        nodes = [child for node in nodes for child in _children(node, part)]
    names = sorted({name for node in nodes for shape in _shapes(node) for name in shape.get("properties", {})})
    match = difflib.get_close_matches(str(path[-1]), names, n=1, cutoff=0.75) if path else []
    return match[0] if match else None
