"""Release only what nobody uses (issue 21, item 5): ownership read from the host's `gpuvm.owned`
record, users looked for in every VM and template of vCenter, nothing released when the account
cannot see them all."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuvm.engine import make_plan
from gpuvm.plan import Change
from gpuvm.desired import DesiredHost
from gpuvm.steps import host_passthrough
from gpuvm.steps.base import Context
from gpuvm.steps.host_passthrough import Forget, SetPassthrough, owned_after
from gpuvm.vsphere.facts import VmPciDevice
from gpuvm.vsphere.owned import Owned, read
from tests.unit.factories import inventory, vm
from tests.unit.test_capacity import h100_host, runbook
from tests.unit.test_passthrough_release import GPUS, classic, owned, releases

NO_GPUS = "- {name: vm1, host: esx-01, cpus: 4}\n"
HOSTS = "hosts: [{name: esx-01}, {name: esx-02}]\n"


def plan_with(tmp_path, *others, host=None, vms=NO_GPUS):
    host = host or owned(h100_host(enabled=True, active=True), GPUS[0])
    rb = runbook(tmp_path, vms, hosts=HOSTS)
    book = inventory([host, h100_host(name="esx-02")], [vm("vm1"), *[o for o in others if not o.name.startswith("tpl")]])
    book.templates = {o.name: o for o in others if o.name.startswith("tpl")}
    return make_plan(rb, book)


def test_an_owned_unused_device_is_released(tmp_path):
    plan, desired = plan_with(tmp_path)
    assert desired.hosts["esx-01"].release == [GPUS[0]]
    assert releases(plan)[GPUS[0]][3] == SetPassthrough(GPUS[0], False, False)


@pytest.mark.parametrize("user", [
    vm("elsewhere", host="esx-02", pci=[classic(GPUS[0])]),  # registered on another host
    vm("tpl-train", host="esx-02", pci=[classic(GPUS[0])]),  # a template: its clones take the device
    vm("any-of-two", host="esx-02", pci=[VmPciDevice(key=1, kind="dynamic", vendor_id=0x10DE, device_id=0x20B5,
                                                      also_allowed=["10de:2331"])]),  # H100 allowed second
], ids=["vm-on-another-host", "template", "dynamic-second-allowed-device"])
def test_a_device_any_vm_or_template_in_vcenter_may_use_is_kept(tmp_path, user):
    plan, desired = plan_with(tmp_path, user)
    assert desired.hosts["esx-01"].release == [] and releases(plan) == {}


def test_vms_the_account_cannot_see_release_nothing_and_the_plan_says_why(tmp_path):
    host = owned(h100_host(enabled=True, active=True, vm_moids=["vm-vm1", "vm-hidden"]), GPUS[0])
    plan, desired = plan_with(tmp_path, host=host)
    assert desired.hosts["esx-01"].release == [] and releases(plan) == {}
    [note] = [n.message for n in plan.notes if GPUS[0] in n.message]
    assert "vCenter lists 1 VM(s) this account cannot read (1 on esx-01)" in note
    seen = owned(h100_host(enabled=True, active=True, vm_moids=["vm-vm1"]), GPUS[0])  # every VM read: released
    assert plan_with(tmp_path, host=seen)[1].hosts["esx-01"].release == [GPUS[0]]


def test_a_device_seen_off_loses_gpuvm_ownership_and_enabled_again_by_hand_is_kept(tmp_path):
    reset = owned(h100_host(), GPUS[0])  # a reinstall turned every device off
    plan, desired = plan_with(tmp_path, host=reset)
    assert desired.hosts["esx-01"].forget == [GPUS[0]]
    assert releases(plan) == {GPUS[0]: ("gpuvm", "none (seen off)", host_passthrough.Disruption.NONE, Forget(GPUS[0]))}
    record = owned_after(reset.owned, plan.changes, reset)
    assert record == Owned()
    by_hand = h100_host(enabled=True, active=True).model_copy(update={"owned": record})  # the operator's again
    plan, desired = plan_with(tmp_path, host=by_hand)
    assert desired.hosts["esx-01"].release == [] and releases(plan) == {}


def test_the_record_follows_enable_release_and_forget(tmp_path):
    facts = h100_host(pci=[d.model_copy(update={"passthru_active": d.id == GPUS[2]}) for d in h100_host().pci])
    before = Owned(passthrough=[GPUS[0], GPUS[1]], released=[GPUS[2], GPUS[3]])  # b1 still waits for its reboot
    changes = [Change("host.passthrough", "esx-01", "pci", "passthrough", "off", "active", action=a)
               for a in (SetPassthrough(GPUS[3], True, False), SetPassthrough(GPUS[0], False, False), Forget(GPUS[1]))]
    assert owned_after(before, changes, facts) == Owned(passthrough=[GPUS[3]], released=[GPUS[2], GPUS[0]])


def test_a_value_gpuvm_did_not_write_owns_nothing():
    for value in ("not json", '{"passthrough": 3}', "x" * 20_000, '{"passthrough": ["0000:17:00.0"]}',  # a half
                  '{"v": 1, "passthrough": ["0000:17:00.0"], "released": []}',  # versioned, no run
                  '{"passthrough": ["all of them"], "released": []}', "[" * 9_000):
        owned, foreign = read(value, "esx-01")
        assert owned == Owned() and foreign is not None and foreign.field == "gpuvm.owned", value
    previous = '{"passthrough": ["0000:17:00.0"], "released": []}'  # the previous release's, exactly
    assert read(previous, "esx-01") == (Owned(passthrough=["0000:17:00.0"]), None)
    now = Owned(passthrough=["0000:17:00.0"]).encode("3f2a9c1d0e4b")
    assert '"v": 1' in now and read(now, "esx-01") == (Owned(passthrough=["0000:17:00.0"]), None)


def test_apply_records_ownership_on_the_host_before_the_passthrough_call(mocker):
    calls = []
    store = mocker.patch.object(host_passthrough, "OwnedStore")
    store.return_value.edit.side_effect = lambda host, what, change: calls.append(("record", change(Owned())))
    system = SimpleNamespace(UpdatePassthruConfig=lambda config: calls.append(("enable", [c.id for c in config])))
    session = SimpleNamespace(ref=lambda kind, moid: system if kind == "host.PciPassthruSystem" else moid)
    facts = h100_host(passthru_system="pts-1")
    ctx = Context(session=session, inventory=inventory([facts], []))
    change = host_passthrough.plan(DesiredHost("esx-01", [GPUS[0]], None, True), facts)
    host_passthrough.apply(ctx, DesiredHost("esx-01", [GPUS[0]], None, True), change)
    assert calls == [("record", Owned(passthrough=[GPUS[0]])), ("enable", [GPUS[0]])]


def test_the_inventory_reads_every_allowed_device_of_a_dynamic_entry():
    from pyVmomi import vim

    from gpuvm.vsphere.inventory import vm_pci_devices

    allowed = [vim.vm.device.VirtualPCIPassthrough.AllowedDevice(vendorId=0x10DE, deviceId=d) for d in (0x20B5, 0x2331)]
    device = vim.vm.device.VirtualPCIPassthrough(
        key=13000, backing=vim.vm.device.VirtualPCIPassthrough.DynamicBackingInfo(allowedDevice=allowed))
    [read] = vm_pci_devices([device])
    assert (read.vendor_id, read.device_id, read.also_allowed) == (0x10DE, 0x20B5, ["10de:2331"])
