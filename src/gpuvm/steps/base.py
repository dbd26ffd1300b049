"""What every step is: observe (facts), plan (pure: desired + facts → changes), apply (those changes).

vSphere steps observe through the one bulk inventory read the engine makes; their `plan` is a pure
function of the resolved desired state, the inventory and the changes earlier steps planned (a
VM powered off for new hardware must be powered on again by the power step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gpuvm.plan import Change
from gpuvm.resolve import Desired
from gpuvm.vsphere.facts import Inventory


@dataclass
class Options:
    allow_power_off: bool = False
    allow_host_reboot: bool = False
    shutdown_timeout: float = 300.0
    task_timeout: float = 1800.0
    guest_boot_timeout: float = 600.0  # after VMs power on, how long to wait for their SSH


@dataclass
class ApplyContext:
    session: Any  # gpuvm.vsphere.session.Session
    inventory: Inventory
    options: Options = field(default_factory=Options)
    cluster: Any = None  # gpuvm.remote.Cluster, when the runbook names SSH targets
    unreachable: dict[str, str] = field(default_factory=dict)  # guests that did not answer at plan time


class Step(Protocol):
    name: str
    scope: Literal["host", "vm"]

    def plan(self, desired: Desired, inventory: Inventory, prior: list[Change]) -> list[Change]: ...

    def apply(self, ctx: ApplyContext, target: str, changes: list[Change]) -> None: ...
