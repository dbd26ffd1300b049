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
