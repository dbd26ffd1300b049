"""Every step as data, pyinfra-style: one folder per step under tests/steps/, one YAML file per case.

A case gives a target and a fact, and what the step must make of them:

    doc: what the case shows (one line)
    desired: {...}        # vSphere steps: the DesiredHost / DesiredVm
    inventory: {...}      # vSphere steps whose fact is not their inventory slice: that slice,
                          # or {hosts: [...], vms: [...]} where the step reads more of the inventory
    esxi: {...}           # esxi.* steps: the DesiredEsxi (name, login, its settings; `where` for errors)
    guest: {...}          # guest.* steps: the DesiredGuest
    others: [{...}]       # SSH steps whose apply reaches other targets (the image's builder, the mesh's peers)
    files: {name: text}   # SSH steps: files on this machine the target names (a licence token), by relative path
    fact: ...             # what the step's observe returns, as data
    changes:              # plan: the changes, in order (omitted keys are not compared)
      - {resource: ..., field: ..., before: ..., after: ..., disruption: host-reboot,
         action: {type: SetMtu, interface: ens64np1, mtu: 9000}}
    error: regex          # or: plan refuses with an InputError matching this
    # apply: the planned changes are applied, and what reached the world is compared
    responses: {regex: {stdout: ..., exit: 0}}   # SSH: canned answers (others: exit 0, no output); a list:
                                                 # what successive runs answer, the last one repeating
    commands: [ip link set dev ens64np1 mtu 9000, ...]  # SSH: every command line run, in order
    apply_error: regex    # SSH: apply refuses with a GpuvmError matching this (after `commands`)
    state: {runtime.powerState: poweredOff}      # vSphere: attributes every managed object reads
                                                 # (a list: what successive reads return, the last one repeating)
    calls:                                       # vSphere: every method called on a managed object
      - {object: VirtualMachine:vm-1, method: ReconfigVM_Task, kwargs: {spec: {numCPUs: 8}}}
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from ruamel.yaml import YAML

from gpuvm.engine import STEPS
from gpuvm.errors import GpuvmError, InputError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.plan import Change
from gpuvm.desired import DesiredEsxi, DesiredGuest, DesiredHost, DesiredVm
from gpuvm.remote import Cluster
from gpuvm.steps.base import Context, Step
from gpuvm.vsphere.facts import HostFacts, Inventory, VmFacts

CASES = Path(__file__).resolve().parents[1] / "steps"
BY_NAME = {step.name: step for step in STEPS}


def _cases() -> list[Any]:
    return [pytest.param(path, id=f"{path.parent.name}/{path.stem}") for path in sorted(CASES.glob("*/*.yaml"))]


def test_every_step_has_cases():
    covered = {path.parent.name for path in CASES.glob("*/*.yaml")}
    assert sorted(BY_NAME) == sorted(covered)
    applied = {path.parent.name for path in CASES.glob("*/*.yaml") if {"commands", "calls"} & set(_load(path))}
    assert sorted(BY_NAME) == sorted(applied), "every step needs a case that checks what apply does"


@pytest.mark.parametrize("path", _cases())
def test_case(path: Path, tmp_path: Path, mocker, monkeypatch) -> None:
    case = _load(path)
    monkeypatch.chdir(tmp_path)  # where `files` are, and a relative path in the target finds them
    for name, text in case.get("files", {}).items():
        (tmp_path / name).write_text(text)
    step = BY_NAME[path.parent.name]
    target, ctx, fake = _target(step, case, tmp_path)
    fact = _fact(step, case["fact"])
    if "error" in case:
        with pytest.raises(InputError, match=case["error"]):
            step.plan(target, fact)
        return
    changes = step.plan(target, fact)
    assert [_shown(c, case_change) for c, case_change in zip(changes, case["changes"])] == case["changes"]
    assert len(changes) == len(case["changes"]), [c.to_dict() for c in changes]
    if "commands" in case:
        fake.responses.update({re.compile(k): _response(v) for k, v in case.get("responses", {}).items()})
        fake.responses[re.compile("")] = _response({})  # anything else succeeds, silently
        if "apply_error" in case:  # apply refuses, after the commands listed
            with pytest.raises(GpuvmError, match=case["apply_error"]):
                _apply(step, ctx, target, changes)
        else:
            _apply(step, ctx, target, changes)
        assert fake.commands == case["commands"]
    if "calls" in case:
        refs = _mock_session(mocker, ctx, case.get("state", {}))
        for name, module in list(sys.modules.items()):  # no task is left running on any object
            if name.startswith("gpuvm.steps") and hasattr(module, "wait_for_other_tasks"):
                mocker.patch.object(module, "wait_for_other_tasks", return_value=0)
        mocker.patch("gpuvm.vsphere.tasks.wait", return_value=None)
        _apply(step, ctx, target, changes)
        assert _calls(refs) == case["calls"]


# -- building the inputs ------------------------------------------------------------------------

def _load(path: Path) -> dict[str, Any]:
    return json.loads(json.dumps(YAML(typ="safe").load(path.read_text())))  # plain dicts and lists


def _target(step: Step, case: dict, tmp_path: Path) -> tuple[Any, Context, FakeExecutor | None]:
    if not step.over_ssh:
        desired = TypeAdapter(DesiredHost if step.role == "host" else DesiredVm).validate_python(case["desired"])
        facts = case.get("inventory", case["fact"])  # the target's inventory slice, where the fact is not it
        if "hosts" in facts or "vms" in facts:
            inventory = Inventory(hosts={h["name"]: h for h in facts.get("hosts", [])},
                                  vms={v["name"]: v for v in facts.get("vms", [])})
        elif step.role == "host":
            inventory = Inventory(hosts={desired.name: HostFacts.model_validate(facts)})
        else:
            inventory = Inventory(vms={desired.name: VmFacts.model_validate(facts)})
        return desired, Context(inventory=inventory), None
    kind = TypeAdapter(DesiredEsxi if step.role == "esxi" else DesiredGuest)
    target, *others = [_known(t, kind.validate_python(t)) for t in [case[step.role], *case.get("others", [])]]
    fake = FakeExecutor(target.name)
    targets = {t.name: t for t in [target, *others]}
    cluster = Cluster(tmp_path, targets, {name: fake for name in targets})  # one executor records every command
    return target, Context(cluster=cluster), fake


def _known(data: Any, value: Any) -> Any:
    """`value`, validated from `data`, once every key of `data` is a field of it (pydantic ignores a
    misspelt key of a dataclass: the case would test its default)."""
    if dataclasses.is_dataclass(value) and isinstance(data, dict):
        unknown = set(data) - {f.name for f in dataclasses.fields(value)}
        assert not unknown, f"not fields of {type(value).__name__}: {sorted(unknown)}"
        for key, item in data.items():
            _known(item, getattr(value, key))
    elif isinstance(data, list) and isinstance(value, tuple):
        for item, inner in zip(data, value):
            _known(item, inner)
    return value


def _fact(step: Step, data: Any) -> Any:
    kind = typing.get_type_hints(step.observe).get("return", Any)
    if kind is Any:  # vSphere steps that observe their inventory slice
        kind = HostFacts if step.role == "host" else VmFacts
    return TypeAdapter(kind).validate_python(data)


def _response(data: dict | list) -> Any:
    """A canned answer; a list: what successive runs answer, the last one repeating."""
    if isinstance(data, list):
        answers = [_response(each) for each in data]
        return lambda call: answers.pop(0) if len(answers) > 1 else answers[0]
    return CommandResult("", data.get("exit", 0), data.get("stdout", ""), data.get("stderr", ""))


def _shown(change: Change, expected: dict) -> dict:
    """The change as the case writes it, limited to the keys the case names."""
    data = change.to_dict()
    if change.action is not None:
        data["action"] = {"type": type(change.action).__name__, **dataclasses.asdict(change.action)}
    data = json.loads(json.dumps(data, default=str))
    return {k: data.get(k) for k in expected}


# -- applying -----------------------------------------------------------------------------------

def _apply(step: Step, ctx: Context, target: Any, changes: list[Change]) -> None:
    if step.apply_all is not None:
        by_target: dict[str, list[Change]] = {target.name: []}
        for change in changes:
            by_target.setdefault(change.target, []).append(change)
        if failures := step.apply_all(ctx, by_target, 1):
            raise next(iter(failures.values()))
    else:
        step.apply(ctx, target, changes)


def _mock_session(mocker, ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    """A session whose managed objects record the methods called on them and read `state`."""
    refs: dict[str, Any] = {}

    def ref(kind: str, moid: str) -> Any:
        key = f"{kind}:{moid}"
        if key not in refs:
            obj = mocker.MagicMock(name=key)
            own = state.get(key) or {k: v for k, v in state.items() if ":" not in k}  # per object, or shared
            for path, value in own.items():
                holder = obj
                *parents, last = path.split(".")
                for part in parents:
                    holder = getattr(holder, part)
                if isinstance(value, list):  # successive reads
                    reads = iter(value)
                    setattr(type(holder), last, mocker.PropertyMock(
                        side_effect=lambda reads=reads, last=value[-1]: next(reads, last)))
                else:
                    setattr(holder, last, value)
            refs[key] = obj
        return refs[key]

    ctx.session = mocker.MagicMock()
    ctx.session.ref.side_effect = ref
    ctx.intents = mocker.MagicMock(name="intents")  # intent records: see tests/unit/test_reboot_intent.py
    return refs


def _calls(refs: dict[str, Any]) -> list[dict]:
    from pyVmomi.VmomiJSONEncoder import VmomiJSONEncoder

    calls = []
    for key, obj in refs.items():
        for name, args, kwargs in obj.method_calls:
            if "." in name:
                continue  # a property read through a mock, not a vSphere method
            call: dict[str, Any] = {"object": key, "method": name}
            if args:
                call["args"] = _pruned(json.loads(json.dumps(list(args), cls=VmomiJSONEncoder, strip_dynamic=True)))
            if kwargs:
                call["kwargs"] = _pruned(json.loads(json.dumps(kwargs, cls=VmomiJSONEncoder, strip_dynamic=True)))
            calls.append(call)
    return calls


def _pruned(value: Any) -> Any:
    """vSphere data objects without their unset (null or empty) properties."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value

