"""vSphere tasks and faults, turned into gpuvm's errors naming the target and step."""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

from gpuvm.errors import TaskError
from gpuvm.secrets import redact

T = TypeVar("T")

POLL_START, POLL_MAX = 0.05, 0.5


def fault_text(fault: Any) -> str:
    """The most useful words in a vSphere fault: its message, nested fault messages, its type."""
    parts: list[str] = []
    message = getattr(fault, "msg", None) or getattr(fault, "localizedMessage", None)
    if message:
        parts.append(str(message))
    for item in getattr(fault, "faultMessage", None) or []:
        if getattr(item, "message", None):
            parts.append(str(item.message))
    reason = getattr(fault, "reason", None)
    if reason and str(reason) not in " ".join(parts):
        parts.append(str(reason))
    name = type(fault).__name__.split(".")[-1]
    text = "; ".join(dict.fromkeys(p.strip() for p in parts if p and p.strip())) or "no details"
    return redact(f"{text} ({name})")


def call(action: str, fn: Callable[[], T]) -> T:
    """Run one vSphere call; a fault becomes a TaskError naming the action (the engine adds target and step)."""
    from pyVmomi import vmodl

    try:
        return fn()
    except vmodl.MethodFault as fault:
        raise TaskError(f"{action} failed: {fault_text(fault)}") from None


def wait(task: Any, action: str, timeout: float = 1800) -> Any:
    """Wait for a task, polling its `info` with backoff; a failed task raises TaskError."""
    from pyVmomi import vim

    deadline = time.monotonic() + timeout
    delay = POLL_START
    while True:
        info = call(action, lambda: task.info)
        if info.state == vim.TaskInfo.State.success:
            return info.result
        if info.state == vim.TaskInfo.State.error:
            raise TaskError(f"{action} failed: {fault_text(info.error)}")
        if time.monotonic() > deadline:
            raise TaskError(f"{action} did not finish within {timeout:.0f} s (task {task._moId})")
        time.sleep(delay)
        delay = min(delay * 2, POLL_MAX)


def run_task(action: str, start: Callable[[], Any], timeout: float = 1800) -> Any:
    task = call(action, start)
    return wait(task, action, timeout)


def wait_for_other_tasks(session: Any, entity: Any, timeout: float = 1800) -> int:
    """Wait until no task runs on `entity` (e.g. one a killed gpuvm run left behind), so that a
    reconfiguration is never stacked on top of an unfinished one. One request per poll. Returns
    how many tasks were waited for."""
    from pyVmomi import vim, vmodl

    collector = session.content.propertyCollector
    traverse = vmodl.query.PropertyCollector.TraversalSpec(name="recent", path="recentTask", skip=False,
                                                           type=vim.TaskManager)
    spec = vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=session.content.taskManager, skip=True,
                                                            selectSet=[traverse])],
        propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.Task, pathSet=["info.entity", "info.state"])])
    busy = {vim.TaskInfo.State.queued, vim.TaskInfo.State.running}
    deadline = time.monotonic() + timeout
    waited: set[str] = set()
    while True:
        result = call("read running tasks", lambda: collector.RetrieveContents([spec]))
        running = []
        for obj in result or []:
            props = {p.name: p.val for p in obj.propSet or []}
            owner = props.get("info.entity")
            if owner is not None and owner._moId == entity._moId and props.get("info.state") in busy:
                running.append(obj.obj._moId)
        if not running:
            return len(waited)
        waited.update(running)
        if time.monotonic() > deadline:
            raise TaskError(f"task(s) {', '.join(running)} still running on the target after {timeout:.0f} s")
        time.sleep(POLL_MAX)
