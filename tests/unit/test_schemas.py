"""The schema files: one per command that prints JSON, each a valid JSON Schema naming its id."""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.documents import VERSIONS, schema, schema_id
from tests.schema_check import check

SCHEMAS = Path(__file__).parents[2] / "src" / "gpuvm" / "schemas"


def test_every_command_has_one_valid_schema_file_and_every_file_a_command():
    assert {p.stem for p in SCHEMAS.glob("*.json")} - {"runbook"} == set(VERSIONS)  # runbook: test_runbook_schema.py
    for command in VERSIONS:
        Draft202012Validator.check_schema(schema(command))
        assert schema(command)["properties"]["schema"].get("const", schema_id(command)) == schema_id(command)


def test_size_json_matches_its_schema():
    result = CliRunner().invoke(app, ["size", "--model", "resnet18", "--json"])
    assert result.exit_code == 0, result.output
    assert check(json.loads(result.stdout)) == "size"
