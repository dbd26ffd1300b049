"""Maintenance mode entered as vSphere enters it (issue 21 item 9): with VMs running on the host the
task keeps running until they are off, or fails with Timedout after its timeout; it can be canceled,
and it completes whether or not the client that started it is still there."""

from __future__ import annotations

import time

import pytest
from pyVmomi import vim, vmodl

from gpusim import Simulator
from tests.integration.vcenter import pyvmomi

pytestmark = pytest.mark.integration


def objects(si, kind):
    content = si.RetrieveContent()
    view = content.viewManager.CreateContainerView(content.rootFolder, [kind], True)
    try:
        return list(view.view)
    finally:
        view.DestroyView()


def ended(task, within: float = 5.0):
    deadline = time.monotonic() + within
    while task.info.state in ("queued", "running"):
        assert time.monotonic() < deadline, f"task {task._moId} still {task.info.state}"
        time.sleep(0.05)
    return task.info


def test_entering_maintenance_waits_for_running_vms_times_out_and_can_be_canceled():
    with Simulator(hosts=1, vms_per_host=1, vm_power="on", latency={"PowerOnVM_Task": "300ms"}) as sim, pyvmomi(sim) as si:
        host, vm = objects(si, vim.HostSystem)[0], objects(si, vim.VirtualMachine)[0]

        waiting = host.EnterMaintenanceMode_Task(timeout=0)
        time.sleep(0.4)
        assert waiting.info.state == "running" and waiting.info.cancelable  # blocked by the running VM
        assert not host.runtime.inMaintenanceMode
        assert ended(vm.PowerOffVM_Task()).state == "success"
        assert ended(waiting).state == "success" and host.runtime.inMaintenanceMode
        assert ended(host.ExitMaintenanceMode_Task(timeout=0)).state == "success"

        assert ended(vm.PowerOnVM_Task()).state == "success"
        timed_out = ended(host.EnterMaintenanceMode_Task(timeout=1))
        assert timed_out.state == "error" and isinstance(timed_out.error, vim.fault.Timedout), timed_out.error
        assert not host.runtime.inMaintenanceMode

        canceled = host.EnterMaintenanceMode_Task(timeout=0)
        canceled.CancelTask()
        info = ended(canceled)
        assert info.state == "error" and isinstance(info.error, vmodl.fault.RequestCanceled) and info.cancelled
        assert not host.runtime.inMaintenanceMode
        with pytest.raises(vim.fault.InvalidState):  # an ended task cannot be canceled
            canceled.CancelTask()
        assert ended(vm.PowerOffVM_Task()).state == "success"
        powering_on = vm.PowerOnVM_Task()  # runs for a while (latency), and is not cancelable
        with pytest.raises(vmodl.fault.NotSupported):
            powering_on.CancelTask()
        assert ended(powering_on).state == "success"


def test_a_task_completes_after_its_client_is_gone():
    with Simulator(hosts=1, vms_per_host=0, latency={"EnterMaintenanceMode_Task": "600ms"}) as sim:
        with pyvmomi(sim) as si:
            objects(si, vim.HostSystem)[0].EnterMaintenanceMode_Task(timeout=0)
        time.sleep(1.0)  # logged out, connection closed
        with pyvmomi(sim) as si:
            assert objects(si, vim.HostSystem)[0].runtime.inMaintenanceMode
