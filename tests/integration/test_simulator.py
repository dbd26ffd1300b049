"""Integration tests of gpusim itself (simulator/gpusim), through pyvmomi."""

from __future__ import annotations

import re
import ssl
import time

import pytest

import gpusim as gsim

pytestmark = pytest.mark.integration

from pyVim.connect import Disconnect, SmartConnect  # noqa: E402
from pyVmomi import vim, vmodl  # noqa: E402

GPU_IDS = ["0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"]
CX_IDS = ["0000:4b:00.0", "0000:4b:00.1"]


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def gpusim_binary():
    """The gpusim binary, built once if missing (fails, never skips, without Go/govmomi)."""
    path = gsim.binary_path()
    if not path.is_file():
        gsim.build(path)
    return path


def connect(sim: gsim.Simulator, user: str | None = None, pwd: str | None = None):
    kwargs = {}
    if sim.tls:
        kwargs["sslContext"] = ssl.create_default_context(cafile=str(sim.cert_file))
    else:
        kwargs["protocol"] = "http"
    return SmartConnect(
        host=sim.host,
        port=sim.port,
        user=user or sim.username,
        pwd=pwd if pwd is not None else sim.password,
        **kwargs,
    )


class Env:
    def __init__(self, sim: gsim.Simulator):
        self.sim = sim
        self.si = connect(sim)
        self.content = self.si.RetrieveContent()

    def objects(self, kind):
        view = self.content.viewManager.CreateContainerView(self.content.rootFolder, [kind], True)
        try:
            return list(view.view)
        finally:
            view.Destroy()

    def host(self, name):
        return next(h for h in self.objects(vim.HostSystem) if h.name == name)

    def vm(self, name):
        return next(v for v in self.objects(vim.VirtualMachine) if v.name == name)

    def close(self):
        Disconnect(self.si)


@pytest.fixture
def make_env(gpusim_binary):
    started = []

    def make(**kwargs):
        sim = gsim.Simulator(binary=gpusim_binary, **kwargs).start()
        env = Env(sim)
        started.append(env)
        return env

    yield make
    for env in started:
        try:
            env.close()
        finally:
            env.sim.stop()


@pytest.fixture(scope="module")
def env(gpusim_binary):
    sim = gsim.Simulator(binary=gpusim_binary).start()
    e = Env(sim)
    yield e
    e.close()
    sim.stop()


# ---------------------------------------------------------------- helpers
def wait(task, timeout=30.0):
    """Wait for a task; return its info (state success or error)."""
    deadline = time.monotonic() + timeout
    while True:
        info = task.info
        if info.state in (vim.TaskInfo.State.success, vim.TaskInfo.State.error):
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {task} still {info.state}")
        time.sleep(0.05)


def ok(task):
    info = wait(task)
    assert info.state == vim.TaskInfo.State.success, info.error
    return info


def fails(task, fault_type):
    info = wait(task)
    assert info.state == vim.TaskInfo.State.error
    assert isinstance(info.error, fault_type), info.error
    return info.error


def fault_text(err) -> str:
    parts = [getattr(err, "msg", "") or "", getattr(err, "reason", "") or ""]
    parts += [m.message for m in (getattr(err, "faultMessage", None) or [])]
    return " | ".join(p for p in parts if p)


def pci_spec(host, dev_id, vendor=0x10DE, device=0x20B5):
    backing = vim.vm.device.VirtualPCIPassthrough.DeviceBackingInfo(
        id=dev_id,
        deviceId=format(device, "x"),
        vendorId=vendor,
        systemId=host.hardware.systemInfo.uuid,
        deviceName="GA100 [A100 PCIe 80GB]",
    )
    dev = vim.vm.device.VirtualPCIPassthrough(key=-100, backing=backing)
    return vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.add, device=dev)


