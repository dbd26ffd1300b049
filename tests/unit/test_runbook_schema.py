"""The runbook's JSON Schema (`gpuvm schema runbook`) and its reference (docs/runbook.md) are what the
pydantic models say; every playbook names the shipped schema and matches it (issue 23)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.documents import schema
from gpuvm.runbook.reference import reference_markdown
from gpuvm.runbook.schema import schema_text

REPO = Path(__file__).parents[2]
SHIPPED = REPO / "src" / "gpuvm" / "schemas" / "runbook.json"
PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yaml"))
MODELINE = "# yaml-language-server: $schema="
REGENERATE = "regenerate it: gpuvm schema runbook > src/gpuvm/schemas/runbook.json"


@functools.cache
def _validator() -> Draft202012Validator:
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(shipped)
    return Draft202012Validator(shipped)


def _yaml(path: Path) -> dict:
    return YAML(typ="safe").load(path.read_text(encoding="utf-8"))  # YAML 1.2, as editors read it


def test_the_shipped_schema_is_what_the_models_say_and_what_the_command_prints():
    assert SHIPPED.read_text(encoding="utf-8") == schema_text(), REGENERATE
    printed = CliRunner().invoke(app, ["schema", "runbook"])
    assert printed.exit_code == 0 and printed.output == schema_text()
    _validator()


def test_the_runbook_reference_is_generated_from_the_models():
    committed = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    assert committed == reference_markdown(), "regenerate it: gpuvm schema runbook --markdown > docs/runbook.md"
    printed = CliRunner().invoke(app, ["schema", "runbook", "--markdown"])
    assert printed.exit_code == 0 and printed.output == committed
    # every field of a model is in it, with the comment the model gives it
    assert "| `allow_reboot` | boolean | `false` | ... and reboot (still needs --allow-host-reboot) |" in committed
    assert "| `count` | integer (≥ 1, ≤ 4096) |" in committed  # VM groups, which the loader expands


@pytest.mark.parametrize("path", PLAYBOOKS, ids=[p.name for p in PLAYBOOKS])
def test_every_playbook_names_the_shipped_schema_and_matches_it(path: Path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(MODELINE), f"{path.name}: first line must be `{MODELINE}<relative path>`"
    assert (path.parent / first.removeprefix(MODELINE)).resolve() == SHIPPED.resolve()
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in _validator().iter_errors(_yaml(path))]
    assert not errors, errors


@pytest.mark.parametrize("edit, where", [
    (lambda rb: rb["hosts"][0].update(reboot=True), ["hosts", 0]),  # a misspelt key
    (lambda rb: rb["vms"][0].update(power="maybe"), ["vms", 0]),
    (lambda rb: rb["vms"][0]["gpus"].update(mode="mig"), ["vms", 0]),
    (lambda rb: rb["vms"].append({"name": "train-{n}", "cpus": 4}), ["vms", 4]),  # neither a VM nor a group
    (lambda rb: rb["guests"]["hosts"][0].update(slots=0), ["guests", "hosts", 0]),
])
def test_the_schema_refuses_what_the_models_refuse(edit, where):
    runbook = copy.deepcopy(_yaml(REPO / "playbooks" / "lab.yaml"))
    edit(runbook)
    errors = list(_validator().iter_errors(runbook))
    assert errors and all(any(path[:len(where)] == where for path in _paths(e)) for e in errors), errors


@pytest.mark.parametrize("drop, where", [
    (lambda rb: rb["hosts"][0]["nvidia_host_driver"].pop("sha256"), ["hosts", 0, "nvidia_host_driver"]),
    (lambda rb: rb["guests"]["driver"].pop("sha256"), ["guests", "driver"]),
])
def test_an_installers_sha256_is_required_by_the_schema_as_by_validate(drop, where, tmp_path):
    """docs/runbook.md said `nvidia_host_driver.sha256` may be null, while validate requires it."""
    from gpuvm.errors import InputError
    from gpuvm.runbook.loader import load_runbook

    path = REPO / "playbooks" / "vgpu-from-bare-esxi.yaml"
    runbook = copy.deepcopy(_yaml(path))
    drop(runbook)
    errors = list(_validator().iter_errors(runbook))
    assert errors and all(any(p[:len(where)] == where for p in _paths(e)) for e in errors), errors
    text = path.read_text(encoding="utf-8").splitlines(keepends=True)
    written = tmp_path / "rb.yaml"
    holder = "nvidia_host_driver" if where[0] == "hosts" else "driver"
    first = next(i for i, line in enumerate(text) if line.strip().startswith(f"{holder}:"))
    cut = next(i for i in range(first, len(text)) if text[i].strip().startswith("sha256:"))
    written.write_text("".join(text[:cut] + text[cut + 1:]), encoding="utf-8")
    with pytest.raises(InputError, match=r"driver\.sha256: required field is missing"):
        load_runbook(written)


def _paths(error) -> list[list]:
    """Where an error points, and (for anyOf) where each of its alternatives' errors do."""
    return [list(error.absolute_path)] + [p for sub in error.context or () for p in _paths(sub)]


def test_schema_prints_a_document_schema_and_refuses_an_unknown_name():
    printed = CliRunner().invoke(app, ["schema", "plan"])
    assert printed.exit_code == 0 and json.loads(printed.output) == schema("plan")
    refused = CliRunner().invoke(app, ["schema", "plans"])
    assert refused.exit_code == 2 and "no schema named 'plans'" in refused.output


# Sections whose keys are another tool's format, described as a whole by the model's docstring.
DESCRIBED_AS_A_WHOLE = {"MigDevices": "NVIDIA mig-parted's own format"}


def test_every_runbook_key_says_what_it_means():
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    sections = {"Runbook": shipped, **shipped["$defs"]}
    undescribed = [f"{name}.{key}" for name, section in sections.items() if name not in DESCRIBED_AS_A_WHOLE
                   for key, prop in section.get("properties", {}).items() if not prop.get("description")]
    assert not undescribed, "give these fields a comment in the model (it becomes their description): " + \
        ", ".join(undescribed)
    assert all(sections[name].get("description") for name in DESCRIBED_AS_A_WHOLE)
