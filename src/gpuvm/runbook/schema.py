"""The runbook's JSON Schema, made from the pydantic models (`gpuvm schema runbook`).

A field's description is its `Field(description=...)`, else the comment the model gives it (on its
line, or the comment lines right above it): the comments in the models (`model.py` and its sections' modules) are the documentation, so
editors (the playbooks' `yaml-language-server` modeline) and `docs/runbook.md` show what the code
says. The schema describes the YAML as written, so a `vms:` entry may also be a VM group (`count`,
`hosts`), which the loader expands before the models see it (`runbook/groups.py`).
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import re
import tokenize
from typing import Any

from pydantic import BaseModel

SCHEMA_ID = "https://gpuvm.invalid/schemas/runbook.json"
MAX_GROUP_COUNT = 4096  # runbook/groups.py's MAX_GROUP (imported lazily: groups stays a leaf)


def runbook_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a runbook file, as `src/gpuvm/schemas/runbook.json` ships it."""
    from gpuvm.runbook.groups import MAX_GROUP
    from gpuvm.runbook.model import Runbook

    assert MAX_GROUP == MAX_GROUP_COUNT
    body = Runbook.model_json_schema(mode="validation")
    defs = body.get("$defs", {})
    for model in _models(Runbook):
        schema = defs.get(model.__name__) if model is not Runbook else body
        if schema is not None:
            _describe(model, schema)
    defs["VmGroup"] = _vm_group(defs["Vm"])
    body["properties"]["vms"]["items"] = {"anyOf": [{"$ref": "#/$defs/Vm"}, {"$ref": "#/$defs/VmGroup"}]}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "gpuvm runbook",
            "description": "What gpuvm configures (hosts, VMs, guests) and measures (benchmarks, sizing). "
                           "Reference: docs/runbook.md.",
            **{k: v for k, v in body.items() if k not in ("title", "description")}}


def schema_text() -> str:
    """The shipped file's text: the schema, indented, one trailing newline."""
    return json.dumps(runbook_schema(), indent=2, ensure_ascii=False) + "\n"


def _vm_group(vm: dict[str, Any]) -> dict[str, Any]:
    """A `vms:` entry that stands for several VMs: a VM's fields, a name pattern, `count` and/or `hosts`."""
    properties = dict(vm["properties"])
    properties["name"] = {**properties["name"], "description": "a pattern: {n} is 1, 2, …, {index} 0, 1, … "
                                                               "(format specs allowed), like train-{n:02d}"}
    properties["count"] = {"type": "integer", "minimum": 1, "maximum": MAX_GROUP_COUNT,
                           "description": "how many VMs (default: one per host of hosts)"}
    properties["hosts"] = {"type": "array", "items": {"type": "string"}, "minItems": 1,
                           "description": "the VMs go round robin over these hosts"}
    return {"type": "object", "title": "VmGroup", "additionalProperties": False, "properties": properties,
            "required": ["name"], "anyOf": [{"required": ["count"]}, {"required": ["hosts"]}],
            "description": "Several VMs from one entry, each with every other field as given; a static "
                           "cloud_init address counts up from VM to VM."}


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model reachable from `root`'s fields, `root` first."""
    seen: list[type[BaseModel]] = []

    def visit(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in seen:
                seen.append(annotation)
                for info in annotation.model_fields.values():
                    visit(info.annotation)
            return
        for arg in getattr(annotation, "__args__", ()) or ():
            visit(arg)
        for extra in getattr(annotation, "__metadata__", ()) or ():
            visit(extra)

    visit(root)
    return seen


def _describe(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Fill in the descriptions the schema lacks from the model's docstring and field comments."""
    doc = inspect.getdoc(model)
    if doc and model.__doc__ and "description" not in schema:
        schema["description"] = doc
    comments = field_comments(model)
    for name, info in model.model_fields.items():
        key = info.alias or name
        prop = schema.get("properties", {}).get(key)
        if prop is not None and "description" not in prop and comments.get(name):
            prop["description"] = comments[name]


_FIELD = re.compile(r"^\s{4}([A-Za-z_][A-Za-z0-9_]*)\s*:")


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in the class body: the one on its line (or its continuation lines), else
    the comment lines right above it. A field a base model declares has the base's comment."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ != BaseModel.__module__:
            found |= {name: text for name, text in _own_comments(cls) if name in model.model_fields}
    return found


@functools.cache
def _own_comments(cls: type[BaseModel]) -> tuple[tuple[str, str], ...]:
    """The comments of the fields declared in the body of `cls`, once per class: a base's are asked
    for by every model derived from it, and `inspect.getsource` parses the whole module each time."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return ()
    lines = source.splitlines()
    on_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            on_line[token.start[0] - 1] = token.string.lstrip("#").strip()
    found: list[tuple[str, str]] = []
    above: list[str] = []
    for i, line in enumerate(lines):
        if re.match(r"^\s{4}#", line):
            above.append(on_line.get(i, ""))
            continue
        match = _FIELD.match(line)
        if match:
            own = on_line.get(i) if line.strip()[0] != "#" else None
            text = own or " ".join(above)
            if text:
                found.append((match.group(1), text))
        above = []
    return tuple(found)
