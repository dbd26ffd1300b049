"""Table-driven plans: facts in, changes out, for every vSphere step (no vCenter involved)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuvm.engine import make_plan
from gpuvm.errors import InputError
from gpuvm.plan import Disruption
from gpuvm.runbook.loader import load_runbook
from gpuvm.vsphere.facts import VmPciDevice
from tests.unit.factories import GPU_ADDRESSES, inventory, r750xa, vm

GPU_ADDRESSES_ONLY = [a for a, _ in GPU_ADDRESSES]

HOST = """
hosts:
  - name: esx-01
    passthrough: [{model: A100}, {id: "15b3:101b"}]
    allow_maintenance: true
    allow_reboot: true
"""


def runbook(tmp_path: Path, vms: str, hosts: str = HOST):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(hosts) + "vms:\n" + textwrap.indent(textwrap.dedent(vms), "  "))
    return load_runbook(path)


def changes(plan, step=None):
    return [(c.step, c.target, c.field, c.before, c.after, c.disruption) for c in plan.changes
            if step is None or c.step == step]


ONE_GPU_VM = """
- name: vm1
  host: esx-01
  cpus: 8
  memory_gb: 64
  gpus: {mode: passthrough, count: 1}
"""


def test_fresh_host_enables_passthrough_and_reboots(tmp_path):
    plan, _ = make_plan(runbook(tmp_path, ONE_GPU_VM), inventory([r750xa()], [vm("vm1")]))
    host = changes(plan, "host.passthrough")
    assert len(host) == 6  # 4 GPUs + 2 ConnectX ports
    assert all(c[3] == "off" and c[4] == "active" and c[5] == Disruption.HOST_REBOOT for c in host)
    assert changes(plan, "host.reboot") == [("host.reboot", "esx-01", "reboot", "6 change(s) waiting",
                                             "rebooted (maintenance mode)", Disruption.HOST_REBOOT)]


def test_rebind_capable_host_needs_no_reboot(tmp_path):
    plan, _ = make_plan(runbook(tmp_path, ONE_GPU_VM),
                        inventory([r750xa(rebind_without_reboot=True)], [vm("vm1")]))
    assert all(c.disruption == Disruption.NONE for c in plan.for_step("host.passthrough"))
    assert plan.for_step("host.reboot") == []


def test_enabled_but_pending_device_plans_reboot_only(tmp_path):
    plan, _ = make_plan(runbook(tmp_path, ONE_GPU_VM), inventory([r750xa(enabled=True)], [vm("vm1")]))
    host = changes(plan, "host.passthrough")
    assert {c[3] for c in host} == {"enabled (reboot pending)"}
    assert len(plan.for_step("host.reboot")) == 1


def test_vm_hardware_and_advanced_for_one_gpu(tmp_path):
    plan, _ = make_plan(runbook(tmp_path, ONE_GPU_VM), inventory([r750xa(enabled=True, active=True)], [vm("vm1")]))
    assert changes(plan, "vm.hardware") == [
        ("vm.hardware", "vm1", "firmware", "bios", "efi", Disruption.NONE),
        ("vm.hardware", "vm1", "cpus", 4, 8, Disruption.NONE),
        ("vm.hardware", "vm1", "memory_mb", 8192, 65536, Disruption.NONE),
        ("vm.hardware", "vm1", "memoryReservationLockedToMax", False, True, Disruption.NONE),
        ("vm.hardware", "vm1", "device", None, "0000:17:00.0 GA100 [A100 PCIe 80GB]", Disruption.NONE),
    ]
    advanced = {c.field: c.after for c in plan.for_step("vm.advanced")}
    assert advanced == {"pciPassthru.allowP2P": "true", "pciPassthru.RelaxACSforP2P": "true",
                        "pciPassthru.use64bitMMIO": "TRUE", "pciPassthru.64bitMMIOSizeGB": "256"}
    assert changes(plan, "vm.power") == [("vm.power", "vm1", "power", "poweredOff", "poweredOn", Disruption.NONE)]


def test_already_configured_vm_plans_nothing(tmp_path):
    configured = vm("vm1", cpus=8, memory_mb=65536, firmware="efi", reservation_locked=True, power_state="poweredOn",
                    pci=[VmPciDevice(key=13000, kind="classic", address="0000:17:00.0", vendor_id=0x10DE,
                                     device_id=0x20B5)],
                    extra_config={"pciPassthru.allowP2P": "TRUE", "pciPassthru.RelaxACSforP2P": "true",
                                  "pciPassthru.use64bitMMIO": "TRUE", "pciPassthru.64bitMMIOSizeGB": "256"})
    plan, _ = make_plan(runbook(tmp_path, ONE_GPU_VM), inventory([r750xa(enabled=True, active=True)], [configured]))
    assert plan.empty, changes(plan)


def test_running_vm_changes_need_power_off_and_power_on_again(tmp_path):
    running = vm("vm1", power_state="poweredOn")
    plan, _ = make_plan(runbook(tmp_path, ONE_GPU_VM), inventory([r750xa(enabled=True, active=True)], [running]))
    device = [c for c in plan.for_step("vm.hardware") if c.field == "device"][0]
    assert device.disruption == Disruption.VM_POWER_OFF
    reservation = [c for c in plan.for_step("vm.hardware") if c.field == "memoryReservationLockedToMax"][0]
    assert reservation.disruption == Disruption.NONE
    assert changes(plan, "vm.power") == [("vm.power", "vm1", "power", "poweredOff", "poweredOn", Disruption.NONE)]


def test_extra_devices_are_removed_and_present_ones_kept(tmp_path):
    current = vm("vm1", pci=[
        VmPciDevice(key=1, kind="classic", address="0000:17:00.0", vendor_id=0x10DE, device_id=0x20B5),
        VmPciDevice(key=2, kind="classic", address="0000:31:00.0", vendor_id=0x10DE, device_id=0x20B5),
    ])
    plan, _ = make_plan(runbook(tmp_path, ONE_GPU_VM), inventory([r750xa(enabled=True, active=True)], [current]))
    devices = [c for c in plan.for_step("vm.hardware") if c.field == "device"]
    assert [(c.before, c.after, c.action.key) for c in devices] == [("0000:31:00.0", None, 2)]


def test_gpus_are_shared_out_without_overlap_and_numa_first(tmp_path):
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}, numa_node: 1}
    - {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 2}}
    """
    plan, desired = make_plan(runbook(tmp_path, vms), inventory([r750xa(enabled=True, active=True)],
                                                               [vm("vm1"), vm("vm2")]))
    assert [d.address for d in desired.vms["vm1"].devices] == ["0000:b1:00.0", "0000:ca:00.0"]
    assert [d.address for d in desired.vms["vm2"].devices] == ["0000:17:00.0", "0000:31:00.0"]
    assert desired.vms["vm1"].extra_config["numa.nodeAffinity"] == "1"
    assert desired.vms["vm1"].extra_config["pciPassthru.64bitMMIOSizeGB"] == "512"


