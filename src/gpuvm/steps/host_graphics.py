"""host.graphics: the host's default graphics type ("Shared Direct" is required for NVIDIA vGPU)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.plan import Change, Disruption
from gpuvm.resolve import DesiredHost
from gpuvm.steps.base import Context, Step, host_facts
from gpuvm.vsphere.facts import HostFacts
from gpuvm.vsphere.tasks import call

NAME = "host.graphics"
POLICY = "performance"


@dataclass(frozen=True)
class SetDefaultGraphics:
    graphics_type: str  # shared | sharedDirect


def plan(host: DesiredHost, facts: HostFacts) -> list[Change]:
    if not host.graphics or facts.graphics.default_type == host.graphics:
        return []
    # The new mode is used once the host's graphics services restart: a reboot.
    return [Change(NAME, host.name, "graphics", "hostDefaultGraphicsType", facts.graphics.default_type,
                   host.graphics, Disruption.HOST_REBOOT, SetDefaultGraphics(host.graphics))]


def graphics_config(action: SetDefaultGraphics) -> object:
    from pyVmomi import vim

    return vim.host.GraphicsConfig(hostDefaultGraphicsType=action.graphics_type, sharedPassthruAssignmentPolicy=POLICY)


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    manager = ctx.session.ref("host.GraphicsManager", ctx.inventory.hosts[host.name].graphics_manager)
    config = graphics_config(changes[-1].action)
    call("UpdateGraphicsConfig", lambda: manager.UpdateGraphicsConfig(config))


STEP = Step(NAME, "host", host_facts, plan, apply)
