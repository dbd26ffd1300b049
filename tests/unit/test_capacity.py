"""Capacity, exclusivity and compatibility at plan time (gpuvm.capacity): each case seen in the field
(issue 9, item 5) is refused with exit code 2 and one line naming runbook line, VM, host and GPU."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gpuvm.capacity import GpuRoom, place_vgpu
from gpuvm.engine import make_plan
from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook
from gpuvm.vgpu_profiles import vgpu_profile
from gpuvm.vsphere.facts import VmPciDevice
from tests.unit.factories import H100, inventory, r750xa, vm

VGPU_HOST = """
hosts:
  - name: esx-01
    graphics: shared_direct
"""
PASSTHROUGH_HOST = """
hosts:
  - name: esx-01
    passthrough: [{model: A100}]
"""


def runbook(tmp_path: Path, vms: str, hosts: str = VGPU_HOST):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(hosts) + "vms:\n" + textwrap.indent(textwrap.dedent(vms), "  "))
    return load_runbook(path)


def h100_host(**extra):
    return r750xa(gpu=H100, vgpu_profiles=["grid_h100-80c", "grid_h100-40c", "grid_h100-3-40c"], **extra)


def classic(address: str) -> VmPciDevice:
    return VmPciDevice(key=1, kind="classic", address=address, vendor_id=0x10DE, device_id=0x2331)


def test_five_full_gpu_vgpus_on_passthrough_gpus_held_by_another_vm(tmp_path):
    """Seen: 5 grid_h100-80c planned on a host whose 4 GPUs were passthrough and held by a running VM."""
    other = vm("training", power_state="poweredOn",
               pci=[classic(a) for a in ("0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0")])
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 5}}\n")
    with pytest.raises(InputError) as e:
        make_plan(rb, inventory([h100_host(enabled=True, active=True)], [vm("vm1"), other]))
    assert str(e.value).endswith(
        "vms[0].gpus: VM vm1 on host esx-01: vGPU 1 of 5 (grid_h100-80c) fits on no GPU: "
        "GPU 0000:17:00.0 is passthrough (held by training); GPU 0000:31:00.0 is passthrough (held by training); "
        "GPU 0000:b1:00.0 is passthrough (held by training); GPU 0000:ca:00.0 is passthrough (held by training)")
    assert "rb.yaml:" in str(e.value)


def test_five_full_gpu_vgpus_do_not_fit_four_free_gpus(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 5}}\n")
    with pytest.raises(InputError, match=r"vGPU 5 of 5 \(grid_h100-80c\) fits on no GPU: GPU 0000:17:00.0 is full: "
                                         r"1 x 80 GB of 80 GB used by vm1;"):
        make_plan(rb, inventory([h100_host()], [vm("vm1")]))
    four = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 4}}\n")
    make_plan(four, inventory([h100_host()], [vm("vm1")]))


def test_vgpus_of_vms_the_runbook_does_not_manage_take_room(tmp_path):
    other = vm("desktop", pci=[VmPciDevice(key=1, kind="vgpu", profile="grid_h100-40c")])
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 4}}\n")
    with pytest.raises(InputError, match=r"GPU 0000:17:00.0 runs 40 GB vGPUs of desktop \(one size per GPU\)"):
        make_plan(rb, inventory([h100_host()], [vm("vm1"), other]))


def test_classic_and_dynamic_share_one_pool(tmp_path):
    """Seen: 2 classic + 4 dynamic GPUs planned on a 4-GPU host; power-on failed after the reconfigure."""
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}}
    - {name: vm2, host: esx-01, gpus: {mode: dynamic, count: 4, id: '10de:20b5'}}
    """
    with pytest.raises(InputError) as e:
        make_plan(runbook(tmp_path, vms, PASSTHROUGH_HOST), inventory([r750xa(enabled=True, active=True)],
                                                                     [vm("vm1"), vm("vm2")]))
    assert str(e.value).endswith(
        "vms[1].gpus.count: VM vm2 on host esx-01: needs 4 dynamic DirectPath GPU(s) 10de:20b5 but 2 of the host's "
        "4 passthrough GPU(s) 10de:20b5 are left for it; classic DirectPath holds 2 (vm1)")