def gpu_vm_spec(host, dev_id, mmio_gb=256, reservation=True, firmware="efi", use64="TRUE"):
    extra = [vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value=use64)]
    if mmio_gb is not None:
        extra.append(vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value=str(mmio_gb)))
    return vim.vm.ConfigSpec(
        firmware=firmware,
        memoryReservationLockedToMax=reservation,
        extraConfig=extra,
        deviceChange=[pci_spec(host, dev_id)],
    )


def passthru(host, dev_id):
    return next(p for p in host.config.pciPassthruInfo if p.id == dev_id)


def enable_and_reboot(env, host, ids):
    host.configManager.pciPassthruSystem.UpdatePassthruConfig(
        [vim.host.PciPassthruConfig(id=i, passthruEnabled=True) for i in ids]
    )
    ok(host.EnterMaintenanceMode_Task(timeout=0))
    ok(host.RebootHost_Task(force=False))
    ok(host.ExitMaintenanceMode_Task(timeout=0))


# ---------------------------------------------------------------- inventory
def test_url_line_and_cert(env):
    assert re.fullmatch(r"https://127\.0\.0\.1:\d+/sdk", env.sim.url)
    assert env.sim.cert_file.read_text().startswith("-----BEGIN CERTIFICATE-----")


def test_hosts_and_vms(env):
    hosts = sorted(h.name for h in env.objects(vim.HostSystem))
    assert hosts == ["esx-01", "esx-02"]
    vms = {v.name: v for v in env.objects(vim.VirtualMachine)}
    assert sorted(vms) == ["esx-01-vm1", "esx-01-vm2", "esx-02-vm1", "esx-02-vm2"]
    for name, vm in vms.items():
        assert vm.runtime.host.name == name.split("-vm")[0]
        cfg = vm.config
        assert cfg.hardware.numCPU == 4
        assert cfg.hardware.memoryMB == 8192
        assert cfg.firmware == "bios"
        assert not cfg.memoryReservationLockedToMax
        assert not [d for d in cfg.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough)]
        assert not [o for o in cfg.extraConfig if o.key.lower().startswith("pcipassthru")]
        assert vm.runtime.powerState == "poweredOff"


def test_pci_devices(env):
    uuids = set()
    for host in env.objects(vim.HostSystem):
        hw = host.hardware
        uuids.add(hw.systemInfo.uuid)
        assert hw.memorySize == 1099511627776
        devs = {d.id: d for d in hw.pciDevice}
        gpus = [d for d in hw.pciDevice if d.vendorId & 0xFFFF == 0x10DE]
        assert sorted(d.id for d in gpus) == GPU_IDS
        for d in gpus:
            assert d.deviceId & 0xFFFF == 0x20B5
            assert d.deviceName == "GA100 [A100 PCIe 80GB]"
            assert d.vendorName == "NVIDIA Corporation"
            assert d.classId == 0x0302
        for i in CX_IDS:
            assert devs[i].vendorId == 0x15B3 and devs[i].deviceId == 0x101B and devs[i].classId == 0x0207
        intel = [d for d in hw.pciDevice if d.vendorId == -32634]
        assert intel, "Intel devices must show the signed vendorId -32634"
        nodes = hw.numaInfo.numaNode
        assert len(nodes) == 2 and hw.numaInfo.numNodes == 2
        assert {"0000:17:00.0", "0000:31:00.0", *CX_IDS} <= set(nodes[0].pciId)
        assert {"0000:b1:00.0", "0000:ca:00.0"} <= set(nodes[1].pciId)
        assert "grid_a100d-40c" in host.config.sharedPassthruGpuTypes
        assert "grid_a100d-3-40c" in host.config.sharedPassthruGpuTypes
    assert len(uuids) == 2


