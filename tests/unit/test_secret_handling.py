"""Secrets (issue 11, item 7): every secret a runbook names is known from the moment it is loaded,
local benchmark jobs never see gpuvm's environment, and a secret too short to mask is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvm import secrets
from gpuvm.errors import InputError
from gpuvm.executors.local import LocalExecutor, job_environment
from gpuvm.runbook.loader import load_runbook

LAB = Path(__file__).parents[2] / "playbooks" / "lab.yaml"


def test_loading_a_runbook_remembers_the_secrets_it_names(monkeypatch):
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "vc-pass-7f3a")
    monkeypatch.setenv("GOVC_PASSWORD", "govc-pass-19c2")
    load_runbook(LAB)
    assert secrets.redact("vc-pass-7f3a and govc-pass-19c2") == f"{secrets.MASK} and {secrets.MASK}"


def test_a_secret_too_short_to_mask_is_refused_with_its_line(monkeypatch):
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "abc")
    with pytest.raises(InputError, match=r"lab\.yaml:\d+: vcenter\.password_env \(GPUVM_VCENTER_PASSWORD\): the "
                                         r"secret is shorter than 6 characters"):
        load_runbook(LAB)
    assert secrets.redact("time: 10:00") == "time: 10:00"


def test_a_local_job_gets_a_minimal_environment(monkeypatch):
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "vc-pass-8e1b")
    monkeypatch.setenv("SOME_TOKEN", "tok-55")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/x/vc-pass-8e1b/lib")  # a kept name, holding a secret
    secrets.remember("vc-pass-8e1b")
    env = LocalExecutor().run_script("env").stdout
    names = {line.split("=", 1)[0] for line in env.splitlines() if "=" in line}
    assert {"NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "PATH"} <= names
    assert not names & {"GPUVM_VCENTER_PASSWORD", "SOME_TOKEN", "LD_LIBRARY_PATH"}
    assert "vc-pass-8e1b" not in env
    assert job_environment({"HOME": "/root", "GOVC_PASSWORD": "x" * 8}) == {"HOME": "/root"}


def _models_in(annotation: object) -> set[type]:
    from typing import get_args

    from pydantic import BaseModel

    found = {annotation} if isinstance(annotation, type) and issubclass(annotation, BaseModel) else set()
    for arg in get_args(annotation):
        found |= _models_in(arg)
    return found


def _reachable(root: type, fields_of) -> set[type]:
    seen, todo = set(), [root]
    while todo:
        kind = todo.pop()
        if kind not in seen:
            seen.add(kind)
            todo += [m for name in fields_of(kind) for m in _models_in(kind.model_fields[name].annotation)]
    return seen


def test_the_secrets_walk_skips_only_models_without_a_secret_field():
    """The walk follows only fields that can hold a `*_env` field (a fleet's thousands of VM entries
    have none): every model class with one is still on its path, and VMs are not."""
    from gpuvm.runbook.model import Runbook
    from gpuvm.runbook.vms import Vm

    every = _reachable(Runbook, lambda kind: list(kind.model_fields))
    walked = _reachable(Runbook, secrets._secret_fields)
    with_secrets = {kind for kind in every if any(name.endswith("_env") for name in kind.model_fields)}
    assert with_secrets and with_secrets <= walked
    assert Vm in every and Vm not in walked


def test_secrets_of_every_kind_are_remembered(monkeypatch, tmp_path):
    values = {"VC_A": "vc-a-pass-1", "VC_B": "vc-b-pass-2", "ESX_PW": "esx-pass-3", "GUEST_PW": "guest-pass-4"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "fleet.yaml").write_text("""vcenters:
  - {name: a, url: "https://a.example/sdk", user: u, password_env: VC_A}
  - {name: b, url: "https://b.example/sdk", user: u, password_env: VC_B}
hosts:
  - {name: esx-01, vcenter: a, ssh: {address: 10.0.0.1, user: root, password_env: ESX_PW}}
vms:
  - {name: vm-1, host: esx-01, vcenter: a}
guests:
  hosts:
    - {vm: vm-1, ssh: {address: 10.0.0.2, user: gpu, password_env: GUEST_PW}}
""")
    load_runbook(tmp_path / "fleet.yaml")
    assert secrets.redact(" ".join(values.values())) == " ".join([secrets.MASK] * 4)
