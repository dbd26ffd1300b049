"""vSphere fault translation and task waiting, against a mocked vCenter session (pytest-mock)."""

from __future__ import annotations

import pytest
from pyVmomi import vim, vmodl

from gpuvm.errors import ConnectError, TaskError
from gpuvm.secrets import remember
from gpuvm.vsphere import tasks
from gpuvm.vsphere.session import Session, Target


def watched(mocker, *rounds, then=None):
    """Tasks on one mocked connection; each poll of the TaskWatcher (one RetrievePropertiesEx for
    every task) reads the next round of {task moid: (state, result, error)}; after the rounds,
    `then(moid)` gives the state of each task asked for."""
    stub = mocker.Mock(_gpuvm_task_watcher=None)
    collector = mocker.Mock()
    left = list(rounds)

    seen: dict[str, tuple] = {}  # what each task's state read said last

    def result(specs, options):
        asked = [o.obj._moId for o in specs[0].objectSet]
        path = specs[0].propSet[0].pathSet[0]
        if path == "info.state":  # a poll
            seen.update(left.pop(0) if left else {moid: then(moid) for moid in asked})
            values = {moid: seen[moid][0] for moid in asked if moid in seen}
        else:  # the whole info of the tasks that ended
            values = {moid: mocker.Mock(state=seen[moid][0], result=seen[moid][1], error=seen[moid][2])
                      for moid in asked}
        objects = [mocker.Mock(obj=mocker.Mock(_moId=moid), missingSet=[], propSet=[mocker.Mock(val=value)])
                   for moid, value in values.items()]
        for obj in objects:
            obj.propSet[0].name = path
        return mocker.Mock(objects=objects, token=None)

    collector.RetrievePropertiesEx.side_effect = result
    mocker.patch.object(tasks.TaskWatcher, "_collector", return_value=collector)
    mocker.patch.object(tasks, "POLL_START", 0.001)
    return stub, collector


def task_with(mocker, *states):
    """A task whose `info` walks through the given (state, result, error) tuples, one per poll."""
    stub, _ = watched(mocker, *({"task-7": s} for s in states))
    return vim.Task("task-7", stub)


def test_wait_returns_the_result_after_running(mocker):
    task = task_with(mocker, ("running", None, None), ("queued", None, None), ("success", "ok", None))
    assert tasks.wait(task, "ReconfigVM") == "ok"


def test_wait_turns_a_task_fault_into_one_line_naming_the_action(mocker):
    fault = vim.fault.GenericVmConfigFault(msg="Module DevicePowerOn power on failed.",
                                           faultMessage=[vim.LocalizableMessage(key="k", message="total number of pages needed (1) exceeds limit (0)")])
    task = task_with(mocker, ("error", None, fault))
    with pytest.raises(TaskError) as caught:
        tasks.wait(task, "PowerOnVM")
    assert str(caught.value) == ("PowerOnVM failed: Module DevicePowerOn power on failed.; total number "
                                 "of pages needed (1) exceeds limit (0) (GenericVmConfigFault)")


def test_wait_times_out(mocker):
    stub, _ = watched(mocker, then=lambda n: ("running", None, None))
    task = vim.Task("task-7", stub)
    with pytest.raises(TaskError, match=r"^ReconfigVM did not finish within 0 s \(task task-7\)"):
        tasks.wait(task, "ReconfigVM", timeout=0.05)


def test_many_tasks_waited_for_with_one_request_a_poll(mocker):
    from concurrent.futures import ThreadPoolExecutor

    names = [f"task-{i}" for i in range(16)]
    running = {n: ("running", None, None) for n in names}
    stub, collector = watched(mocker, *[running] * 3, then=lambda n: ("success", n.upper(), None))
    mocker.patch.object(tasks, "POLL_START", 0.05)  # all 16 have begun waiting by the second poll
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda n: tasks.wait(vim.Task(n, stub), "ReconfigVM"), names))
    assert results == [n.upper() for n in names]
    assert collector.RetrievePropertiesEx.call_count <= 6  # ~4 polls and 1-2 reads of ended tasks, not 16 x 4


