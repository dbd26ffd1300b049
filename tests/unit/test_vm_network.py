"""`network:` of a cloned VM: the runbook field (names with spaces, only with a template, file:line
errors), the plan-time check against the inventory (a network of the VM's host, a template with a
NIC) and the create line that names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvm.clone_network import clone_network
from gpuvm.errors import InputError
from gpuvm.desired import Clone, CloneNetwork, DesiredVm
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import vm_lifecycle
from gpuvm.vsphere.facts import HostFacts, Inventory, NetworkFacts, VmFacts, VmNic

RUNBOOK = """\
vcenter: {password_env: GPUVM_VCENTER_PASSWORD}
hosts:
  - {name: esx-01}
  - {name: esx-02}
vms:
  - name: train-1
    host: %s
%s
"""


def load(tmp_path: Path, fields: str, host: str = "esx-01"):
    path = tmp_path / "runbook.yaml"
    path.write_text(RUNBOOK % (host, fields))
    return load_runbook(path)


def test_a_network_name_may_hold_spaces(tmp_path):
    rb = load(tmp_path, "    template: ubuntu-gpu\n    network: VM Network")
    assert rb.vms[0].network == "VM Network"


def test_network_needs_a_template(tmp_path):
    with pytest.raises(InputError) as err:
        load(tmp_path, "    network: gpu-net")
    assert "runbook.yaml:6" in str(err.value) and "network apply to a VM gpuvm creates: give template" in str(err.value)


@pytest.mark.parametrize("name", ["' lead'", "''", "'a\\tb'", "x" * 81])
def test_a_bad_network_name_names_its_line(tmp_path, name):
    with pytest.raises(InputError) as err:
        load(tmp_path, f"    template: ubuntu-gpu\n    network: {name}" if name.startswith("x") else
             f'    template: ubuntu-gpu\n    network: "{name[1:-1]}"')
    assert "runbook.yaml:9: vms[0].network:" in str(err.value) and "is not a network name" in str(err.value)


def inventory(template_nic: bool = True) -> Inventory:
    nets = {"VM Network": [NetworkFacts(name="VM Network", moid="network-7")],
            "gpu-net": [NetworkFacts(name="gpu-net", moid="network-35")],
            "DC0_DVPG0": [NetworkFacts(name="DC0_DVPG0", moid="dvportgroup-13", portgroup_key="dvportgroup-13",
                                       switch_uuid="fe a9 79")]}
    return Inventory(
        hosts={"esx-01": HostFacts(name="esx-01", moid="host-1", networks=["network-7", "dvportgroup-13"]),
               "esx-02": HostFacts(name="esx-02", moid="host-2", networks=["network-7", "dvportgroup-13", "network-35"])},
        templates={"ubuntu-gpu": VmFacts(name="ubuntu-gpu", moid="vm-9",
                                         nic=VmNic(key=4000, type="VirtualVmxnet3") if template_nic else None)},
        networks=nets)


def resolved(tmp_path: Path, network: str, host: str = "esx-01", template_nic: bool = True) -> CloneNetwork | None:
    rb = load(tmp_path, f"    template: ubuntu-gpu\n    network: {network}", host)
    inv = inventory(template_nic)
    return clone_network(rb, 0, rb.vms[0], inv.templates["ubuntu-gpu"], inv)


def test_a_standard_and_a_distributed_port_group_of_the_host(tmp_path):
    assert resolved(tmp_path, "gpu-net", "esx-02") == CloneNetwork("gpu-net", "network-35", 4000, "VirtualVmxnet3")
    assert resolved(tmp_path, "DC0_DVPG0") == CloneNetwork("DC0_DVPG0", "dvportgroup-13", 4000, "VirtualVmxnet3",
                                                           "dvportgroup-13", "fe a9 79")


def test_a_network_the_host_lacks_or_vcenter_lacks_is_refused_naming_the_line(tmp_path):
    with pytest.raises(InputError) as err:
        resolved(tmp_path, "gpu-net")
    assert str(err.value).endswith("runbook.yaml:9: vms[0].network: network 'gpu-net' for VM 'train-1' not on host "
                                   "esx-01 (its networks: DC0_DVPG0, VM Network)"), str(err.value)
    with pytest.raises(InputError) as err:
        resolved(tmp_path, "storage")
    assert "network 'storage' for VM 'train-1' not found in vCenter (networks of esx-01: DC0_DVPG0, VM Network)" in \
        str(err.value)


def test_a_template_without_a_nic_is_refused(tmp_path):
    with pytest.raises(InputError) as err:
        resolved(tmp_path, "gpu-net", "esx-02", template_nic=False)
    assert "runbook.yaml:9" in str(err.value) and "template ubuntu-gpu has no virtual NIC" in str(err.value)


def test_the_create_line_names_the_network():
    net = CloneNetwork("gpu-net", "network-35", 4000, "VirtualVmxnet3")
    vm = DesiredVm(name="train-1", host="esx-02", cpus=8, memory_mb=65536, firmware="efi", reservation_locked=True,
                   devices=[], extra_config={}, power="on", clone=Clone("ubuntu-gpu", "LocalDS_0", network=net))
    [change] = vm_lifecycle.plan(vm, vm_lifecycle.LifecycleFact(None, {}))
    assert change.after == "create: clone of ubuntu-gpu on esx-02, datastore LocalDS_0, network gpu-net"
    assert change.action.clone.network == net
