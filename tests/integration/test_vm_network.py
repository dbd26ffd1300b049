"""`network:` of a cloned VM against the simulated vCenter: the plan names the network, apply clones
with the template's NIC on it (a standard port group: network + deviceName; a distributed port
group: switch uuid + port group key), and a network vCenter or the VM's host lacks exits 2 naming
the runbook line before anything is cloned. gpusim refuses such a clone too (CannotAccessNetwork)."""

from __future__ import annotations

import pytest

from tests.integration.test_vm_lifecycle import TRAINING, gpuvm, runbook, simulator
from tests.integration.vcenter import pyvmomi, raw_state

pytestmark = pytest.mark.integration


def nic(si, name: str):
    from pyVmomi import vim

    vm = si.content.searchIndex.FindByInventoryPath(f"DC0/vm/{name}")
    assert vm is not None, name
    nics = [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualEthernetCard)]
    assert len(nics) == 1, nics  # the template's one NIC, edited, not a second one
    return vm, nics[0]


def test_a_clone_joins_the_runbooks_network_on_its_host(monkeypatch, tmp_path):
    from pyVmomi import vim

    sim = simulator(monkeypatch, tmp_path, networks=["gpu-net:esx-02"])
    try:
        wrong = runbook(tmp_path, TRAINING[:1], extra="    network: gpu-net\n")  # esx-01 lacks it
        before = raw_state(sim)
        refused = gpuvm("plan", str(wrong))
        assert refused.exit_code == 2
        text = " ".join(refused.output.split())
        assert ("runbook.yaml:13: vms[0].network: network 'gpu-net' for VM 'train-1' not on host esx-01 "
                "(its networks: DC0_DVPG0, VM Network)") in text, refused.output
        missing = runbook(tmp_path, TRAINING[:1], extra="    network: storage-net\n")
        refused = gpuvm("apply", str(missing), "--yes")
        assert refused.exit_code == 2
        assert "runbook.yaml:13: vms[0].network: network 'storage-net' for VM 'train-1' not found in vCenter" in \
            " ".join(refused.output.split()), refused.output
        assert raw_state(sim) == before, "a refused plan cloned something"

        book = runbook(tmp_path, TRAINING[1:], extra="    network: gpu-net\n")
        planned = gpuvm("plan", str(book))
        assert "create: clone of ubuntu-gpu on esx-02, datastore LocalDS_0, network gpu-net" in \
            " ".join(planned.output.split()), planned.output
        applied = gpuvm("apply", str(book), "--yes")
        assert applied.exit_code == 0, applied.output
        with pyvmomi(sim) as si:
            vm, card = nic(si, "train-2")
            assert isinstance(card, vim.vm.device.VirtualVmxnet3) and card.key == 4000
            assert isinstance(card.backing, vim.vm.device.VirtualEthernetCard.NetworkBackingInfo)
            assert card.backing.deviceName == "gpu-net" and card.backing.network.name == "gpu-net"
            assert [n.name for n in vm.network] == ["gpu-net"]
            _, source = nic(si, "ubuntu-gpu")
            assert source.backing.deviceName == "VM Network" and card.macAddress != source.macAddress
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0
    finally:
        sim.stop()


def test_a_clone_joins_a_distributed_port_group(monkeypatch, tmp_path):
    from pyVmomi import vim

    sim = simulator(monkeypatch, tmp_path)
    try:
        book = runbook(tmp_path, TRAINING[:1], extra="    network: DC0_DVPG0\n")
        assert gpuvm("apply", str(book), "--yes").exit_code == 0
        with pyvmomi(sim) as si:
            _, card = nic(si, "train-1")
            port = card.backing.port
            assert isinstance(card.backing, vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo)
            dvs = [d for d in si.content.viewManager.CreateContainerView(
                si.content.rootFolder, [vim.DistributedVirtualSwitch], True).view][0]
            pg = [p for p in dvs.portgroup if p.name == "DC0_DVPG0"][0]
            assert port.switchUuid == dvs.uuid and port.portgroupKey == pg.key
    finally:
        sim.stop()


def test_gpusim_refuses_a_clone_onto_a_network_its_host_lacks(monkeypatch, tmp_path):
    """What vCenter does with a NIC whose network the target host lacks: the clone task fails with
    CannotAccessNetwork ("Network interface '...' uses network '...', which is not accessible.")."""
    from pyVmomi import vim

    sim = simulator(monkeypatch, tmp_path, networks=["gpu-net:esx-02"])
    try:
        with pyvmomi(sim) as si:
            content = si.content
            template = content.searchIndex.FindByInventoryPath("DC0/vm/ubuntu-gpu")
            host = [h for h in content.viewManager.CreateContainerView(content.rootFolder, [vim.HostSystem], True).view
                    if h.name == "esx-01"][0]
            net = [n for n in host.parent.parent.parent.networkFolder.childEntity if n.name == "gpu-net"][0]
            card = [d for d in template.config.hardware.device if isinstance(d, vim.vm.device.VirtualEthernetCard)][0]
            card.backing = vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(network=net, deviceName="gpu-net")
            spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(host=host), config=vim.vm.ConfigSpec(deviceChange=[
                vim.vm.device.VirtualDeviceSpec(operation="edit", device=card)]))
            task = template.CloneVM_Task(folder=template.parent, name="stray", spec=spec)
            while task.info.state in ("queued", "running"):
                pass
            assert task.info.state == "error" and isinstance(task.info.error, vim.fault.CannotAccessNetwork)
            assert "uses network 'gpu-net', which is not accessible" in task.info.error.msg
            assert content.searchIndex.FindByInventoryPath("DC0/vm/stray") is None
    finally:
        sim.stop()
