"""The one step contract: a `Step` names its targets' role and provides observe, plan and apply.

Every verb takes the step's *target*, the per-target desired state: a `DesiredHost` (role
"host"), a `DesiredVm` ("vm"), a `DesiredEsxi` (an ESXi shell, "esxi") or a `DesiredGuest` (a
guest OS, "guest"); each has a `.name`. SSH steps run commands through `ctx.cluster` (`remote.run`)
and never read the runbook. `Step[TargetT, FactT]` is generic over the target and the fact its
observe returns, so a type checker matches each step's verbs to one another.

- `wanted(target)`: whether the runbook asks this step of the target at all (default: yes).
- `observe(ctx, target) -> fact`: read the world. vSphere steps take their slice of the one bulk
  inventory read (and of the changes earlier steps planned: a VM powered off for new hardware is
  off when `vm.power` runs); SSH steps run commands, every target in parallel, before planning.
- `plan(target, fact) -> [Change]`: pure. Each change carries a typed action for `apply`.
- `apply(ctx, target, changes)`: carry out exactly those changes.
- `apply_all(ctx, changes_by_target, parallel) -> failures`: optional, for steps that order their
  targets themselves (build an image once, then ship it); failures by target name.
- `unread(target, fact) -> {other: Note}`: pure, for steps whose observe of one target reads others too
  (the Slurm controller reads its compute guests): each other target it could not read → a note on
  this target saying why and what is not planned for want of it. The plan counts the other target
  not observed (exit 3).

What the engine must know about a step is an attribute, never its name: `reboots_host` (its
changes reboot hosts: refused without --allow-host-reboot and the runbook's consent) and
`restarts_guest` (guest OSes are observed again after it changed their VM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from gpuvm.desired import DesiredHost, DesiredVm
from gpuvm.desired.slurm_nodes import SlurmNodes
from gpuvm.journal import Journal
from gpuvm.plan import Change, Note
from gpuvm.remote import Cluster
from gpuvm.vsphere.facts import HostFacts, Inventory, VmFacts
from gpuvm.vsphere.intent import IntentStore
from gpuvm.vsphere.session import Session

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
    drain_timeout: float | None = None  # how long a host reboot waits for the Slurm jobs on its nodes; None: not at all


Say = Callable[[str, str], None]  # a long step's progress: (target, status line)


@dataclass(frozen=True)
class WhileOff:
    """The engine's offer to a step that stops VMs (`host.reboot`): `run(vms)` carries out now, while
    they are off, what the VM steps named in `steps` planned on them (a hardware upgrade, new devices,
    settings that need the VM off), each change journalled and counted as that step's, never again
    later; it returns the VMs not fully changed (a change failed or was skipped), which stay off."""

    steps: frozenset[str]
    run: Callable[[list[str]], set[str]]


def quiet(target: str, status: str) -> None:
    """The progress of a step run without a listener (plan, tests)."""


def unannounced(target: str, error: Exception | None = None) -> None:
    """`Context.begin` and `Context.end` outside an engine run (plan, tests)."""


@dataclass
class Context:
    """What steps observe and apply through."""

    session: Session | None = None  # apply only
    inventory: Inventory = field(default_factory=Inventory)
    options: Options = field(default_factory=Options)
    cluster: Cluster | None = None  # when the runbook names SSH targets
    unreachable: dict[str, Exception] = field(default_factory=dict)  # SSH targets not observed at plan time → why
    planned: list[Change] = field(default_factory=list)  # what earlier steps planned (while planning)
    journal: Journal | None = None  # apply only: the history of what steps did
    intents: IntentStore | None = None  # apply only: what steps are about to do, recorded on the objects
    say: Say = quiet  # progress of a step that runs long (image build and ship): the engine's listener
    begin: Callable[[str], None] = unannounced  # a `begins_targets` step starts work on a target (journal, progress)
    end: Callable[[str, Exception | None], None] = unannounced  # ... and ends it (None: done)
    while_off: WhileOff | None = None  # apply only: VM changes made while a step has the VMs off
    slurm: SlurmNodes | None = None  # the runbook's Slurm cluster: host.reboot drains its VMs' nodes
    _planned_index: tuple[int, dict[str, list[Change]]] = field(default_factory=lambda: (0, {}), repr=False)

    def __post_init__(self) -> None:
        if self.intents is None and self.session is not None and self.journal is not None:
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


class Named(Protocol):
    """What every target is: named (a host, VM, ESXi shell or guest)."""

    @property
    def name(self) -> str: ...


TargetT = TypeVar("TargetT", bound=Named)
FactT = TypeVar("FactT")


def _always(target: object) -> bool:
    return True


def _reads_no_other(target: object, fact: object) -> dict[str, Note]:
    return {}


@dataclass(frozen=True)
class Step(Generic[TargetT, FactT]):
    name: str
    role: Role
    observe: Callable[[Context, TargetT], FactT]
    plan: Callable[[TargetT, FactT], list[Change]]
    apply: Callable[[Context, TargetT, list[Change]], None]
    wanted: Callable[[TargetT], bool] = _always
    apply_all: Callable[[Context, dict[str, list[Change]], int], dict[str, Exception]] | None = None
    reboots_host: bool = False
    restarts_guest: bool = False
    begins_targets: bool = False  # its apply_all calls ctx.begin and ctx.end as each target starts and ends (batches)
    unread: Callable[[TargetT, FactT], dict[str, Note]] = _reads_no_other  # other targets its observe could not read

    @property
    def over_ssh(self) -> bool:
        return self.role in SSH_ROLES


def present(vm: DesiredVm) -> bool:
    """The `wanted` of VM steps other than vm.lifecycle: a VM marked absent is only destroyed."""
    return vm.state == "present"


def host_facts(ctx: Context, host: DesiredHost) -> HostFacts:
    """The observe of host steps: the host's slice of the inventory."""
    return ctx.inventory.hosts[host.name]


def vm_facts(ctx: Context, vm: DesiredVm) -> VmFacts:
    """The observe of VM steps: the VM's slice of the inventory."""
    return ctx.inventory.vms[vm.name]
