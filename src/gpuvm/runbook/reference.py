"""docs/runbook.md: the runbook reference, written from the runbook's JSON Schema (`runbook/schema.py`),
so that it says what the models accept: `gpuvm schema runbook --markdown > docs/runbook.md`
(tests/unit/test_runbook_schema.py fails when the committed file differs)."""

from __future__ import annotations

import json
from typing import Any

from gpuvm.runbook.schema import runbook_schema

HEADER = """\
# Runbook reference

<!-- Generated from the pydantic models (src/gpuvm/runbook/): `gpuvm schema runbook --markdown > docs/runbook.md`.
     Do not edit by hand: tests/unit/test_runbook_schema.py compares this file with what the models say. -->

Every key a runbook may hold, section by section: its type, its default (a key without one is
required) and what it means (the model's own comment on the field). Unknown keys are refused.
The same facts as a JSON Schema: `gpuvm schema runbook` (shipped as `src/gpuvm/schemas/runbook.json`;
the playbooks name it on their first line, `# yaml-language-server: $schema=...`, so editors complete
and check fields). A worked, annotated runbook is in the [user guide](guide.md#the-runbook-annotated);
what gpuvm checks and decides from it is there too.
"""


def reference_markdown() -> str:
    """The whole of docs/runbook.md."""
    schema = runbook_schema()
    defs = schema["$defs"]
    top = {k: v for k, v in schema.items() if k != "description"}  # the header says it, for this page
    parts = [HEADER, _section("Runbook (top level)", top)]
    for name in _order(schema, defs):
        parts.append(_section(name, defs[name]))
    return "\n".join(parts)


def _order(schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """Definitions in the order a reader meets them: depth first from the top-level fields."""
    seen: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name not in seen:
                    seen.append(name)
                    walk(defs[name])
            for key, value in node.items():
                if key != "$defs":
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema)
    return seen + [name for name in defs if name not in seen]


def _section(title: str, schema: dict[str, Any]) -> str:
    lines = [f"## {title}", ""]
    if schema.get("description"):
        lines += [_one_line(schema["description"]), ""]
    if "anyOf" in schema and "properties" in schema:
        needs = " or ".join("`" + "`, `".join(option["required"]) + "`" for option in schema["anyOf"])
        lines += [f"Needs {needs}.", ""]
    properties = schema.get("properties", {})
    if not properties:
        return "\n".join(lines)
    required = set(schema.get("required", []))
    lines += ["| key | type | default | what |", "|---|---|---|---|"]
    for key, prop in properties.items():
        default = "*required*" if key in required else _default(prop)
        lines.append(f"| `{key}` | {_type(prop)} | {default} | {_cell(prop.get('description', ''))} |")
    lines.append("")
    return "\n".join(lines)


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return "—"
    if isinstance(prop["default"], dict) and prop["default"]:
        return "its fields' defaults"
    return _value(prop["default"])


def _type(prop: dict[str, Any]) -> str:
    """A short type: `[Host](#host)`, `list of …`, `"a" \\| "b"`, `integer 1–16`, …"""
    if "$ref" in prop:
        name = prop["$ref"].removeprefix("#/$defs/")
        return f"[{name}](#{name.lower()})"
    if "const" in prop:
        return _value(prop["const"])
    if "enum" in prop:
        return " \\| ".join(_value(v) for v in prop["enum"])
    for union in ("anyOf", "oneOf"):
        if union in prop:
            options = [_type(option) for option in prop[union]]
            return " \\| ".join(dict.fromkeys(o for o in options if o != "null")) + (
                " \\| null" if "null" in options else "")
    kind = prop.get("type")
    if kind == "array":
        if "prefixItems" in prop:
            return "[" + ", ".join(_type(item) for item in prop["prefixItems"]) + "]"
        return "list of " + _type(prop.get("items", {}))
    if kind == "object":
        extra = prop.get("additionalProperties")
        return "map to " + _type(extra) if isinstance(extra, dict) else "map"
    if kind is None:
        return "any"
    text = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean",
            "null": "null"}.get(kind, str(kind))
    return text + _bounds(prop)


def _bounds(prop: dict[str, Any]) -> str:
    low = prop.get("minimum", prop.get("exclusiveMinimum"))
    high = prop.get("maximum", prop.get("exclusiveMaximum"))
    parts = []
    if low is not None:
        parts.append(("> " if "exclusiveMinimum" in prop else "≥ ") + _number(low))
    if high is not None:
        parts.append(("< " if "exclusiveMaximum" in prop else "≤ ") + _number(high))
    if "minLength" in prop:
        parts.append(f"at least {prop['minLength']} character(s)")
    if "pattern" in prop:
        parts.append(f"matching `{prop['pattern']}`".replace("|", "\\|"))
    return " (" + ", ".join(parts) + ")" if parts else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _value(value: Any) -> str:
    return "`" + json.dumps(value, ensure_ascii=False).replace("|", "\\|") + "`"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    return _one_line(text).replace("|", "\\|")
