"""vsphere/in_flight.py: the vCenter tasks in flight on the runbook's VMs, awaited once before apply
observes, against a mocked vCenter session (pytest-mock)."""

from __future__ import annotations

import pytest
from pyVmomi import vim

from gpuvm.errors import TaskError
from gpuvm.vsphere import in_flight

RUNBOOK_VMS = {"esx-01-vm1", "esx-01-vm2"}


def row(mocker, moid: str, **props):
    """One object of a RetrieveContents answer: its moid and properties."""
    found = mocker.Mock()
    found.obj = mocker.Mock(_moId=moid)
    found.propSet = []
    for name, val in props.items():
        prop = mocker.Mock(val=val)
        prop.name = name
        found.propSet.append(prop)
    return found


def task(mocker, moid: str, entity, kind: str, state: str = "running"):
    return row(mocker, moid, **{"info.entity": entity, "info.state": state, "info.descriptionId": kind})


def named(mocker, names: dict[str, str]):
    return [row(mocker, moid, name=name) for moid, name in names.items()]


def vcenter(mocker):
    """A session whose RetrieveContents answers the test sets (`session.call`)."""
    session = mocker.Mock()
    session.content.taskManager = vim.TaskManager("TaskManager")
    return session


@pytest.fixture
def watcher(mocker):
    """The TaskWatcher every wait goes through: each task ends as soon as it is waited for."""
    watching = mocker.Mock()
    watching.wait.side_effect = lambda task, timeout: mocker.Mock(state="success")
    mocker.patch.object(in_flight.TaskWatcher, "of", return_value=watching)
    return watching


def test_no_task_in_flight_is_one_read_no_wait_and_no_line(mocker, watcher):
    session, say = vcenter(mocker), mocker.Mock()
    session.call.return_value = [task(mocker, "task-1", vim.VirtualMachine("vm-42"), "VirtualMachine.reconfigure",
                                      state="success")]
    in_flight.await_on_vms(session, RUNBOOK_VMS, 60, say)
    assert session.call.call_count == 1  # the recent tasks only: no name read, no poll
    say.assert_not_called()
    watcher.wait.assert_not_called()


def test_tasks_on_other_vms_and_on_hosts_are_not_awaited(mocker, watcher):
    session, say = vcenter(mocker), mocker.Mock()
    session.call.side_effect = [
        [task(mocker, "task-1", vim.VirtualMachine("vm-7"), "VirtualMachine.powerOn"),
         task(mocker, "task-2", vim.HostSystem("host-1"), "HostSystem.enterMaintenanceMode")],
        named(mocker, {"vm-7": "someone-elses-vm"}),
    ]
    in_flight.await_on_vms(session, RUNBOOK_VMS, 60, say)
    names_read = session.call.call_args_list[1].args[2][0]
    assert [spec.obj._moId for spec in names_read.objectSet] == ["vm-7"]  # the host's task: never named
    say.assert_not_called()
    watcher.wait.assert_not_called()


def test_tasks_on_the_runbooks_vms_are_named_then_awaited(mocker, watcher):
    session, said = vcenter(mocker), []
    session.call.side_effect = [
        [task(mocker, "task-1", vim.VirtualMachine("vm-42"), "VirtualMachine.reconfigure"),
         task(mocker, "task-2", vim.VirtualMachine("vm-7"), "VirtualMachine.powerOn", state="queued"),
         task(mocker, "task-3", vim.VirtualMachine("vm-9"), "VirtualMachine.powerOff")],
        named(mocker, {"vm-42": "esx-01-vm2", "vm-7": "esx-01-vm1", "vm-9": "other"}),
    ]
    in_flight.await_on_vms(session, RUNBOOK_VMS, 60, said.append)
    assert said[0] == ("waiting for 2 vCenter task(s) in flight: esx-01-vm2 VirtualMachine.reconfigure, "
                       "esx-01-vm1 VirtualMachine.powerOn")
    assert said[1].startswith("done: 2 task(s) ended in ")
    assert [c.args[0]._moId for c in watcher.wait.call_args_list] == ["task-1", "task-2"]
    assert all(0 < c.args[1] <= 60 for c in watcher.wait.call_args_list)


def test_a_task_still_in_flight_past_the_bound_is_an_error_naming_the_vm_and_the_task(mocker, watcher):
    session, said = vcenter(mocker), []
    reconfigure = task(mocker, "task-9", vim.VirtualMachine("vm-42"), "VirtualMachine.reconfigure")
    session.call.side_effect = [[reconfigure], named(mocker, {"vm-42": "esx-01-vm2"}), [reconfigure]]
    watcher.wait.side_effect = lambda task, timeout: None  # not ended within the bound
    with pytest.raises(TaskError) as caught:
        in_flight.await_on_vms(session, RUNBOOK_VMS, 1800, said.append)
    assert str(caught.value) == ("1 vCenter task(s) still in flight after 1800 s: esx-01-vm2 "
                                 "VirtualMachine.reconfigure (task-9); nothing was changed: run apply again "
                                 "once they have ended")
    assert caught.value.exit_code == 4 and len(said) == 1  # the waiting line, never a "done"


def test_a_vm_destroyed_between_the_two_reads_reads_them_again(mocker, watcher):
    from pyVmomi import vmodl

    session = vcenter(mocker)
    destroy = task(mocker, "task-4", vim.VirtualMachine("vm-5"), "VirtualMachine.destroy")
    session.call.side_effect = [[destroy], vmodl.fault.ManagedObjectNotFound(obj=vim.VirtualMachine("vm-5")), []]
    in_flight.await_on_vms(session, RUNBOOK_VMS, 60)
    assert session.call.call_count == 3
    watcher.wait.assert_not_called()
