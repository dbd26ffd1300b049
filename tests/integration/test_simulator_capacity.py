"""gpusim refuses what ESXi refuses about capacity: vGPU room per GPU, passthrough/vGPU exclusivity,
MIG mode, the dynamic DirectPath pool, VM hardware versions and vCPUs (issue 9, item 5)."""

from __future__ import annotations

import pytest
from pyVmomi import vim, vmodl

from tests.integration.test_simulator import (  # noqa: F401 (fixtures)
    GPU_IDS, fails, fault_text, gpu_vm_spec, gpusim_binary, make_env, ok, passthru, reboot)

pytestmark = pytest.mark.integration
PCI = vim.vm.device.VirtualPCIPassthrough


def vgpu_spec(*profiles: str, reserve: bool = True) -> vim.vm.ConfigSpec:
    devices = [vim.vm.device.VirtualDeviceSpec(operation="add", device=PCI(key=-1 - n, backing=PCI.VmiopBackingInfo(vgpu=p)))
               for n, p in enumerate(profiles)]
    return vim.vm.ConfigSpec(memoryReservationLockedToMax=reserve, deviceChange=devices)


def dynamic_spec(count: int, device_id: int = 0x2331) -> vim.vm.ConfigSpec:
    allowed = [PCI.AllowedDevice(vendorId=0x10DE, deviceId=device_id)]
    devices = [vim.vm.device.VirtualDeviceSpec(operation="add", device=PCI(
        key=-1 - n, backing=PCI.DynamicBackingInfo(allowedDevice=allowed, customLabel="gpu"))) for n in range(count)]
    return vim.vm.ConfigSpec(firmware="efi", memoryReservationLockedToMax=True, deviceChange=devices, extraConfig=[
        vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value="TRUE"),
        vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="1024")])


def shared_direct(host) -> None:
    """Shared Direct, made active by a reboot."""
    host.configManager.graphicsManager.UpdateGraphicsConfig(vim.host.GraphicsConfig(
        hostDefaultGraphicsType="sharedDirect", sharedPassthruAssignmentPolicy="performance"))
    reboot(host)


def passthrough_now(host, ids) -> None:
    host.configManager.pciPassthruSystem.UpdatePassthruConfig(
        [vim.host.PciPassthruConfig(id=i, passthruEnabled=True) for i in ids])