def test_passthru_info_initial(env):
    host = env.host("esx-01")
    infos = {p.id: p for p in host.config.pciPassthruInfo}
    assert set(infos) == {d.id for d in host.hardware.pciDevice}
    for i, p in infos.items():
        assert p.passthruCapable == (i in GPU_IDS + CX_IDS)
        assert not p.passthruEnabled and not p.passthruActive
        assert p.dependentDevice == i
    assert host.capability.deviceRebindWithoutRebootSupported is False
    gc = host.config.graphicsConfig
    assert gc.hostDefaultGraphicsType == "shared" and gc.sharedPassthruAssignmentPolicy == "performance"
    assert len(host.config.graphicsInfo) == 4


# ---------------------------------------------------------------- host passthrough flow
def test_passthru_enable_reboot_flow(env):
    host = env.host("esx-02")
    pts = host.configManager.pciPassthruSystem
    assert isinstance(pts, vim.host.PciPassthruSystem)
    pts.UpdatePassthruConfig([vim.host.PciPassthruConfig(id="0000:17:00.0", passthruEnabled=True)])
    p = passthru(host, "0000:17:00.0")
    assert p.passthruEnabled and not p.passthruActive
    # the manager's own property agrees
    assert next(x for x in pts.pciPassthruInfo if x.id == "0000:17:00.0").passthruEnabled

    with pytest.raises(vmodl.fault.InvalidArgument):
        pts.UpdatePassthruConfig([vim.host.PciPassthruConfig(id="0000:99:00.0", passthruEnabled=True)])
    with pytest.raises(vim.fault.HostConfigFault) as exc:
        pts.UpdatePassthruConfig([vim.host.PciPassthruConfig(id="0000:00:17.0", passthruEnabled=True)])
    assert "not capable of passthrough" in exc.value.msg
    pts.Refresh()

    err = fails(host.RebootHost_Task(force=False), vim.fault.InvalidState)
    assert "host must be in maintenance mode" in fault_text(err)
    assert not passthru(host, "0000:17:00.0").passthruActive

    boot = host.runtime.bootTime
    ok(host.EnterMaintenanceMode_Task(timeout=0))
    assert host.runtime.inMaintenanceMode
    ok(host.RebootHost_Task(force=False))
    p = passthru(host, "0000:17:00.0")
    assert p.passthruEnabled and p.passthruActive
    assert not passthru(host, "0000:31:00.0").passthruActive
    assert host.runtime.bootTime >= boot
    ok(host.ExitMaintenanceMode_Task(timeout=0))
    assert not host.runtime.inMaintenanceMode


def test_graphics_update(env):
    host = env.host("esx-01")
    gm = host.configManager.graphicsManager
    cfg = vim.host.GraphicsConfig(
        hostDefaultGraphicsType="sharedDirect",
        sharedPassthruAssignmentPolicy="performance",
        deviceType=[vim.host.GraphicsConfig.DeviceType(deviceId="0000:ca:00.0", graphicsType="sharedDirect")],
    )
    gm.UpdateGraphicsConfig(cfg)
    gm.RefreshGraphicsManager()
    assert host.config.graphicsConfig.hostDefaultGraphicsType == "sharedDirect"
    assert host.config.graphicsConfig.deviceType[0].deviceId == "0000:ca:00.0"
    assert gm.graphicsConfig.hostDefaultGraphicsType == "sharedDirect"
    running = lambda: {g.pciId: g.graphicsType for g in host.config.graphicsInfo}  # noqa: E731
    assert running()["0000:ca:00.0"] == "shared"  # what the GPU runs changes at the reboot
    reboot(host)
    assert running()["0000:ca:00.0"] == "sharedDirect" and running()["0000:17:00.0"] == "sharedDirect"


def reboot(host) -> None:
    """Maintenance mode, reboot, back: what activates passthrough and graphics changes."""
    ok(host.EnterMaintenanceMode_Task(timeout=0))
    ok(host.RebootHost_Task(force=False))
    ok(host.ExitMaintenanceMode_Task(timeout=0))


