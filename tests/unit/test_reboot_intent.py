"""host.reboot records its intent on the objects before each act, clears it once the act is undone,
and undoes what it did on every path after the first stop (issue 21, items 1 and 2); power_off
falls back to a hard power-off only when the guest has no tools (item 2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyVmomi import vim, vmodl

from gpuvm.errors import TaskError
from gpuvm.plan import Change, Disruption
from gpuvm.steps import host_reboot, power, vm_power
from gpuvm.steps.base import Context, Options, WhileOff
from gpuvm.steps.host_reboot import RebootHost, StopForReboot
from tests.unit.factories import inventory, r750xa, vm


class World:
    """A host with two running VMs, whose every act (and every intent recorded or cleared) lands in
    one log, in order. `fail` names the act that raises."""

    def __init__(self, fail: str = ""):
        self.log: list[tuple] = []
        self.fail = fail
        self.host = SimpleNamespace(_moId="host-esx-01", runtime=SimpleNamespace(
            inMaintenanceMode=False, bootTime=1, connectionState="connected"))
        self.host.EnterMaintenanceMode_Task = lambda timeout: self._act("enter", maintenance=True)
        self.host.ExitMaintenanceMode_Task = lambda timeout: self._act("exit", maintenance=False)
        self.host.RebootHost_Task = lambda force: self._act("reboot", booted=2)
        self.vms = {name: self._vm(name) for name in ("gpu-vm", "build-box")}
        self.intents: dict[tuple[str, str], dict] = {}

    def _vm(self, name: str) -> SimpleNamespace:
        machine = SimpleNamespace(_moId=f"vm-{name}", runtime=SimpleNamespace(powerState="poweredOn"))
        machine.ShutdownGuest = lambda: self._power(machine, "shutdown", "poweredOff")
        machine.PowerOnVM_Task = lambda: self._power(machine, "power-on", "poweredOn")
        machine.PowerOffVM_Task = lambda: self._power(machine, "power-off", "poweredOff")
        return machine

    def _act(self, what: str, maintenance: bool | None = None, booted: int | None = None):
        self.log.append((what, "host-esx-01"))
        if self.fail == what:
            raise vim.fault.InvalidState(msg=f"{what} refused")
        if maintenance is not None:
            self.host.runtime.inMaintenanceMode = maintenance
        if booted is not None:
            self.host.runtime.bootTime = booted
        return SimpleNamespace(_moId="task-1", info=SimpleNamespace(state="success"))

    def _power(self, machine, what: str, state: str):
        self.log.append((what, machine._moId))
        if what == "power-on" and self.host.runtime.inMaintenanceMode:
            raise vim.fault.InvalidState(msg="host is in maintenance mode")
        machine.runtime.powerState = state
        return SimpleNamespace(_moId="task-2", info=SimpleNamespace(state="success"))

    def ref(self, kind: str, moid: str):
        return self.host if kind == "HostSystem" else next(v for v in self.vms.values() if v._moId == moid)

    def record(self, entity, act, why, **data):
        self.log.append(("record " + act, entity._moId))
        self.intents[(entity._moId, act)] = data

    def current(self, entity, kind):
        return {act: data for (moid, act), data in self.intents.items() if moid == entity._moId}

    def clear(self, entity, act):
        if self.fail == f"clear {act}":
            raise TaskError("vCenter went away")
        self.log.append(("clear " + act, entity._moId))
        self.intents.pop((entity._moId, act), None)


@pytest.fixture
def world(mocker, request):
    w = World(getattr(request, "param", ""))
    mocker.patch.object(host_reboot, "wait_for_other_tasks", return_value=0)
    mocker.patch.object(power, "wait_for_other_tasks", return_value=0)
    mocker.patch("gpuvm.vsphere.tasks.wait", return_value=None)
    return w


def reboot(world: World, mocker, others=(), **context) -> dict[str, Exception]:
    ctx = Context(session=mocker.MagicMock(), options=Options(shutdown_timeout=1, task_timeout=5),
                  inventory=inventory([r750xa()], [vm("gpu-vm", power_state="poweredOn"),
                                                   vm("build-box", power_state="poweredOn"), *others]), **context)
    ctx.session.ref.side_effect = world.ref
    ctx.intents = mocker.MagicMock(record=world.record, clear=world.clear, current=world.current)
    changes = {"esx-01": [Change("host.reboot", "esx-01", "host", "reboot", "1", "rebooted", Disruption.HOST_REBOOT,
                                 RebootHost())],
               "gpu-vm": [Change("host.reboot", "gpu-vm", "vm", "power", "on", "off", Disruption.VM_POWER_OFF,
                                 StopForReboot("esx-01", restore=False))],
               "build-box": [Change("host.reboot", "build-box", "vm", "power", "on", "off", Disruption.VM_POWER_OFF,
                                    StopForReboot("esx-01", restore=True))]}
    return host_reboot.apply_all(ctx, changes, 1)


def test_each_act_is_recorded_before_it_and_cleared_after_it_is_undone(world, mocker):
    assert reboot(world, mocker) == {}
    assert world.log == [
        ("record power-off", "vm-gpu-vm"), ("shutdown", "vm-gpu-vm"),
        ("record power-off", "vm-build-box"), ("shutdown", "vm-build-box"),
        ("record maintenance", "host-esx-01"), ("enter", "host-esx-01"), ("reboot", "host-esx-01"),
        ("exit", "host-esx-01"), ("clear maintenance", "host-esx-01"),
        ("clear power-off", "vm-gpu-vm"),  # the runbook's VM: vm.power powers it on
        ("power-on", "vm-build-box"), ("clear power-off", "vm-build-box"),
        ("record rebooted", "host-esx-01")]  # the memo of what the reboot was for (reboot_memo), kept
    assert set(world.intents) == {("host-esx-01", "rebooted")}


@pytest.mark.parametrize("held", [set(), {"gpu-vm"}])
def test_the_runbooks_vm_is_changed_while_off_then_back_with_its_host_unless_its_change_failed(world, mocker, held):
    """Rolling (issue 22, item 5): the VM's new devices (which need it off) are made within the host's
    batch, after the reboot, by the engine (`Context.while_off`); then the VM comes back at once.
    A VM whose change failed stays off (its failure is the engine's to report)."""
    def while_off(vms):
        world.log.append(("while-off", ",".join(vms)))
        return held

    planned = [Change("vm.hardware", "gpu-vm", "pci device (new)", "device", None, "gpu", Disruption.VM_POWER_OFF),
               Change("vm.power", "gpu-vm", "vm", "power", "poweredOff", "poweredOn", Disruption.NONE,
                      vm_power.SetPower("on"))]
    assert reboot(world, mocker, planned=planned,
                  while_off=WhileOff(frozenset({"vm.version", "vm.hardware", "vm.advanced"}), while_off)) == {}
    after = world.log[world.log.index(("clear maintenance", "host-esx-01")):]
    back = [("power-on", "vm-gpu-vm")] if not held else []
    assert after[1:4 + len(back)] == [("while-off", "gpu-vm"), *back, ("clear power-off", "vm-gpu-vm"),
                                      ("power-on", "vm-build-box")]


@pytest.mark.parametrize("waiting", [False, True])
def test_a_dynamic_directpath_vm_comes_back_last_or_waits_for_a_vm_that_names_its_gpus(world, mocker, waiting):
    """As vm.power orders them: after the VMs that name their GPUs. When one of those on the host does
    not come back now (off before, started by vm.power), the dynamic VM waits for vm.power too."""
    planned = [Change("vm.power", "gpu-vm", "vm", "power", "poweredOff", "poweredOn", Disruption.NONE,
                      vm_power.SetPower("on", dynamic=True))]
    others = []
    if waiting:
        others = [vm("named-gpus", power_state="poweredOff")]
        planned.append(Change("vm.power", "named-gpus", "vm", "power", "poweredOff", "poweredOn", Disruption.NONE,
                              vm_power.SetPower("on")))
    assert reboot(world, mocker, others, planned=planned,
                  while_off=WhileOff(frozenset({"vm.hardware"}), lambda vms: set())) == {}
    after = world.log[world.log.index(("clear maintenance", "host-esx-01")) + 1:]
    back = [] if waiting else [("power-on", "vm-gpu-vm")]
    assert after == [("power-on", "vm-build-box"), ("clear power-off", "vm-build-box"), *back,
                     ("clear power-off", "vm-gpu-vm"), ("record rebooted", "host-esx-01")]


@pytest.mark.parametrize("world", ["enter", "boot-time", "reboot", "wait"], indirect=True)
def test_every_failure_after_the_stop_undoes_maintenance_and_powers_the_vms_on_again(world, mocker):
    if world.fail == "boot-time":
        world.host.runtime = SimpleNamespace(inMaintenanceMode=False, connectionState="connected")  # bootTime unreadable
        real_call = host_reboot.call

        def call(action, fn):
            if action == "read boot time":
                raise TaskError("read boot time failed: host not responding")
            return real_call(action, fn)

        mocker.patch.object(host_reboot, "call", side_effect=call)
    if world.fail == "wait":
        mocker.patch.object(host_reboot, "_wait_rebooted", side_effect=TaskError("host did not come back"))
    failures = reboot(world, mocker)
    assert set(failures) == {"esx-01", "gpu-vm", "build-box"}
    assert not world.host.runtime.inMaintenanceMode
    assert all(m.runtime.powerState == "poweredOn" for m in world.vms.values())
    assert world.intents == {}, "an undone act kept its record"


@pytest.mark.parametrize("world", ["exit"], indirect=True)
def test_what_cannot_be_undone_keeps_its_record_for_the_next_run(world, mocker):
    mocker.patch.object(host_reboot, "_wait_rebooted", side_effect=TaskError("host did not come back"))
    failures = reboot(world, mocker)
    assert "host did not come back" in str(failures["esx-01"])
    assert world.host.runtime.inMaintenanceMode  # the exit failed ...
    assert set(world.intents) == {("host-esx-01", "maintenance"), ("vm-gpu-vm", "power-off"),
                                  ("vm-build-box", "power-off")}  # ... so every record stays


def test_an_enter_task_past_gpuvms_timeout_is_canceled(mocker):
    task = mocker.MagicMock()
    task.info.state = "running"
    mocker.patch("gpuvm.vsphere.tasks.wait", side_effect=TaskError("EnterMaintenanceMode did not finish within 5 s"))
    with pytest.raises(TaskError, match="did not finish"):
        host_reboot._finish(task, "EnterMaintenanceMode", 5)
    task.CancelTask.assert_called_once_with()


def machine(mocker, *shutdown_answers):
    vm_ref = mocker.MagicMock()
    vm_ref.runtime.powerState = "poweredOn"
    answers = iter(shutdown_answers)

    def shutdown():
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        vm_ref.runtime.powerState = "poweredOff"

    vm_ref.ShutdownGuest.side_effect = shutdown
    ctx = mocker.MagicMock(options=Options(shutdown_timeout=0, task_timeout=5))
    mocker.patch.object(power, "_idle", return_value=vm_ref)
    mocker.patch.object(power, "run_task")
    mocker.patch.object(power, "SHUTDOWN_RETRY_S", 0)
    return ctx, vm_ref


@pytest.mark.parametrize("answer", [vim.fault.ToolsUnavailable(), vmodl.fault.NotSupported()],
                         ids=["ToolsUnavailable", "NotSupported"])
def test_a_guest_without_tools_is_powered_off_hard(mocker, answer):
    ctx, vm_ref = machine(mocker, answer)
    power.power_off(ctx, "vm1")
    power.run_task.assert_called_once()


@pytest.mark.parametrize("answer", [ConnectionResetError("reset by peer"), vim.fault.TaskInProgress()],
                         ids=["connection-error", "TaskInProgress"])
def test_a_transient_shutdown_error_is_retried_and_never_becomes_a_hard_power_off(mocker, answer):
    ctx, vm_ref = machine(mocker, answer, answer, answer)
    with pytest.raises(TaskError, match="ShutdownGuest failed 3 times.*not powered off hard"):
        power.power_off(ctx, "vm1")
    power.run_task.assert_not_called()

    ctx, vm_ref = machine(mocker, answer, None)  # asked again, it shuts down: no hard power-off either
    power.power_off(ctx, "vm1")
    assert vm_ref.ShutdownGuest.call_count == 2 and vm_ref.runtime.powerState == "poweredOff"
    power.run_task.assert_not_called()


def test_maintenance_an_operator_entered_since_the_plan_is_left_to_them(world, mocker):
    world.host.runtime.inMaintenanceMode = True  # entered by hand after the plan read the host (no record)
    failures = reboot(world, mocker)  # rebooted; build-box cannot power on again while the host is in maintenance
    assert "host is in maintenance mode" in str(failures["build-box"])
    assert ("exit", "host-esx-01") not in world.log and world.host.runtime.inMaintenanceMode
    assert ("record maintenance", "host-esx-01") in world.log  # taken back at once:
    assert set(world.intents) == {("vm-build-box", "power-off")}  # only the VM still owed its power-on is recorded


class InstallInMaintenance:
    """An earlier step's work for maintenance mode (what esxi.vgpu_manager's install is), logged into the world."""

    def __init__(self, world: World, fails: bool = False):
        self.world, self.fails = world, fails

    def in_maintenance(self, ctx, host: str) -> None:
        assert self.world.host.runtime.inMaintenanceMode, "installed outside maintenance mode"
        self.world.log.append(("install", host))
        if self.fails:
            raise TaskError("esxcli software component apply failed")


def reboot_with_install(world: World, mocker, fails: bool = False) -> dict[str, Exception]:
    install = Change("esxi.vgpu_manager", "esx-01", "NVIDIA vGPU manager", "installed", "none", "535.154.02",
                     Disruption.HOST_REBOOT, InstallInMaintenance(world, fails))  # type: ignore[arg-type]
    ctx = Context(session=mocker.MagicMock(), options=Options(shutdown_timeout=1, task_timeout=5),
                  inventory=inventory([r750xa()], [vm("gpu-vm", power_state="poweredOn")]))
    ctx.session.ref.side_effect = world.ref
    ctx.intents = mocker.MagicMock(record=world.record, clear=world.clear, current=world.current)
    reboot_host = Change("host.reboot", "esx-01", "host", "reboot", "1", "rebooted", Disruption.HOST_REBOOT, RebootHost())
    stop = Change("host.reboot", "gpu-vm", "vm", "power", "on", "off", Disruption.VM_POWER_OFF,
                  StopForReboot("esx-01", restore=True))
    ctx.planned = [install, reboot_host, stop]
    return host_reboot.apply_all(ctx, {"esx-01": [reboot_host], "gpu-vm": [stop]}, 1)


def test_work_left_for_maintenance_mode_runs_in_it_just_before_the_reboot(world, mocker):
    assert reboot_with_install(world, mocker) == {}
    acts = [what for what, _ in world.log]
    assert acts[acts.index("enter"):acts.index("reboot") + 1] == ["enter", "install", "reboot"]


def test_a_failed_install_undoes_like_a_failed_reboot(world, mocker):
    failures = reboot_with_install(world, mocker, fails=True)
    assert "component apply failed" in str(failures["esx-01"]) and "reboot" not in [w for w, _ in world.log]
    assert not world.host.runtime.inMaintenanceMode and world.vms["gpu-vm"].runtime.powerState == "poweredOn"
    assert world.intents == {}


def test_a_host_and_its_vms_are_begun_before_its_first_act_and_ended_after_its_last(world, mocker):
    """So that a rolling reboot shows each host started when its turn comes (tests/unit/test_rolling_progress.py)."""
    begin = mocker.Mock(side_effect=lambda target: world.log.append(("begin", target)))
    end = mocker.Mock(side_effect=lambda target, error: world.log.append(("end", target, error)))
    assert reboot(world, mocker, begin=begin, end=end) == {}
    assert world.log[:3] == [("begin", "esx-01"), ("begin", "gpu-vm"), ("begin", "build-box")]
    assert world.log[-3:] == [("end", "esx-01", None), ("end", "gpu-vm", None), ("end", "build-box", None)]
    assert ("reboot", "host-esx-01") in world.log[3:-3]


def test_a_vm_stop_without_its_hosts_reboot_in_the_run_fails_untouched_never_done(world, mocker):
    """A stop for a reboot that this run does not make (its host not given) is no change made: the VM
    fails with why, nothing is acted on, and the journal cannot read it as done."""
    ctx = Context(session=mocker.MagicMock(), options=Options(shutdown_timeout=1, task_timeout=5),
                  inventory=inventory([r750xa()], [vm("gpu-vm", power_state="poweredOn")]))
    ctx.session.ref.side_effect = world.ref
    ctx.intents = mocker.MagicMock(record=world.record, clear=world.clear, current=world.current)
    stop = Change("host.reboot", "gpu-vm", "vm", "power", "on", "off", Disruption.VM_POWER_OFF,
                  StopForReboot("esx-01", restore=False))
    failures = host_reboot.apply_all(ctx, {"gpu-vm": [stop]}, 1)
    assert set(failures) == {"gpu-vm"}
    assert str(failures["gpu-vm"]) == "not stopped: the reboot of esx-01 is not part of this run"
    assert world.log == []
