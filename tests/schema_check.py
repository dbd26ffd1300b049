"""Validate a gpuvm JSON document against its schema (src/gpuvm/schemas/, by the document's "schema" id)."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from gpuvm.documents import VERSIONS, schema


def _registry() -> Registry:
    resources = [(schema(name)["$id"], Resource.from_contents(schema(name))) for name in VERSIONS]
    return Registry().with_resources(resources)


def check(document: dict[str, Any]) -> str:
    """Raise jsonschema's ValidationError unless `document` matches the schema it names; the command."""
    command = document["schema"].removeprefix("gpuvm.").split("/")[0]
    Draft202012Validator.check_schema(schema(command))
    Draft202012Validator(schema(command), registry=_registry()).validate(document)
    return command