def test_enter_maintenance_blocked_by_a_running_vm_times_out(make_env):
    """As on ESXi without DRS: the task waits for the VM (see test_maintenance_entry.py), here until its timeout."""
    e = make_env(hosts=1, vms_per_host=1, vm_power="on")
    host = e.host("esx-01")
    assert e.vm("esx-01-vm1").runtime.powerState == "poweredOn"
    fails(host.EnterMaintenanceMode_Task(timeout=1), vim.fault.Timedout)
    assert not host.runtime.inMaintenanceMode
    # and a passthrough device cannot be added while powered on
    err = fails(e.vm("esx-01-vm1").ReconfigVM_Task(gpu_vm_spec(host, "0000:17:00.0")), vim.fault.InvalidPowerState)
    assert err.requestedState == "poweredOff" and err.existingState == "poweredOn"
    assert not [d for d in e.vm("esx-01-vm1").config.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough)]


# ---------------------------------------------------------------- VM reconfigure and power-on rules
def test_extra_config_replace_and_remove(env):
    vm = env.vm("esx-02-vm2")
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key="pciPassthru.allowP2P", value="true")])))
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key="pciPassthru.allowP2P", value="TRUE")])))
    keys = [(o.key, o.value) for o in vm.config.extraConfig if o.key.startswith("pciPassthru")]
    assert keys == [("pciPassthru.allowP2P", "TRUE")]
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key="pciPassthru.allowP2P", value="")])))
    assert not [o for o in vm.config.extraConfig if o.key.startswith("pciPassthru")]


def test_power_on_rules_and_success(env):
    host = env.host("esx-01")
    vm = env.vm("esx-01-vm1")
    ok(vm.ReconfigVM_Task(gpu_vm_spec(host, "0000:17:00.0", mmio_gb=64, reservation=False)))
    cfg = vm.config
    devs = [d for d in cfg.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough)]
    assert len(devs) == 1 and devs[0].backing.id == "0000:17:00.0"
    assert cfg.firmware == "efi"
    extra = {o.key: o.value for o in cfg.extraConfig}
    assert extra["pciPassthru.use64bitMMIO"] == "TRUE" and extra["pciPassthru.64bitMMIOSizeGB"] == "64"

    err = fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault)
    assert "Invalid memory setting: memory reservation (sched.mem.min) should be equal to memsize(8192)." in fault_text(err)

    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(memoryReservationLockedToMax=True)))
    assert vm.config.memoryReservationLockedToMax is True
    err = fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault)
    assert "17:00.0 is not a passthrough device" in fault_text(err)

    enable_and_reboot(env, host, ["0000:17:00.0", "0000:31:00.0"])
    err = fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault)
    text = fault_text(err)
    assert "total number of pages needed (33554432) exceeds limit (16777216)" in text

    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(firmware="bios")))
    assert "EFI" in fault_text(fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(firmware="efi", extraConfig=[
        vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value="FALSE"),
    ])))
    assert "use64bitMMIO" in fault_text(fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=[
        vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value="true"),
        vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="256"),
    ])))
    ok(vm.PowerOnVM_Task())
    assert vm.runtime.powerState == "poweredOn"

    # the same device cannot be used by a second powered-on VM
    vm2 = env.vm("esx-01-vm2")
    ok(vm2.ReconfigVM_Task(gpu_vm_spec(host, "0000:17:00.0")))
    assert "already in use" in fault_text(fails(vm2.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))

    # powered on: device removal allowed by the stock rules, adding refused
    fails(vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[pci_spec(host, "0000:31:00.0")])), vim.fault.InvalidPowerState)
    ok(vm.PowerOffVM_Task())
    ok(vm2.PowerOnVM_Task())
    ok(vm2.PowerOffVM_Task())

    # removing the device works
    dev = next(d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough))
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[
        vim.vm.device.VirtualDeviceSpec(operation="remove", device=dev)])))
    assert not [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough)]


