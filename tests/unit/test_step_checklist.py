"""docs/ARCHITECTURE.md's "Adding a step" table is true of the code (issue 23): every registered step has
a row, in the run order; its runbook fields exist in the models and are read by the resolve layer or
the step; it has step cases; and the test bed stands in for every tool its SSH commands need."""

from __future__ import annotations

import ast
import re
import shlex
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel
from ruamel.yaml import YAML

from gpuvm.engine import STEPS
from gpuvm.runbook.model import Runbook

REPO = Path(__file__).parents[2]
SRC = REPO / "src" / "gpuvm"
STAND_INS = {p.name for p in (REPO / "testbed" / "bin").iterdir() if not p.name.startswith("_")}
# Where runbook fields become a target's desired state: the resolvers (vSphere and SSH, with the
# licensing settings' one reader), the SSH connections and the desired-state modules.
RESOLVE_LAYER = [SRC / "resolve.py", SRC / "resolve_ssh.py", SRC / "licensing.py", SRC / "remote.py",
                 *SRC.glob("desired*.py"), *SRC.glob("desired/*.py")]

# Tools the steps' commands run that every test host has for real (Debian's, on the bed's hosts'
# shared /usr): not stand-ins.
REAL_ON_THE_BED = {"sh", "ip", "curl", "mktemp", "sha256sum", "rm", "mkdir", "tar", "env", "sudo", "ls", "cat",
                   "install", "umask", "scontrol"}  # scontrol: Debian's Slurm, which `make test` installs
# Run by a step, yet neither real on the bed nor a stand-in; why the bed does without them.
NOT_ON_THE_BED = {
    "wget": "esxi.vgpu_manager fetches a bundle given as a URL with ESXi's busybox wget; the bed's tests "
            "give a path on the host",
    "mlnxofedinstall": "guest.rdma's MOFED installer comes in the runbook's tarball; the bed's tests ship "
                       "a tarball with their own script",
}
# Stand-ins no step names in its source; what uses them.
STAND_INS_OF_NO_STEP = {
    "gpuvm-fake-reboot": "the tests reboot a test host with it (the host reboot itself is the simulator's)",
    "nvidia-installer": "run by the stand-in driver package (bed.nvidia_run_package) that guest.driver "
                        "downloads and runs with sh",
}


def checklist() -> list[dict[str, typing.Any]]:
    """The rows of ARCHITECTURE.md's table, top to bottom."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").split("## Adding a step", 1)[1]
    table = text.split("| step | role | runbook field (turns it on) | stand-ins (`testbed/bin/`) |\n", 1)[1]
    rows = []
    for line in table.splitlines()[1:]:
        if not line.startswith("|"):
            break
        step, role, fields, stand_ins = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append({"step": step.strip("`"), "role": role, "fields": re.findall(r"`([^`]+)`", fields),
                     "stand_ins": set(re.findall(r"`([^`]+)`", stand_ins))})
    return rows


ROWS = {row["step"]: row for row in checklist()}


def test_every_registered_step_has_a_row_in_the_run_order_with_its_role():
    assert [row["step"] for row in checklist()] == [step.name for step in STEPS]
    assert {step.name: step.role for step in STEPS} == {name: row["role"] for name, row in ROWS.items()}


def _field(model: type[BaseModel], name: str) -> typing.Any:
    assert name in model.model_fields, f"{model.__name__} has no field {name!r}"
    return model.model_fields[name].annotation


def _model_of(annotation: typing.Any) -> type[BaseModel] | None:
    """The runbook model an annotation holds (through Optional, lists and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := _model_of(arg)) is not None:
            return found
    return None


def _resolve_path(path: str) -> str:
    """Walk `guests.hosts[].mig` through the models; the leaf field's name."""
    model: type[BaseModel] | None = Runbook
    parts = path.replace("[]", "").split(".")
    for i, part in enumerate(parts):
        assert model is not None, f"{path}: {'.'.join(parts[:i])} is not a section"
        annotation = _field(model, part)
        model = _model_of(annotation)
    return parts[-1]