def test_the_poller_stops_as_soon_as_no_task_is_waited_for(mocker):
    """A poller that slept on after the last task ended made the next task waited for (a reboot's
    enter, reboot, exit: one after another) wait out that sleep, POLL_MAX each."""
    stub, _ = watched(mocker, then=lambda moid: ("success", moid, None))
    mocker.patch.object(tasks, "POLL_MAX", 60.0)
    for moid in ("task-1", "task-2"):
        assert tasks.wait(vim.Task(moid, stub), "EnterMaintenanceMode") == moid
        poller = stub._gpuvm_task_watcher._poller
        poller.join(timeout=10)
        assert not poller.is_alive(), "the poller sleeps on with nothing to wait for"


@pytest.mark.parametrize("where", ["method", "property"])
def test_a_fault_reading_the_tasks_reaches_every_waiter(mocker, where):
    stub, collector = watched(mocker)
    fault = vim.fault.NotAuthenticated(msg="session gone")
    if where == "method":
        collector.RetrievePropertiesEx.side_effect = fault
    else:  # as gpusim answers a property read of a session that is gone
        collector.RetrievePropertiesEx.side_effect = None
        collector.RetrievePropertiesEx.return_value = mocker.Mock(token=None, objects=[mocker.Mock(
            propSet=[], missingSet=[mocker.Mock(path="info", fault=fault)])])
    with pytest.raises(TaskError, match="^ReconfigVM failed: session gone"):
        tasks.wait(vim.Task("task-1", stub), "ReconfigVM")


def test_call_translates_method_faults_and_redacts_secrets():
    remember("s3cret-token")

    def boom():
        raise vmodl.fault.SystemError(msg="backend said s3cret-token", reason="disk")

    with pytest.raises(TaskError) as caught:
        tasks.call("UpdatePassthruConfig", boom)
    assert "s3cret-token" not in str(caught.value)
    assert str(caught.value).startswith("UpdatePassthruConfig failed: backend said ********; disk")


def test_fault_text_without_message_names_the_fault_type():
    assert tasks.fault_text(vim.fault.InvalidPowerState()) == "no details (InvalidPowerState)"


def test_wait_for_other_tasks_polls_until_the_vm_is_idle(mocker):
    mocker.patch.object(tasks.time, "sleep")
    vm = mocker.Mock(_moId="vm-42")

    def task_row(state, entity):
        row = mocker.Mock()
        row.obj = mocker.Mock(_moId=f"task-{state}")
        row.propSet = [mocker.Mock(val=mocker.Mock(_moId=entity)), mocker.Mock(val=state)]
        row.propSet[0].name, row.propSet[1].name = "info.entity", "info.state"
        return row

    session = mocker.Mock()
    session.call.side_effect = [
        [task_row("running", "vm-42"), task_row("running", "vm-7")],
        [task_row("success", "vm-42")],
    ]
    session.content.taskManager = vim.TaskManager("TaskManager")
    assert tasks.wait_for_other_tasks(session, vm) == 1
    assert [c.args[1] for c in session.call.call_args_list] == ["RetrieveContents", "RetrieveContents"]


def test_login_refused_is_a_connect_error(mocker):
    mocker.patch("gpuvm.vsphere.session.api_version", return_value="vim.version.v8_0_1_0")
    mocker.patch.object(vim.ServiceInstance, "RetrieveContent", side_effect=vim.fault.InvalidLogin())
    target = Target("vc", 443, "/sdk", "admin", "pw", False, None)
    with pytest.raises(ConnectError, match=r"https://vc:443/sdk: login refused for user admin"):
        Session(target).__enter__()


def test_connection_refused_is_a_connect_error(mocker):
    mocker.patch("gpuvm.vsphere.session.api_version", side_effect=ConnectionRefusedError(111, "Connection refused"))
    with pytest.raises(ConnectError, match=r"cannot connect: \[Errno 111\] Connection refused"):
        Session(Target("vc", 443, "/sdk", "admin", "pw", True, None)).__enter__()


def test_targets_asking_for_running_tasks_at_once_share_one_read(mocker):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    reads = []

    def read():
        reads.append(1)
        release.wait(5)
        return {"vm-1": ["task-9"]}

    shared = tasks._SharedRead(read)
    with ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(shared) for _ in range(8)]
        while not reads:
            pass
        threading.Timer(0.5, release.set).start()  # the other seven ask while the first read is under way
        assert [a.result() for a in answers] == [{"vm-1": ["task-9"]}] * 8
    assert len(reads) == 1
    release.clear()
    threading.Timer(0.05, release.set).start()
    assert shared() == {"vm-1": ["task-9"]} and len(reads) == 2  # a later ask reads again