def test_vgpu_and_dynamic_directpath(make_env):
    e = make_env(hosts=1, vms_per_host=2, gpu="a100-40", rebind=True)
    host = e.host("esx-01")
    assert host.capability.deviceRebindWithoutRebootSupported is True
    assert all(d.deviceId == 0x20F1 for d in host.hardware.pciDevice if d.vendorId == 0x10DE)
    assert "grid_a100-3-20c" in host.config.sharedPassthruGpuTypes

    vm = e.vm("esx-01-vm1")
    vgpu = vim.vm.device.VirtualPCIPassthrough(
        key=-1, backing=vim.vm.device.VirtualPCIPassthrough.VmiopBackingInfo(vgpu="grid_a100-20c"))
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(memoryReservationLockedToMax=True, deviceChange=[
        vim.vm.device.VirtualDeviceSpec(operation="add", device=vgpu)])))
    assert "Shared Direct" in fault_text(fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    host.configManager.graphicsManager.UpdateGraphicsConfig(vim.host.GraphicsConfig(
        hostDefaultGraphicsType="sharedDirect", sharedPassthruAssignmentPolicy="performance"))
    assert "takes effect after the host reboots" in fault_text(fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    reboot(host)
    ok(vm.PowerOnVM_Task())
    ok(vm.PowerOffVM_Task())

    # dynamic DirectPath: rebind makes passthrough active at once
    host.configManager.pciPassthruSystem.UpdatePassthruConfig(
        [vim.host.PciPassthruConfig(id="0000:b1:00.0", passthruEnabled=True)])
    assert passthru(host, "0000:b1:00.0").passthruActive
    vm2 = e.vm("esx-01-vm2")
    dyn = vim.vm.device.VirtualPCIPassthrough(key=-1, backing=vim.vm.device.VirtualPCIPassthrough.DynamicBackingInfo(
        allowedDevice=[vim.vm.device.VirtualPCIPassthrough.AllowedDevice(vendorId=0x10DE, deviceId=0x20F1)],
        customLabel="a100"))
    ok(vm2.ReconfigVM_Task(vim.vm.ConfigSpec(
        firmware="efi", memoryReservationLockedToMax=True, deviceChange=[
            vim.vm.device.VirtualDeviceSpec(operation="add", device=dyn)],
        extraConfig=[vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value="TRUE"),
                     vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="32")])))
    # one A100-40: BAR1 64 GB
    assert "exceeds limit" in fault_text(fails(vm2.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    ok(vm2.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=[
        vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="64")])))
    ok(vm2.PowerOnVM_Task())
    dev = next(d for d in vm2.config.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough))
    assert dev.backing.assignedId == "0000:b1:00.0"


# ---------------------------------------------------------------- faults, latency, login
def test_fail_reconfigure_once_then_succeeds(make_env):
    e = make_env(hosts=1, vms_per_host=1, faults=["fail-reconfigure=esx-01-vm1"])
    vm = e.vm("esx-01-vm1")
    spec = vim.vm.ConfigSpec(numCPUs=8)
    err = fails(vm.ReconfigVM_Task(spec), vmodl.fault.SystemError)
    assert err.reason == "gpusim injected fault: reconfigure of esx-01-vm1"
    assert vm.config.hardware.numCPU == 4
    ok(vm.ReconfigVM_Task(spec))
    assert vm.config.hardware.numCPU == 8


def test_fail_task_nth(make_env):
    e = make_env(hosts=1, vms_per_host=1, faults=["fail-task=2"])
    vm = e.vm("esx-01-vm1")
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(numCPUs=2)))
    err = fails(vm.PowerOnVM_Task(), vmodl.fault.SystemError)
    assert "gpusim injected fault" in err.reason
    ok(vm.PowerOnVM_Task())


def test_fail_task_stock_method(make_env):
    e = make_env(hosts=1, vms_per_host=1, faults=["fail-task=1"])
    host = e.host("esx-01")
    err = fails(host.ExitMaintenanceMode_Task(timeout=0), vmodl.fault.SystemError)
    assert err.reason.startswith("gpusim injected fault: task 1")
    assert err.msg.startswith("gpusim injected fault")
    ok(host.ExitMaintenanceMode_Task(timeout=0))


