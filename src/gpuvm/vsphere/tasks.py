"""vSphere tasks and faults, turned into gpuvm's errors naming the target and step."""

from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from gpuvm.errors import TaskError
from gpuvm.secrets import redact

T = TypeVar("T")

POLL_START, POLL_MAX = 0.05, 0.5
POLL_PATIENCE = 5.0  # seconds after the latest task began, polled every POLL_START; then every POLL_MAX


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
    """Wait for a task (polled with every other task this process waits for: `TaskWatcher`); a
    failed task raises TaskError."""
    from pyVmomi import vim

    info = call(action, lambda: TaskWatcher.of(task._stub).wait(task, timeout))
    if info is None:
        raise TaskError(f"{action} did not finish within {timeout:.0f} s (task {task._moId})")
    if info.state == vim.TaskInfo.State.error:
        raise TaskError(f"{action} failed: {fault_text(info.error)}")
    return info.result


class TaskWatcher:
    """Every task waited for over one vCenter connection, polled together: one request a poll (the
    states), however many tasks run, and one for the whole info of those that ended (64 VMs
    reconfigured at once: about 20 requests a second of waiting, not 64 polls each). Each task's
    end is seen within POLL_START of it while tasks are young, within POLL_MAX once all have run for
    POLL_PATIENCE seconds."""

    _registry = threading.Lock()

    @classmethod
    def of(cls, stub: Any) -> "TaskWatcher":
        """The connection's watcher (kept on pyVmomi's stub: it lives as long as the connection)."""
        with cls._registry:
            if getattr(stub, "_gpuvm_task_watcher", None) is None:
                stub._gpuvm_task_watcher = cls(stub)
            return stub._gpuvm_task_watcher

    def __init__(self, stub: Any):
        self._stub = stub
        self._changed = threading.Condition()
        self._waiting: dict[str, tuple[Any, float]] = {}  # task moid → (task, when its wait began)
        self._ended: dict[str, Any] = {}  # task moid → its TaskInfo, or the error that hid it
        self._polling = False
        self._poller: threading.Thread | None = None
        self._property_collector: Any = None

    def wait(self, task: Any, timeout: float) -> Any:
        """The task's TaskInfo once it succeeded or failed; None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._waiting[task._moId] = (task, time.monotonic())
            if not self._polling:
                self._polling = True
                self._poller = threading.Thread(target=self._poll, name="gpuvm-tasks", daemon=True)
                self._poller.start()
            while task._moId not in self._ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._waiting.pop(task._moId, None)
                    return None
                self._changed.wait(min(left, POLL_MAX))
            ended = self._ended.pop(task._moId)
        if isinstance(ended, BaseException):
            raise ended
        return ended

    def _poll(self) -> None:
        while True:
            with self._changed:
                if not self._waiting:
                    self._polling = False
                    return
                tasks = dict(self._waiting)
            try:
                infos = self._read({moid: task for moid, (task, _) in tasks.items()})
            except Exception as error:  # a fault or a lost connection: every waiter hears of it
                infos = {moid: error for moid in tasks}
            with self._changed:
                for moid, info in infos.items():  # ended tasks (or the error that hid them)
                    if self._waiting.pop(moid, None) is not None:
                        self._ended[moid] = info
                self._changed.notify_all()
                if not self._waiting:  # stop now: the next task waited for starts a poller of its own,
                    self._polling = False  # not one asleep for POLL_MAX after the last task ended
                    return
                youngest = max(began for _, began in self._waiting.values())
            time.sleep(POLL_START if time.monotonic() - youngest < POLL_PATIENCE else POLL_MAX)

    def _read(self, tasks: dict[str, Any]) -> dict[str, Any]:
        """The TaskInfo of every task that ended: each poll reads every task's state (a few bytes
        each), then the whole `info` of those that ended only."""
        states = self._properties(tasks, "info.state")
        ended = {moid: task for moid, task in tasks.items() if states.get(moid) in ("success", "error")}
        return self._properties(ended, "info") if ended else {}

    def _properties(self, tasks: dict[str, Any], path: str) -> dict[str, Any]:
        """One property of every task, in one RetrievePropertiesEx (and its pages)."""
        from pyVmomi import vim, vmodl

        collector = self._collector()
        spec = vmodl.query.PropertyCollector.FilterSpec(
            objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=task) for task in tasks.values()],
            propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.Task, pathSet=[path])])
        result = collector.RetrievePropertiesEx([spec], vmodl.query.PropertyCollector.RetrieveOptions())
        values: dict[str, Any] = {}
        while result is not None:
            for obj in result.objects:
                for missing in obj.missingSet or []:
                    raise missing.fault  # e.g. NotAuthenticated where a simulator answers per property
                values.update((obj.obj._moId, prop.val) for prop in obj.propSet or [] if prop.name == path)
            if not result.token:
                break
            result = collector.ContinueRetrievePropertiesEx(token=result.token)
        return values

    def _collector(self) -> Any:
        if self._property_collector is None:
            from pyVmomi import vim

            content = vim.ServiceInstance("ServiceInstance", self._stub).RetrieveContent()
            self._property_collector = content.propertyCollector
        return self._property_collector


def run_task(action: str, start: Callable[[], Any], timeout: float = 1800) -> Any:
    task = call(action, start)
    return wait(task, action, timeout)


def wait_for_other_tasks(session: Any, entity: Any, timeout: float = 1800) -> int:
    """Wait until no task runs on `entity` (e.g. one a killed gpuvm run left behind), so that a
    reconfiguration is never stacked on top of an unfinished one. One read of vCenter's recent tasks
    per poll, shared by every target asking while it is under way (`_running_tasks`). Returns how
    many tasks were waited for. (The reconfiguration carries the changeVersion it checked, so a task
    begun after the read cannot double a device either.)"""
    deadline = time.monotonic() + timeout
    waited: set[str] = set()
    while True:
        running = call("read running tasks", lambda: _running_tasks(session)).get(entity._moId, [])
        if not running:
            return len(waited)
        waited.update(busy.task for busy in running)
        if time.monotonic() > deadline:
            raise TaskError(f"task(s) {', '.join(map(str, running))} still running on the target after {timeout:.0f} s")
        time.sleep(POLL_MAX)


@dataclass(frozen=True)
class Busy:
    """A task queued or running in vCenter."""

    task: str  # its moid
    kind: str  # its descriptionId, e.g. VirtualMachine.reconfigure
    entity: Any  # the managed object it runs on

    def __str__(self) -> str:
        return f"{self.kind} ({self.task})"


_reads: "weakref.WeakKeyDictionary[Any, _SharedRead]" = weakref.WeakKeyDictionary()
_reads_lock = threading.Lock()


def _running_tasks(session: Any) -> dict[str, list[Busy]]:
    """The queued or running tasks among vCenter's recent ones (up to 200), by the moid of the
    entity they run on. 64 VMs reconfigured at once asked for them 64 times over 1.7 s; now the
    targets that ask while a read is under way share it."""
    with _reads_lock:
        if session not in _reads:
            _reads[session] = _SharedRead(lambda: read_running_tasks(session))
        read = _reads[session]
    return read()


def read_running_tasks(session: Any) -> dict[str, list[Busy]]:
    """One request: the traversal from the TaskManager's `recentTask` and the tasks' states, kinds and
    entities, read together."""
    from pyVmomi import vim, vmodl

    traverse = vmodl.query.PropertyCollector.TraversalSpec(name="recent", path="recentTask", skip=False,
                                                           type=vim.TaskManager)
    spec = vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=session.content.taskManager, skip=True,
                                                            selectSet=[traverse])],
        propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.Task, pathSet=["info.entity", "info.state", "info.descriptionId"])])
    busy = {vim.TaskInfo.State.queued, vim.TaskInfo.State.running}
    running: dict[str, list[Busy]] = {}
    for obj in session.call(session.content.propertyCollector, "RetrieveContents", [spec]) or []:  # lxml
        props = {p.name: p.val for p in obj.propSet or []}
        owner = props.get("info.entity")
        if owner is not None and props.get("info.state") in busy:
            kind = str(props.get("info.descriptionId") or "a task")
            running.setdefault(owner._moId, []).append(Busy(obj.obj._moId, kind, owner))
    return running


class _SharedRead:
    """Calls `read` for whoever asks first; those who ask while it runs get its answer (or error)."""

    def __init__(self, read: Callable[[], T]):
        self._read = read
        self._lock = threading.Lock()
        self._under_way: Future | None = None

    def __call__(self) -> T:
        with self._lock:
            future, first = self._under_way, self._under_way is None
            if first:
                future = self._under_way = Future()
        assert future is not None
        if first:
            try:
                future.set_result(self._read())
            except BaseException as error:
                future.set_exception(error)
            finally:
                with self._lock:
                    self._under_way = None
        return future.result()
