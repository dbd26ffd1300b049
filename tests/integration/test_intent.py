"""Intent on the object: recorded on hosts and VMs in vCenter, read back in the one inventory read."""

from __future__ import annotations

from gpusim import Simulator
from tests.integration.vcenter import use_simulator

from gpuvm.runbook.vcenters import VCenter
from gpuvm.vsphere.intent import FIELD, IntentStore
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session, resolve_target


def test_intents_recorded_on_hosts_and_vms_are_read_back_and_cleared_one_act_at_a_time(tmp_path, monkeypatch):
    with Simulator(hosts=1, vms_per_host=1) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
            assert read_inventory(session).hosts["esx-01"].intents == {}  # no field defined yet
            facts = read_inventory(session)
            host = session.ref("HostSystem", facts.hosts["esx-01"].moid)
            vm = session.ref("VirtualMachine", facts.vms["esx-01-vm1"].moid)
            store = IntentStore(session, "c0ffee000003")
            store.record(host, "maintenance", "reboot for 2 changes")
            memo = {"booted": "2026-11-25T16:50:17+00:00", "changes": [["0123456789ab", "ba9876543210"]]}
            store.record(host, "rebooted", "for changes", **memo)
            store.record(vm, "power-off", "reboot of esx-01", host="esx-01", restore="poweredOn")
            facts = read_inventory(session)
            assert set(facts.hosts["esx-01"].intents) == {"maintenance", "rebooted"}
            assert facts.hosts["esx-01"].intents["rebooted"].data == memo
            intent = facts.vms["esx-01-vm1"].intents["power-off"]
            assert (intent.run, intent.why, intent.data) == ("c0ffee000003", "reboot of esx-01",
                                                             {"host": "esx-01", "restore": "poweredOn"})
            assert intent.since  # vCenter's time
            store.clear(host, "maintenance")
            store.clear(vm, "power-off")
            facts = read_inventory(session)
            assert set(facts.hosts["esx-01"].intents) == {"rebooted"} and facts.vms["esx-01-vm1"].intents == {}
            # a value someone else wrote is shown, never acted on
            session.content.customFieldsManager.SetField(entity=vm, key=store.key(), value="not json")
            vm_facts = read_inventory(session).vms["esx-01-vm1"]
            assert vm_facts.intents == {} and [f.why for f in vm_facts.foreign] == ["not JSON"]
            assert any(f.name == FIELD for f in session.content.customFieldsManager.field)