def test_latency_tasks_overlap(make_env):
    e = make_env(hosts=1, vms_per_host=2, latency={"ReconfigVM_Task": "1s"})
    vms = [e.vm("esx-01-vm1"), e.vm("esx-01-vm2")]
    t0 = time.monotonic()
    tasks = [vm.ReconfigVM_Task(vim.vm.ConfigSpec(numCPUs=16)) for vm in vms]
    submitted = time.monotonic() - t0
    assert submitted < 0.8, "submitting must not wait for the latency"
    assert tasks[0].info.state == vim.TaskInfo.State.running
    for t in tasks:
        ok(t)
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 1.8, elapsed
    assert all(vm.config.hardware.numCPU == 16 for vm in vms)


def test_wrong_password_refused(env):
    with pytest.raises(vim.fault.InvalidLogin):
        connect(env.sim, pwd="wrong")
    with pytest.raises(vim.fault.InvalidLogin):
        connect(env.sim, user="root")


def test_plain_http_and_h100(make_env):
    e = make_env(hosts=3, vms_per_host=1, tls=False, gpu="h100-80")
    assert e.sim.url.startswith("http://")
    assert sorted(h.name for h in e.objects(vim.HostSystem)) == ["esx-01", "esx-02", "esx-03"]
    host = e.host("esx-03")
    assert {d.deviceId for d in host.hardware.pciDevice if d.vendorId == 0x10DE} == {0x2331}
    assert "grid_h100-7-80c" in host.config.sharedPassthruGpuTypes


def test_missing_binary_message(tmp_path):
    with pytest.raises(RuntimeError, match="make sim"):
        gsim.Simulator(binary=tmp_path / "nope").start()


def dynamic_spec(count: int, affinity: str) -> vim.vm.ConfigSpec:
    backing = vim.vm.device.VirtualPCIPassthrough.DynamicBackingInfo(
        allowedDevice=[vim.vm.device.VirtualPCIPassthrough.AllowedDevice(vendorId=0x10DE, deviceId=0x20B5)])
    return vim.vm.ConfigSpec(
        firmware="efi", memoryReservationLockedToMax=True,
        deviceChange=[vim.vm.device.VirtualDeviceSpec(operation="add", device=vim.vm.device.VirtualPCIPassthrough(
            key=-1 - n, backing=backing)) for n in range(count)],
        extraConfig=[vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value="TRUE"),
                     vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="256"),
                     vim.option.OptionValue(key="numa.nodeAffinity", value=affinity)])


def assigned(vm) -> list[str]:
    return sorted(d.backing.assignedId for d in vm.config.hardware.device
                  if isinstance(d, vim.vm.device.VirtualPCIPassthrough))


def test_dynamic_directpath_follows_numa_node_affinity(make_env):
    # seen: a VM with numa.nodeAffinity = 1 was given the two NUMA-0 GPUs
    e = make_env(hosts=1, vms_per_host=2, rebind=True)
    host = e.host("esx-01")
    host.configManager.pciPassthruSystem.UpdatePassthruConfig(
        [vim.host.PciPassthruConfig(id=i, passthruEnabled=True) for i in GPU_IDS])
    vm1, vm2 = e.vm("esx-01-vm1"), e.vm("esx-01-vm2")
    ok(vm1.ReconfigVM_Task(dynamic_spec(2, "1")))
    ok(vm1.PowerOnVM_Task())
    assert assigned(vm1) == ["0000:b1:00.0", "0000:ca:00.0"]

    ok(vm2.ReconfigVM_Task(dynamic_spec(1, "1")))  # node 1 is taken; node 0 is free but not allowed
    err = fails(vm2.PowerOnVM_Task(), vim.fault.GenericVmConfigFault)
    assert re.search(r"No available passthrough device on host esx-01 matches dynamic DirectPath device \d+ on the "
                     r"virtual machine's NUMA node affinity \(numa.nodeAffinity = 1\)\.$", fault_text(err))
    ok(vm2.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key="numa.nodeAffinity", value="0,1")])))
    ok(vm2.PowerOnVM_Task())
    assert assigned(vm2) == ["0000:17:00.0"]


