"""GPU topology in plans: NUMA nodes, NVLink pairs and NIC placement (R750xa: 17+31 on node 0,
b1+ca on node 1, bridges join 17+31 and b1+ca, the ConnectX-6 ports on node 0)."""

from __future__ import annotations

import pytest

from gpuvm.engine import make_plan
from gpuvm.errors import InputError
from gpuvm.steps.esxi_topology import GpuLinks
from gpuvm.vsphere.facts import VmPciDevice
from tests.unit.factories import inventory, r750xa, vm
from tests.unit.test_plan_steps import HOST, runbook

PAIRS = '    nvlink: [["0000:17:00.0", "0000:31:00.0"], ["0000:b1:00.0", "0000:ca:00.0"]]\n'
PAIRED_HOST = HOST + PAIRS
LAB = [r750xa(enabled=True, active=True)]


def plan_of(tmp_path, vms: str, hosts: str = PAIRED_HOST, names=("vm1", "vm2", "vm3"), **kwargs):
    return make_plan(runbook(tmp_path, vms, hosts), inventory(LAB, [vm(n) for n in names]), **kwargs)


def addresses(desired, name: str) -> list[str]:
    return [d.address for d in desired.vms[name].devices]


def warnings(plan) -> list[str]:
    return [n.message for n in plan.notes if n.level == "warning"]


def test_a_two_gpu_vm_gets_two_gpus_of_one_numa_node(tmp_path):
    # seen: after a 1-GPU VM took 17:00.0, a 2-GPU VM got 31:00.0 (node 0) and b1:00.0 (node 1), silently
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 1}}
    - {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 2}}
    """
    plan, desired = plan_of(tmp_path, vms)
    assert addresses(desired, "vm2") == ["0000:b1:00.0", "0000:ca:00.0"]
    assert warnings(plan) == []


def test_gpus_split_across_nodes_are_a_warning_and_strict_refuses(tmp_path):
    vms = "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 3}}\n"
    plan, desired = plan_of(tmp_path, vms)
    assert addresses(desired, "vm1") == ["0000:17:00.0", "0000:31:00.0", "0000:b1:00.0"]
    assert any("its 3 GPUs span NUMA nodes 0 and 1 (0000:17:00.0 on 0, 0000:31:00.0 on 0, 0000:b1:00.0 on 1)" in w
               for w in warnings(plan))
    with pytest.raises(InputError, match=r"rb\.yaml:\d+: vms\[0\]\.gpus: its 3 GPUs span NUMA nodes 0 and 1 .*"
                                         r"\(refused by topology: strict\)"):
        plan_of(tmp_path, vms.replace("count: 3}", "count: 3}, topology: strict"))
    with pytest.raises(InputError, match=r"vms\[0\]\.gpus: its 3 GPUs span"):  # the runbook's default
        plan_of(tmp_path, vms, "topology: strict\n" + PAIRED_HOST)


def test_numa_node_is_honoured_and_a_gpu_elsewhere_is_named(tmp_path):
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 1, addresses: ["0000:b1:00.0"]}}
    - {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 2}, numa_node: 1}
    """
    plan, desired = plan_of(tmp_path, vms)
    assert addresses(desired, "vm2") == ["0000:17:00.0", "0000:ca:00.0"]
    assert "GPU(s) 0000:17:00.0 are on NUMA node(s) 0, not on 1" in warnings(plan)


def test_dynamic_directpath_shows_the_gpus_on_its_numa_node(tmp_path):
    # seen: a dynamic DirectPath VM with numa_node: 1 was powered on with two NUMA-0 GPUs
    vms = "- {name: vm1, host: esx-01, gpus: {mode: dynamic, count: 2, id: '10de:20b5'}, numa_node: 1}\n"
    plan, desired = plan_of(tmp_path, vms)
    shown = [c.after for c in plan.for_step("vm.hardware") if c.field == "device"]
    assert shown == ["dynamic 10de:20b5 (vSphere picks from 0000:b1:00.0, 0000:ca:00.0)"] * 2
    assert desired.vms["vm1"].extra_config["numa.nodeAffinity"] == "1"
    assert warnings(plan) == []


def test_dynamic_directpath_needs_enough_gpus_on_its_numa_node(tmp_path):
    hosts = HOST.replace("[{model: A100}, ", '[{address: "0000:17:00.0"}, {address: "0000:b1:00.0"}, ')
    vms = "- {name: vm1, host: esx-01, gpus: {mode: dynamic, count: 2}, numa_node: 1}\n"
    with pytest.raises(InputError, match=r"vms\[0\]\.gpus\.count: needs 2 GPU\(s\) 10de:20b5 on NUMA node 1 "
                                         r"\(numa_node\) but host esx-01 passes through 1 there: 0000:b1:00\.0$"):
        make_plan(runbook(tmp_path, vms, hosts), inventory([r750xa()], [vm("vm1")]))


def test_dynamic_directpath_without_numa_node_may_span_nodes(tmp_path):
    plan, _ = plan_of(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: dynamic, count: 2}}\n")
    assert [w.split(":")[0] for w in warnings(plan)] == ["vSphere picks its 2 GPUs at power-on from 0000",
                                                         "vSphere picks its 2 GPUs at power-on from 4"]
    assert "they may span NUMA nodes; set numa_node" in warnings(plan)[0]
    assert "they may not be NVLink-bridged pairs (pairs: 17:00.0+31:00.0, b1:00.0+ca:00.0" in warnings(plan)[1]