def test_mmio_auto_for_four_a100_80gb_and_nvlink_warning(tmp_path):
    vms = "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 4}}\n"
    plan, desired = make_plan(runbook(tmp_path, vms), inventory([r750xa(enabled=True, active=True)], [vm("vm1")]))
    assert desired.vms["vm1"].extra_config["pciPassthru.64bitMMIOSizeGB"] == "1024"
    assert any("NVLink bridges join pairs" in n.message for n in plan.notes)



@pytest.mark.parametrize("gpu, memory_mb, mmio", [
    ((0x26B9, "AD102GL [L40S]"), {}, "512"),  # 4 x 48 GB: 192 → 2 x 192 = 384 → 512, from the PCI id
    ((0x2321, "GH100 [H100L 94GB]"), {}, "1024"),  # 4 x 94 GB = 376 → 752 → 1024
    ((0x2BB5, "GB202GL [RTX PRO 6000 Blackwell Server Edition]"), {}, "1024"),  # 4 x 96 GB
    ((0x2FFF, "a GPU pci.ids does not know yet"), {a: 96 * 1024 for a in GPU_ADDRESSES_ONLY}, "1024"),  # vCenter's size
])
def test_mmio_of_newer_gpus_from_their_id_or_what_vcenter_reports(tmp_path, gpu, memory_mb, mmio):
    """Seen: 4 passed-through L40S planned with a 1 GB MMIO window (their id unknown to gpuvm), which
    ESXi refuses at power-on."""
    vms = "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 4}}\n"
    host = r750xa(enabled=True, active=True, gpu=gpu, gpu_memory_mb=memory_mb)
    hosts = f"hosts:\n  - name: esx-01\n    passthrough: [{{id: '10de:{gpu[0]:04x}'}}]\n"
    _, desired = make_plan(runbook(tmp_path, vms, hosts), inventory([host], [vm("vm1")]))
    assert desired.vms["vm1"].extra_config["pciPassthru.64bitMMIOSizeGB"] == mmio