def test_dynamic_counts_add_up_across_vms(tmp_path):
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: dynamic, count: 3}}
    - {name: vm2, host: esx-01, gpus: {mode: dynamic, count: 2}}
    """
    with pytest.raises(InputError, match=r"vms\[1\]\.gpus\.count: .* but 1 of the host's 4 passthrough GPU\(s\) "
                                         r"10de:20b5 are left for it; 3 go to dynamic DirectPath of other VMs"):
        make_plan(runbook(tmp_path, vms, PASSTHROUGH_HOST), inventory([r750xa()], [vm("vm1"), vm("vm2")]))


def test_mig_backed_vgpu_needs_gpus_in_mig_mode(tmp_path):
    """Seen: a MIG-backed profile planned on a host without MIG."""
    hosts = VGPU_HOST + "    ssh: {address: 10.0.0.1}\n    mig: [0]\n"
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-3-40c, count: 3}}\n", hosts)
    with pytest.raises(InputError, match=r"vGPU 3 of 3 \(grid_h100-3-40c\) fits on no GPU: GPU 0000:17:00.0 has 1 of 7 "
                                         r"MIG compute slices free \(3g.40gb needs 3; used by vm1\); "
                                         r"GPU 0000:31:00.0 is not in MIG mode;"):
        make_plan(rb, inventory([h100_host()], [vm("vm1")]))


def test_mig_mode_not_in_the_runbook_is_said_to_be_unknown(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-3-40c}}\n")
    plan, _ = make_plan(rb, inventory([h100_host()], [vm("vm1")]))
    assert [n.message for n in plan.notes] == [
        "vGPU grid_h100-3-40c is MIG-backed: it powers on only on a GPU of esx-01 in MIG mode, which gpuvm cannot "
        "read from vCenter (set hosts[0].mig to have it enabled and checked)"]


def test_time_sliced_vgpu_refused_on_a_gpu_in_mig_mode(tmp_path):
    hosts = VGPU_HOST + "    ssh: {address: 10.0.0.1}\n    mig: all\n"
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-40c}}\n", hosts)
    with pytest.raises(InputError, match=r"GPU 0000:17:00.0 is in MIG mode \(time-sliced vGPUs need it off\)"):
        make_plan(rb, inventory([h100_host()], [vm("vm1")]))


@pytest.mark.parametrize("gpus, hosts, version, need", [
    ("{mode: dynamic, count: 1}", PASSTHROUGH_HOST, "vmx-13", "dynamic DirectPath needs hardware version vmx-17 or "
                                                              "later (compatible with ESXi 7.0 and later)"),
    ("{mode: vgpu, profile: grid_h100-40c, count: 2}", VGPU_HOST, "vmx-14", "more than one vGPU needs hardware "
                                                                            "version vmx-15 or later"),
    ("{mode: vgpu, profile: grid_h100-40c}", VGPU_HOST, "vmx-10", "vGPU needs hardware version vmx-11 or later"),
    ("{mode: passthrough, count: 1}", PASSTHROUGH_HOST, "vmx-9", "64-bit MMIO (large GPU BARs) needs hardware version "
                                                                 "vmx-11 or later (compatible with ESXi 6.0 U1"),
])
def test_hardware_version_minimums(tmp_path, gpus, hosts, version, need):
    """Seen: dynamic DirectPath on a vmx-13 VM accepted."""
    rb = runbook(tmp_path, f"- {{name: vm1, host: esx-01, gpus: {gpus}}}\n", hosts)
    host = h100_host() if "vgpu" in gpus else r750xa()
    with pytest.raises(InputError, match=rf"vms\[0\]\.gpus: VM vm1 on host esx-01: {re.escape(need)}.* but the VM is {version}"):
        make_plan(rb, inventory([host], [vm("vm1", hw_version=version)]))
    make_plan(rb, inventory([host], [vm("vm1", hw_version="vmx-19")]))


def test_hardware_version_in_the_runbook_plans_the_upgrade_or_says_it_is_too_old(tmp_path):
    """hardware_version: the version the VM will have counts; below what the devices need, the error
    names that field; without it, the error says which hardware_version would do."""
    gpus = "gpus: {mode: dynamic, count: 1}"
    old = inventory([r750xa()], [vm("vm1", hw_version="vmx-13")])
    with pytest.raises(InputError, match=r"vms\[0\]\.gpus: .* but the VM is vmx-13: set hardware_version: vmx-17"):
        make_plan(runbook(tmp_path, f"- {{name: vm1, host: esx-01, {gpus}}}\n", PASSTHROUGH_HOST), old)
    low = runbook(tmp_path, f"- {{name: vm1, host: esx-01, {gpus}, hardware_version: vmx-15}}\n", PASSTHROUGH_HOST)
    with pytest.raises(InputError, match=r"vms\[0\]\.hardware_version: VM vm1 on host esx-01: dynamic DirectPath needs "
                                         r"hardware version vmx-17 .*; hardware_version vmx-15 is older"):
        make_plan(low, old)
    rb = runbook(tmp_path, f"- {{name: vm1, host: esx-01, {gpus}, hardware_version: vmx-19}}\n", PASSTHROUGH_HOST)
    upgrade = make_plan(rb, old)[0].for_step("vm.version")
    assert [(c.before, c.after) for c in upgrade] == [("vmx-13", "vmx-19")]


@pytest.mark.parametrize("bad", ["19", "vmx-6", "vmx-100", "VMX-19"])
def test_hardware_version_is_checked_when_the_runbook_loads(tmp_path, bad):
    with pytest.raises(InputError, match=r"hardware_version.*is not a VM hardware version \(vmx-7 to vmx-99"):
        runbook(tmp_path, f"- {{name: vm1, host: esx-01, hardware_version: '{bad}'}}\n")


def test_vcpus_must_fit_the_host_threads(tmp_path):
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, cpus: 256}\n")
    with pytest.raises(InputError, match=r"vms\[0\]\.cpus: VM vm1 on host esx-01: 256 vCPUs but the host has 128 "
                                         r"logical CPUs"):
        make_plan(rb, inventory([r750xa(cpu_threads=128)], [vm("vm1")]))


@pytest.mark.parametrize("profiles, fits", [
    (["grid_a100-20c"] * 8, True),  # 2 per 40 GB GPU
    (["grid_a100-20c"] * 9, False),
    (["grid_a100-3-20c"] * 8, True),  # 3g.20gb: 2 per GPU
    (["grid_a100-3-20c"] * 9, False),
    (["grid_a100-4-20c", "grid_a100-3-20c"] * 4, True),  # 4 + 3 slices fill a GPU
    (["grid_a100-20c", "grid_a100-3-20c", "grid_a100-10c", "grid_a100-5c", "grid_a100-8c"], False),  # one kind per GPU
])
def test_vgpu_placement_rules(profiles, fits):
    host = r750xa(gpu=(0x20F1, "GA100 [A100 PCIe 40GB]"))
    rooms = [GpuRoom(d, 40, None) for d in host.gpus]
    results = [place_vgpu(rooms, "vm", vgpu_profile(p)) for p in profiles]
    assert (results[-1] is None) == fits and all(r is None for r in results[:-1])


def test_a_profile_of_unknown_shape_is_left_to_vsphere_and_said_so(tmp_path):
    """An opaque name: gpuvm guesses no size (vCenter's own answer at power-on decides) and the plan says so."""
    host = r750xa(gpu=H100, vgpu_profiles=["nvidia_h100-80c", "vendor_special_type"])
    rb = runbook(tmp_path, "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: vendor_special_type, count: 9}}\n")
    plan, _ = make_plan(rb, inventory([host], [vm("vm1")]))
    assert [n.message for n in plan.notes] == [
        "vGPU vendor_special_type: its name does not say its size, so gpuvm checks no room for it on esx-01; "
        "vSphere refuses it at power-on where no GPU has room"]
