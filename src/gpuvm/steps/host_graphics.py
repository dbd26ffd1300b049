"""host.graphics: the host's default graphics type ("Shared Direct" is required for NVIDIA vGPU)."""

from __future__ import annotations

from gpuvm.plan import Change, Disruption
from gpuvm.resolve import Desired
from gpuvm.steps.base import ApplyContext
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.tasks import call

NAME = "host.graphics"
POLICY = "performance"


def plan(desired: Desired, inventory: Inventory, prior: list[Change]) -> list[Change]:
    changes = []
    for host in desired.hosts.values():
        facts = inventory.hosts[host.name]
        if host.graphics and facts.graphics.default_type != host.graphics:
            # The new mode is used once the host's graphics services restart: a reboot.
            changes.append(Change(NAME, host.name, "graphics", "hostDefaultGraphicsType",
                                  facts.graphics.default_type, host.graphics, Disruption.HOST_REBOOT,
                                  spec={"type": host.graphics}))
    return changes


def apply(ctx: ApplyContext, target: str, changes: list[Change]) -> None:
    from pyVmomi import vim

    facts = ctx.inventory.hosts[target]
    manager = ctx.session.ref("host.GraphicsManager", facts.graphics_manager)
    config = vim.host.GraphicsConfig(hostDefaultGraphicsType=changes[-1].spec["type"],
                                     sharedPassthruAssignmentPolicy=POLICY)
    call(target, NAME, "UpdateGraphicsConfig", lambda: manager.UpdateGraphicsConfig(config))


class HostGraphicsStep:
    name, scope = NAME, "host"
    plan = staticmethod(plan)
    apply = staticmethod(apply)