def test_too_many_gpus_names_the_field(tmp_path):
    vms = """
    - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 3}}
    - {name: vm2, host: esx-01, gpus: {mode: passthrough, count: 2}}
    """
    with pytest.raises(InputError, match=r"rb.yaml:\d+: vms\[1\]\.gpus\.count: needs 2 GPU\(s\) but host esx-01 has 4"):
        make_plan(runbook(tmp_path, vms), inventory([r750xa()], [vm("vm1"), vm("vm2")]))


def test_mmio_too_small_is_refused(tmp_path):
    vms = "- {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}, mmio: 128}\n"
    with pytest.raises(InputError, match=r"vms\[0\]\.mmio: 64-bit MMIO of 128 GB is too small .* 'auto' → 512"):
        make_plan(runbook(tmp_path, vms), inventory([r750xa()], [vm("vm1")]))


# A vGPU host passes through its ConnectX ports only: passthrough GPUs serve no vGPU.
VGPU_HOST = HOST.replace("{model: A100}, ", "")


def test_vgpu_profile_must_be_offered_and_host_shared_direct(tmp_path):
    hosts = VGPU_HOST.replace("allow_reboot: true", "allow_reboot: true\n    graphics: shared_direct")
    bad = "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_a100-99c}}\n"
    with pytest.raises(InputError, match=r"vms\[0\]\.gpus\.profile: vGPU profile 'grid_a100-99c' is not offered"):
        make_plan(runbook(tmp_path, bad, hosts), inventory([r750xa()], [vm("vm1")]))
    good = "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_a100d-3-40c, count: 2}}\n"
    with pytest.raises(InputError, match=r"graphics: shared_direct"):
        make_plan(runbook(tmp_path, good, VGPU_HOST), inventory([r750xa()], [vm("vm1")]))
    plan, desired = make_plan(runbook(tmp_path, good, hosts), inventory([r750xa()], [vm("vm1")]))
    graphics = changes(plan, "host.graphics")
    assert graphics[0] == ("host.graphics", "esx-01", "hostDefaultGraphicsType", "shared", "sharedDirect",
                           Disruption.HOST_REBOOT)
    assert [c.resource for c in plan.for_step("host.graphics")[1:]] == [  # every GPU not passed through
        f"GPU {gpu.id}" for gpu in r750xa().gpus]
    assert desired.vms["vm1"].extra_config == {}  # MIG-backed vGPUs have no NVLink P2P: unified memory stays on
    assert [c.after for c in plan.for_step("vm.hardware") if c.field == "device"] == ["vGPU grid_a100d-3-40c"] * 2


def test_dynamic_directpath_by_id(tmp_path):
    vms = "- {name: vm1, host: esx-01, gpus: {mode: dynamic, count: 2, id: '10de:20b5'}}\n"
    plan, desired = make_plan(runbook(tmp_path, vms), inventory([r750xa(enabled=True, active=True)], [vm("vm1")]))
    picks = "dynamic 10de:20b5 (vSphere picks from 0000:17:00.0, 0000:31:00.0, 0000:b1:00.0, 0000:ca:00.0)"
    assert [d.describe() for d in desired.vms["vm1"].devices] == [picks] * 2
    assert desired.vms["vm1"].extra_config["pciPassthru.64bitMMIOSizeGB"] == "512"


def test_memory_must_fit_the_host(tmp_path):
    vms = "- {name: vm1, host: esx-01, memory_gb: 2048}\n"
    with pytest.raises(InputError, match=r"vms\[0\]\.memory_gb: reserving 2048 GB does not fit"):
        make_plan(runbook(tmp_path, vms), inventory([r750xa()], [vm("vm1")]))


def test_unknown_vm_and_wrong_host(tmp_path):
    vms = "- {name: ghost, host: esx-01}\n"
    with pytest.raises(InputError, match=r"vms\[0\]\.name: VM 'ghost' not found in vCenter"):
        make_plan(runbook(tmp_path, vms), inventory([r750xa()], []))
    with pytest.raises(InputError, match=r"runs on host esx-02, not esx-01"):
        make_plan(runbook(tmp_path, "- {name: vm1, host: esx-01}\n"),
                  inventory([r750xa(), r750xa("esx-02")], [vm("vm1", host="esx-02")]))


def test_owned_extra_config_keys_are_removed_when_no_longer_wanted(tmp_path):
    current = vm("vm1", firmware="efi", extra_config={"pciPassthru.use64bitMMIO": "TRUE", "other.key": "x"})
    plan, _ = make_plan(runbook(tmp_path, "- {name: vm1, host: esx-01, power: off}\n"),
                        inventory([r750xa(enabled=True, active=True)], [current]))
    assert changes(plan, "vm.advanced") == [("vm.advanced", "vm1", "pciPassthru.use64bitMMIO", "TRUE", None,
                                             Disruption.NONE)]