def test_nic_away_from_its_gpus_is_a_warning(tmp_path):
    vms = ("- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}, numa_node: 1, "
           "nics: [{address: '0000:4b:00.0'}]}\n")
    plan, _ = plan_of(tmp_path, vms)
    assert warnings(plan) == ["NIC 0000:4b:00.0 is on NUMA node 0, its GPUs on 1: RDMA traffic to them crosses "
                              "the socket interconnect"]
    plan, _ = plan_of(tmp_path, vms.replace("numa_node: 1", "numa_node: 0"))
    assert warnings(plan) == []


def test_single_gpus_leave_free_nvlink_pairs_whole(tmp_path):
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 1, addresses: ["0000:b1:00.0"]}}
    - {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 1}}
    - {name: vm3, host: esx-01, gpus: {mode: passthrough, count: 2}}
    """
    plan, desired = plan_of(tmp_path, vms)
    assert addresses(desired, "vm2") == ["0000:ca:00.0"]  # b1's partner: 17+31 stay a pair
    assert addresses(desired, "vm3") == ["0000:17:00.0", "0000:31:00.0"]
    assert warnings(plan) == []


def test_nvlink_pairs_come_before_one_numa_node(tmp_path):
    crossed = PAIRED_HOST.replace('"0000:31:00.0"], ["0000:b1:00.0"', '"0000:b1:00.0"], ["0000:31:00.0"')
    plan, desired = plan_of(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}}\n", crossed)
    assert addresses(desired, "vm1") == ["0000:17:00.0", "0000:b1:00.0"]
    assert [w.split(" (")[0] for w in warnings(plan)] == ["its 2 GPUs span NUMA nodes 0 and 1"]


def test_gpus_that_are_not_a_bridged_pair_are_named(tmp_path):
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2, addresses: ["0000:17:00.0", "0000:ca:00.0"]}}
    """
    plan, _ = plan_of(tmp_path, vms)
    assert ("GPU(s) 0000:17:00.0, 0000:ca:00.0 have no NVLink partner among its GPUs (pairs: 17:00.0+31:00.0, "
            "b1:00.0+ca:00.0 (from hosts[0].nvlink)): their traffic crosses PCIe") in warnings(plan)


def test_unknown_nvlink_pairs_are_a_warning_and_strict_refuses(tmp_path):
    vms = "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}}\n"
    plan, _ = plan_of(tmp_path, vms, HOST)
    assert warnings(plan) == ["which GPUs are NVLink-bridged is not known (declare hosts[0].nvlink, or give the host "
                              "ssh: gpuvm reads them with `nvidia-smi topo -m` in its ESXi shell): its GPUs may not "
                              "be bridged"]
    with pytest.raises(InputError, match=r"vms\[0\]\.gpus: which GPUs are NVLink-bridged is not known"):
        plan_of(tmp_path, vms.replace("}}", "}, topology: strict}"), HOST)


def test_pairs_read_in_the_esxi_shell_fill_an_undeclared_host(tmp_path):
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 1, addresses: ["0000:b1:00.0"]}}
    - {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 1}}
    """
    seen = GpuLinks(gpus=("0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"),
                    pairs=(("0000:17:00.0", "0000:31:00.0"), ("0000:b1:00.0", "0000:ca:00.0")))
    plan, desired = plan_of(tmp_path, vms, HOST, facts={("esxi.topology", "esx-01"): seen})
    assert addresses(desired, "vm2") == ["0000:ca:00.0"]
    assert desired.hosts["esx-01"].nvlink.source == "`nvidia-smi topo -m` in the ESXi shell of esx-01"


def test_a_split_vm_is_given_one_node_again(tmp_path):
    split = vm("vm1", pci=[VmPciDevice(key=k, kind="classic", address=a, vendor_id=0x10DE, device_id=0x20B5)
                           for k, a in ((1, "0000:31:00.0"), (2, "0000:b1:00.0"))])
    vms = "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}}\n"
    plan, desired = make_plan(runbook(tmp_path, vms, PAIRED_HOST), inventory(LAB, [split]))
    assert addresses(desired, "vm1") == ["0000:17:00.0", "0000:31:00.0"]
    assert [(c.before, c.after) for c in plan.for_step("vm.hardware") if c.field == "device"] == [
        ("0000:b1:00.0", None), (None, "0000:17:00.0 GA100 [A100 PCIe 80GB]")]


def test_gpus_other_vms_of_the_runbook_have_are_left_to_them(tmp_path):
    holder = vm("vm2", pci=[VmPciDevice(key=1, kind="classic", address=a, vendor_id=0x10DE, device_id=0x20B5)
                            for a in ("0000:17:00.0", "0000:31:00.0")])
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}}
    - {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 2}}
    """
    _, desired = make_plan(runbook(tmp_path, vms, PAIRED_HOST), inventory(LAB, [vm("vm1"), holder]))
    assert addresses(desired, "vm1") == ["0000:b1:00.0", "0000:ca:00.0"]
    assert addresses(desired, "vm2") == ["0000:17:00.0", "0000:31:00.0"]