def _names_read(paths: list[Path]) -> set[str]:
    """Every attribute read and every string constant in these modules (a field is read as
    `entry.mig` or by name, `guest_setting(target, "driver")`)."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return names


def _step_sources(step_name: str) -> list[Path]:
    """The step's module (or package) and the modules of gpuvm it imports directly."""
    step = next(s for s in STEPS if s.name == step_name)
    module = sys.modules[step.observe.__module__]
    main = Path(module.__file__)
    own = list(main.parent.glob("*.py")) if main.name == "__init__.py" else [main]
    imported = set()
    for path in own:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuvm."):
                candidate = SRC.parent / (node.module.replace(".", "/") + ".py")
                if candidate.exists() and "steps" not in candidate.parts[-2:-1] and candidate.name != "base.py":
                    imported.add(candidate)
    return own + sorted(imported)


@pytest.mark.parametrize("name", [step.name for step in STEPS])
def test_each_runbook_field_exists_and_reaches_the_step(name: str):
    row = ROWS[name]
    assert row["fields"], f"{name}: name the runbook field that asks for it"
    read = _names_read(RESOLVE_LAYER + _step_sources(name))
    for path in row["fields"]:
        leaf = _resolve_path(path)
        assert leaf in read, f"{name}: {path} is read neither by the resolve layer nor by the step"


@pytest.mark.parametrize("name", [step.name for step in STEPS])
def test_each_step_has_cases(name: str):
    assert list((REPO / "tests" / "steps" / name).glob("*.yaml")), f"add cases under tests/steps/{name}/"


def _programs_of_cases(name: str) -> set[str]:
    """The programs the step's cases run (their `commands:` argument lists), sudo and env settings
    looked through."""
    programs = set()
    for path in (REPO / "tests" / "steps" / name).glob("*.yaml"):
        for command in YAML(typ="safe").load(path.read_text(encoding="utf-8")).get("commands") or []:
            if "\n" in command.strip():
                continue  # a script of fixed shell text (executor.run_script): POSIX tools, real on the bed
            words = shlex.split(command)
            while words and (words[0] in ("sudo", "env", "-n") or "=" in words[0]):
                words = words[1:]
            if words and words[0] == "-u":
                words = words[2:]
            if words and words[0] != "put":  # "put PATH mode M": the fake executor's file upload (SFTP), no program
                programs.add(Path(words[0]).name)
    return programs


def _stand_ins_named(name: str) -> set[str]:
    """The stand-ins the step's source names as a program (a string that is the tool's name, or starts
    with it and a space)."""
    named = set()
    for path in _step_sources(name)[:1] if not _is_package(name) else _step_sources(name):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                word = node.value.split(" ", 1)[0]
                if word in STAND_INS:
                    named.add(word)
    return named


def _is_package(name: str) -> bool:
    step = next(s for s in STEPS if s.name == name)
    return Path(sys.modules[step.observe.__module__].__file__).name == "__init__.py"


@pytest.mark.parametrize("name", [step.name for step in STEPS if step.over_ssh])
def test_the_test_bed_stands_in_for_every_tool_an_ssh_step_runs(name: str):
    row = ROWS[name]
    assert row["stand_ins"] <= STAND_INS, f"{name}: no such stand-in in testbed/bin: {row['stand_ins'] - STAND_INS}"
    assert _stand_ins_named(name) == row["stand_ins"], f"{name}: the stand-ins its source names"
    missing = _programs_of_cases(name) - STAND_INS - REAL_ON_THE_BED - set(NOT_ON_THE_BED)
    assert not missing, f"{name} runs {sorted(missing)}: add a stand-in to testbed/bin (or say why the bed needs none)"


def test_vsphere_steps_need_no_stand_in_and_every_stand_in_has_a_user():
    assert all(not ROWS[s.name]["stand_ins"] for s in STEPS if not s.over_ssh)
    used = set().union(*(row["stand_ins"] for row in ROWS.values()))
    assert STAND_INS - used == set(STAND_INS_OF_NO_STEP), "a stand-in no step uses: remove it, or say who does"
