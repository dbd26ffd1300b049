"""The one step contract: a `Step` names its targets' role and provides observe, plan and apply.

Every verb takes the step's *target*, the per-target desired state: a `DesiredHost` (role
"host"), a `DesiredVm` ("vm"), a `DesiredEsxi` (an ESXi shell, "esxi") or a `DesiredGuest` (a
guest OS, "guest"); each has a `.name`. SSH steps run commands through `ctx.cluster` (`remote.run`).

- `wanted(target)`: whether the runbook asks this step of the target at all (default: yes).
- `observe(ctx, target) -> fact`: read the world. vSphere steps take their slice of the one bulk
  inventory read (and of the changes earlier steps planned: a VM powered off for new hardware is
  off when `vm.power` runs); SSH steps run commands, every target in parallel, before planning.
- `plan(target, fact) -> [Change]`: pure. Each change carries a typed action for `apply`.
- `apply(ctx, target, changes)`: carry out exactly those changes.
- `apply_all(ctx, changes_by_target, parallel) -> failures`: optional, for steps that order their
  targets themselves (build an image once, then ship it); failures by target name.

What the engine must know about a step is an attribute, never its name: `reboots_host` (its
changes reboot hosts: refused without --allow-host-reboot and the runbook's consent) and
`restarts_guest` (guest OSes are observed again after it changed their VM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from gpuvm.plan import Change
from gpuvm.vsphere.facts import Inventory

Role = Literal["esxi", "host", "vm", "guest"]
SSH_ROLES = ("esxi", "guest")


@dataclass
class Options:
    allow_power_off: bool = False
    allow_host_reboot: bool = False
    shutdown_timeout: float = 300.0
    task_timeout: float = 1800.0
    guest_boot_timeout: float = 600.0  # after VMs power on, how long to wait for their SSH
    max_unavailable: int = 1  # hosts rebooted at once


Say = Callable[[str, str], None]  # a long step's progress: (target, status line)


def quiet(target: str, status: str) -> None:
    """The progress of a step run without a listener (plan, tests)."""


@dataclass
class Context:
    """What steps observe and apply through."""

    session: Any = None  # gpuvm.vsphere.session.Session (apply only)
    inventory: Inventory = field(default_factory=Inventory)
    options: Options = field(default_factory=Options)
    cluster: Any = None  # gpuvm.remote.Cluster, when the runbook names SSH targets
    unreachable: dict[str, str] = field(default_factory=dict)  # guests that did not answer at plan time
    planned: list[Change] = field(default_factory=list)  # what earlier steps planned (while planning)
    journal: Any = None  # gpuvm.journal.Journal (apply only): the history of what steps did
    intents: Any = None  # gpuvm.vsphere.intent.IntentStore (apply only): what steps are about to do, on the objects
    say: Say = quiet  # progress of a step that runs long (image build and ship): the engine's listener
    _planned_index: tuple[int, dict[str, list[Change]]] = field(default_factory=lambda: (0, {}), repr=False)

    def __post_init__(self) -> None:
        if self.intents is None and self.session is not None and self.journal is not None:
            from gpuvm.vsphere.intent import IntentStore

            self.intents = IntentStore(self.session, self.journal.run_id)

    def planned_on(self, target: str) -> list[Change]:
        """The changes earlier steps planned on one target (indexed once per step, not per target)."""
        size, index = self._planned_index
        if size != len(self.planned):
            index = {}
            for change in self.planned:
                index.setdefault(change.target, []).append(change)
            self._planned_index = (len(self.planned), index)
        return index.get(target, [])


def _always(target: Any) -> bool:
    return True


@dataclass(frozen=True)
class Step:
    name: str
    role: Role
    observe: Callable[[Context, Any], Any]
    plan: Callable[[Any, Any], list[Change]]
    apply: Callable[[Context, Any, list[Change]], None]
    wanted: Callable[[Any], bool] = _always
    apply_all: Callable[[Context, dict[str, list[Change]], int], dict[str, Exception]] | None = None
    reboots_host: bool = False
    restarts_guest: bool = False

    @property
    def over_ssh(self) -> bool:
        return self.role in SSH_ROLES


def present(vm: Any) -> bool:
    """The `wanted` of VM steps other than vm.lifecycle: a VM marked absent is only destroyed."""
    return vm.state == "present"


def host_facts(ctx: Context, host: Any) -> Any:
    """The observe of host steps: the host's slice of the inventory (`HostFacts`)."""
    return ctx.inventory.hosts[host.name]


def vm_facts(ctx: Context, vm: Any) -> Any:
    """The observe of VM steps: the VM's slice of the inventory (`VmFacts`)."""
    return ctx.inventory.vms[vm.name]