def test_requests_counted_on_the_wire(make_env):
    env = make_env(hosts=1, vms_per_host=1)
    # what connecting took (SmartConnect, then Env.content); the requests that created the VMs at
    # start-up are not counted
    assert env.sim.requests(reset=True) == {"RetrieveServiceContent": 2, "Login": 1}
    env.si.CurrentTime()
    env.si.CurrentTime()
    env.host("esx-01")
    counts = env.sim.requests()
    assert counts["CurrentTime"] == 2
    assert counts["CreateContainerView"] == 1 and counts["DestroyView"] == 1
    assert "Login" not in counts
    assert env.sim.requests(reset=True) == counts and env.sim.requests() == {}


def test_vgpu_needs_the_nvidia_vgpu_manager_running_after_a_reboot(make_env, tmp_path):
    """No vGPU manager: no vGPU types on offer and a vGPU VM does not power on (ESXi's plugin fault);
    the reboot hook tells gpusim the manager the host booted with (what the ESXi shell installed)."""
    booted_with = tmp_path / "manager"
    booted_with.write_text("none")
    e = make_env(hosts=1, vms_per_host=1, vgpu_manager={"esx-01": "none"},
                 on_reboot=f'echo "GPUSIM_VGPU_MANAGER=$(cat {booted_with})"')
    host = e.host("esx-01")
    assert list(host.config.sharedPassthruGpuTypes) == []
    host.configManager.graphicsManager.UpdateGraphicsConfig(vim.host.GraphicsConfig(
        hostDefaultGraphicsType="sharedDirect", sharedPassthruAssignmentPolicy="performance"))
    reboot(host)
    vm = e.vm("esx-01-vm1")
    vgpu = vim.vm.device.VirtualPCIPassthrough(
        key=-1, backing=vim.vm.device.VirtualPCIPassthrough.VmiopBackingInfo(vgpu="grid_a100d-4c"))
    ok(vm.ReconfigVM_Task(vim.vm.ConfigSpec(memoryReservationLockedToMax=True, deviceChange=[
        vim.vm.device.VirtualDeviceSpec(operation="add", device=vgpu)])))
    text = fault_text(fails(vm.PowerOnVM_Task(), vim.fault.GenericVmConfigFault))
    assert "Could not initialize plugin '/usr/lib64/vmware/plugin/libnvidia-vgx.so' for vGPU 'grid_a100d-4c'" in text
    assert "esx-01" in text

    booted_with.write_text("535.154.02")  # installed: active once the host reboots
    reboot(host)
    assert "grid_a100d-4c" in host.config.sharedPassthruGpuTypes
    assert "grid_a100d-4c" in host.configManager.graphicsManager.sharedPassthruGpuTypes
    ok(vm.PowerOnVM_Task())


def test_an_unset_property_reads_as_none_as_on_vcenter(make_env):
    """pyVmomi reads one property with Fetch; the stock simulator panicked on an unset one (a template's
    resourcePool), dropping the connection. vCenter answers None, and the simulator goes on answering."""
    env = make_env(vms_per_host=1, templates=["tpl"])
    template = env.vm("tpl")
    assert template.config.template is True and template.resourcePool is None
    vm = next(v for v in env.objects(vim.VirtualMachine) if v.name != "tpl")
    assert vm.resourcePool is not None and vm.resourcePool.name  # a set property: its value, as before
    assert "Fetch" in env.sim.log() and "panic" not in env.sim.log()