def test_vgpus_beyond_gpu_memory_are_refused_at_power_on(make_env):
    e = make_env(hosts=1, vms_per_host=2, gpu="h100-80")
    host, vm1, vm2 = e.host("esx-01"), e.vm("esx-01-vm1"), e.vm("esx-01-vm2")
    shared_direct(host)
    ok(vm1.ReconfigVM_Task(vgpu_spec(*["grid_h100-80c"] * 5)))
    text = fault_text(fails(vm1.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    assert ('Could not initialize plugin for vGPU "grid_h100-80c": insufficient resources: no graphics device on '
            "host esx-01 has room for it (17:00.0 is full (esx-01-vm1); 31:00.0 is full") in text
    dev = [d for d in vm1.config.hardware.device if isinstance(d, PCI)][-1]
    ok(vm1.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[vim.vm.device.VirtualDeviceSpec(operation="remove", device=dev)])))
    ok(vm1.PowerOnVM_Task())  # four fit, one per GPU

    ok(vm2.ReconfigVM_Task(vgpu_spec("grid_h100-40c")))
    assert "17:00.0 runs 80 GB vGPUs (esx-01-vm1)" in fault_text(fails(vm2.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    ok(vm1.PowerOffVM_Task())
    ok(vm2.PowerOnVM_Task())


def test_passthrough_gpus_serve_no_vgpu(make_env):
    """Seen: vGPUs planned on GPUs that were passthrough and held by another running VM."""
    e = make_env(hosts=1, vms_per_host=2, gpu="h100-80", rebind=True)
    host, vm1, vm2 = e.host("esx-01"), e.vm("esx-01-vm1"), e.vm("esx-01-vm2")
    shared_direct(host)
    passthrough_now(host, GPU_IDS[:2])
    assert all(passthru(host, i).passthruActive for i in GPU_IDS[:2])
    ok(vm2.ReconfigVM_Task(gpu_vm_spec(host, GPU_IDS[0])))
    ok(vm2.PowerOnVM_Task())
    ok(vm1.ReconfigVM_Task(vgpu_spec(*["grid_h100-80c"] * 3)))
    text = fault_text(fails(vm1.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    assert "(17:00.0 is passthrough (DirectPath); 31:00.0 is passthrough (DirectPath); b1:00.0 is full" in text


def test_mig_backed_vgpu_needs_mig_mode(make_env):
    """Seen: a MIG-backed profile planned on a host without MIG."""
    e = make_env(hosts=1, vms_per_host=2, gpu="a100-40")
    host, vm1 = e.host("esx-01"), e.vm("esx-01-vm1")
    shared_direct(host)
    ok(vm1.ReconfigVM_Task(vgpu_spec("grid_a100-3-20c")))
    text = fault_text(fails(vm1.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    assert "(17:00.0 is not in MIG mode; 31:00.0 is not in MIG mode; b1:00.0" in text


def test_mig_slices_and_modes(make_env):
    e = make_env(hosts=1, vms_per_host=2, gpu="a100-40", mig={"esx-01": "0"})
    host, vm1, vm2 = e.host("esx-01"), e.vm("esx-01-vm1"), e.vm("esx-01-vm2")
    shared_direct(host)
    ok(vm1.ReconfigVM_Task(vgpu_spec(*["grid_a100-3-20c"] * 3)))
    text = fault_text(fails(vm1.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    assert "17:00.0 has 1 of 7 MIG compute slices free (esx-01-vm1, esx-01-vm1); 31:00.0 is not in MIG mode" in text
    ok(vm2.ReconfigVM_Task(vgpu_spec("grid_a100-20c", "grid_a100-20c", "grid_a100-20c")))
    ok(vm2.PowerOnVM_Task())  # time-sliced: not on GPU 0 (MIG), two on 31:00.0, one on b1:00.0


def test_dynamic_pool_is_shared_with_classic_directpath(make_env):
    """Seen: 2 classic + 4 dynamic GPUs on a 4-GPU host; the power-on failed after the reconfigure."""
    e = make_env(hosts=1, vms_per_host=2, gpu="h100-80", rebind=True)
    host, vm1, vm2 = e.host("esx-01"), e.vm("esx-01-vm1"), e.vm("esx-01-vm2")
    passthrough_now(host, GPU_IDS)
    spec = gpu_vm_spec(host, GPU_IDS[0], mmio_gb=512)
    spec.deviceChange.append(gpu_vm_spec(host, GPU_IDS[1]).deviceChange[0])
    ok(vm1.ReconfigVM_Task(spec))
    ok(vm1.PowerOnVM_Task())
    ok(vm2.ReconfigVM_Task(dynamic_spec(4)))
    text = fault_text(fails(vm2.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    assert "No available passthrough device on host esx-01 matches dynamic DirectPath device" in text


def test_hardware_version_minimums_on_reconfigure(make_env):
    """Seen: dynamic DirectPath accepted on a vmx-13 VM."""
    e = make_env(hosts=1, vms_per_host=1, gpu="h100-80", vm_version="vmx-13")
    vm = e.vm("esx-01-vm1")
    assert vm.config.version == "vmx-13"
    err = fails(vm.ReconfigVM_Task(dynamic_spec(1)), vim.fault.DeviceUnsupportedForVmVersion)
    assert (err.currentVersion, err.expectedVersion, err.deviceIndex) == ("vmx-13", "vmx-17", 0)
    assert ("The device or operation specified at index '0' is not supported for the current virtual machine "
            "version 'vmx-13'. A minimum version of 'vmx-17' is required") in fault_text(err)
    assert not [d for d in vm.config.hardware.device if isinstance(d, PCI)]
    err = fails(vm.ReconfigVM_Task(vgpu_spec("grid_h100-40c", "grid_h100-40c")), vim.fault.DeviceUnsupportedForVmVersion)
    assert err.expectedVersion == "vmx-15"
    ok(vm.ReconfigVM_Task(vgpu_spec("grid_h100-40c")))  # one vGPU: vmx-11 is enough


def test_default_vm_version_and_cpu_limit(make_env):
    e = make_env(hosts=1, vms_per_host=1)
    host, vm = e.host("esx-01"), e.vm("esx-01-vm1")
    assert vm.config.version == "vmx-19" and host.hardware.cpuInfo.numCpuThreads == 128
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(numCPUs=256)))
    text = fault_text(fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    assert "Virtual machine has 256 virtual CPUs, but the host only supports 128." in text


def test_upgrade_vm_only_while_off_and_only_upwards(make_env):
    """UpgradeVM_Task as vSphere runs it: refused on a running VM and to the same or an older version."""
    e = make_env(hosts=1, vms_per_host=1, vm_version="vmx-13", vm_power="on")
    vm = e.vm("esx-01-vm1")
    err = fails(vm.UpgradeVM_Task(version="vmx-17"), vim.fault.InvalidPowerState)
    assert "The attempted operation cannot be performed in the current state (poweredOn)." in fault_text(err)
    ok(vm.PowerOffVM_Task())
    ok(vm.UpgradeVM_Task(version="vmx-17"))
    assert vm.config.version == "vmx-17"
    fails(vm.UpgradeVM_Task(version="vmx-15"), vim.fault.AlreadyUpgraded)
    fails(vm.UpgradeVM_Task(version="vmx-21"), vmodl.fault.InvalidArgument)
    ok(vm.ReconfigVM_Task(dynamic_spec(1)))  # what vmx-13 refused
