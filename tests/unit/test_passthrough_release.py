"""Stale passthrough (issue 9, item 7): a device gpuvm turned passthrough on for, that the runbook no
longer selects and no VM will use, is planned back off; capacity counts it as free for vGPU."""

from __future__ import annotations

import pytest

from gpuvm.engine import make_plan
from gpuvm.errors import InputError
from gpuvm.plan import Disruption
from gpuvm.steps.host_passthrough import Forget, SetPassthrough
from gpuvm.vsphere.facts import HostFacts, VmPciDevice
from gpuvm.vsphere.owned import Owned
from tests.unit.factories import inventory, r750xa, vm
from tests.unit.test_capacity import PASSTHROUGH_HOST, VGPU_HOST, h100_host, runbook

GPUS = ("0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0")


def owned(host: HostFacts, *addresses: str, released: tuple[str, ...] = ()) -> HostFacts:
    """The host with its `gpuvm.owned` record as `host.passthrough` leaves it."""
    return host.model_copy(update={"owned": Owned(passthrough=list(addresses), released=list(released))})


def releases(plan) -> dict[str, tuple]:
    return {c.resource.split()[1]: (c.before, c.after, c.disruption, c.action)
            for c in plan.changes if c.step == "host.passthrough"}


def classic(address: str) -> VmPciDevice:
    return VmPciDevice(key=1, kind="classic", address=address, vendor_id=0x10DE, device_id=0x2331)


def test_moving_a_host_from_passthrough_to_vgpu_turns_passthrough_off_and_fits_the_vgpus(tmp_path):
    """Seen: the host's GPUs stayed passthrough-enabled, so they could not serve vGPU."""
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 4}}\n")
    was = vm("vm1", pci=[classic(a) for a in GPUS])  # the same VM had the four GPUs by DirectPath
    plan, desired = make_plan(rb, inventory([owned(h100_host(enabled=True, active=True), *GPUS)], [was]))
    assert desired.hosts["esx-01"].release == list(GPUS)
    assert releases(plan) == {a: ("active", "off", Disruption.HOST_REBOOT, SetPassthrough(a, False, False))
                              for a in GPUS}
    assert any(c.step == "host.reboot" for c in plan.changes)


def test_without_the_owned_record_the_devices_are_left_alone_and_the_vgpus_refused(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 4}}\n")
    with pytest.raises(InputError, match=r"GPU 0000:17:00.0 is passthrough"):
        make_plan(rb, inventory([h100_host(enabled=True, active=True)], [vm("vm1")]))


def test_a_device_enabled_by_hand_is_only_noted(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 1}}\n")
    host = h100_host(pci=[d.model_copy(update={"passthru_enabled": d.id == GPUS[3], "passthru_active": d.id == GPUS[3]})
                          for d in h100_host().pci])
    plan, desired = make_plan(rb, inventory([owned(host, released=GPUS[:3])], [vm("vm1")]))
    assert desired.hosts["esx-01"].release == []
    assert releases(plan) == {}
    [note] = [n for n in plan.notes if GPUS[3] in n.message]
    assert "gpuvm did not enable it" in note.message


@pytest.mark.parametrize("holder", [
    vm("other", pci=[classic(GPUS[0])]),  # a VM the runbook does not manage, powered off
    vm("other", power_state="poweredOn", pci=[classic(GPUS[0])]),
    vm("other", pci=[VmPciDevice(key=1, kind="dynamic", vendor_id=0x10DE, device_id=0x2331)]),
], ids=["unmanaged-off", "unmanaged-on", "dynamic-same-model"])
def test_a_device_another_vm_holds_is_kept(tmp_path, holder):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, cpus: 4}\n", hosts="hosts: [{name: esx-01}]\n")
    plan, desired = make_plan(rb, inventory([owned(h100_host(enabled=True, active=True), GPUS[0])], [vm("vm1"), holder]))
    assert desired.hosts["esx-01"].release == []
    assert releases(plan) == {}


def test_a_runbook_vm_that_wants_the_device_keeps_it_and_a_selected_device_is_never_released(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 1, addresses: ['0000:b1:00.0']}}\n",
                 hosts="hosts: [{name: esx-01, passthrough: [{address: '0000:17:00.0'}]}]\n")
    plan, desired = make_plan(rb, inventory([owned(r750xa(enabled=True, active=True), *GPUS)], [vm("vm1", firmware="efi")]))
    assert desired.hosts["esx-01"].release == ["0000:31:00.0", "0000:ca:00.0"]  # b1 is vm1's, 17 is selected


def test_a_device_turned_off_before_stays_pending_until_the_host_reboots(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 4}}\n")
    host = owned(h100_host(enabled=False, active=True), released=GPUS)  # turned off, still bound to passthrough
    plan, _ = make_plan(rb, inventory([host], [vm("vm1")]))
    assert releases(plan) == {a: ("disabled (reboot pending)", "off", Disruption.HOST_REBOOT, None) for a in GPUS}
    assert all(c.pending for c in plan.changes if c.step == "host.passthrough")
    # rebooted: nothing left to do for passthrough
    plan, _ = make_plan(rb, inventory([owned(h100_host(), released=GPUS)], [vm("vm1")]))
    assert releases(plan) == {}


def test_selected_again_after_a_release_is_enabled_again(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 4}}\n", hosts=PASSTHROUGH_HOST)
    plan, desired = make_plan(rb, inventory([owned(r750xa(), released=GPUS)], [vm("vm1", firmware="efi")]))
    assert desired.hosts["esx-01"].release == []
    assert {a for a, (_, after, _, _) in releases(plan).items() if after == "active"} == set(GPUS)


def test_vgpu_host_note_names_only_gpus(tmp_path):
    """ConnectX ports enabled by hand on a vGPU host are not GPUs: no vGPU note for them."""
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, cpus: 4}\n", hosts=VGPU_HOST)
    plan, _ = make_plan(rb, inventory([h100_host(enabled=True, active=True)], [vm("vm1")]))
    noted = {n.message.split()[1] for n in plan.notes if "gpuvm did not enable it" in n.message}
    assert noted == set(GPUS)
