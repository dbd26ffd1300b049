"""A refused or declined apply writes nothing (issue 33, item 2): it once cleared a host's reboot memo
(a SetField in vCenter) before its permission checks and the prompt, then said "nothing touched"."""

from __future__ import annotations

import uuid

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.runbook.vcenters import VCenter
from gpuvm.steps.reboot_memo import ACT
from gpuvm.vsphere.intent import IntentStore
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session, resolve_target
from tests.integration.vcenter import raw_state, use_simulator

pytestmark = pytest.mark.integration


def gpuvm(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input, catch_exceptions=False)


def intents_of_host() -> dict:
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        return read_inventory(session).hosts["esx-01"].intents


def test_an_apply_refused_for_a_flag_or_declined_at_the_prompt_leaves_the_reboot_memo(tmp_path, monkeypatch):
    # esx-01 has a memo of an earlier gpuvm reboot and nothing waits on it any more: an apply that goes
    # ahead clears it. The VM's firmware change needs it powered off, which this apply does not allow.
    book = tmp_path / "rb.yaml"
    book.write_text("vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
                    "hosts: [{name: esx-01}]\n"
                    "vms: [{name: esx-01-vm1, host: esx-01, firmware: efi}]\n")
    with Simulator(hosts=1, vms_per_host=1, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
            host = session.ref("HostSystem", read_inventory(session).hosts["esx-01"].moid)
            IntentStore(session, uuid.uuid4().hex[:12]).record(host, ACT, "rebooted for 1 change(s)",
                                                                booted="2026-11-28T00:00:00+00:00",
                                                                changes=[["0123456789ab", "ba9876543210"]])
        memo = intents_of_host()[ACT]
        before = raw_state(sim)

        refused = gpuvm("apply", str(book), "--yes")
        assert refused.exit_code == 2 and "--allow-power-off" in refused.output, refused.output
        declined = gpuvm("apply", str(book), "--allow-power-off", input="n\n")
        assert declined.exit_code != 0 and "Traceback" not in declined.output, declined.output
        assert intents_of_host().get(ACT) == memo, "a refused apply cleared the host's reboot memo"
        assert raw_state(sim) == before

        applied = gpuvm("apply", str(book), "--yes", "--allow-power-off")
        assert applied.exit_code == 0, applied.output
        assert ACT not in intents_of_host(), "an apply that went ahead kept a memo nothing waits on"
