"""host.graphics: the graphics type of the host and of each GPU it shares ("Shared Direct" for NVIDIA vGPU).

Both the host default (`hostDefaultGraphicsType`) and each shared GPU's own type (`deviceType`, so
that a per-device override left from before cannot keep a GPU out of vGPU) are configured. What a
GPU runs changes only when the host's graphics services restart, i.e. at the host reboot: until
then `config.graphicsInfo[].graphicsType` still shows the old type, and the plan shows the GPU as
pending a reboot. GPUs passed through after the reboot are left alone (they run `direct`). The host's
shared-passthrough assignment policy is kept as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.plan import Change, Disruption
from gpuvm.desired import DesiredHost
from gpuvm.steps.base import Context, Step, host_facts
from gpuvm.vsphere.facts import HostFacts
from gpuvm.vsphere.tasks import call

NAME = "host.graphics"


@dataclass(frozen=True)
class SetGraphics:
    default_type: str  # shared | sharedDirect
    devices: tuple[tuple[str, str], ...]  # (PCI id, type) per GPU, those the host has configured included
    assignment_policy: str


def _shared_gpus(host: DesiredHost, facts: HostFacts) -> list[str]:
    """The GPUs that run graphics after the reboot: not passed through then (by the runbook, or
    enabled by hand and left so)."""
    return [g.id for g in facts.gpus
            if g.id not in host.passthrough and (g.id in host.release or not g.passthru_enabled)]


def plan(host: DesiredHost, facts: HostFacts) -> list[Change]:
    want, graphics = host.graphics, facts.graphics
    if not want:
        return []
    gpus = _shared_gpus(host, facts)
    devices = graphics.devices | {g: want for g in gpus}
    action = SetGraphics(want, tuple(sorted(devices.items())), graphics.assignment_policy)
    changes = []
    if graphics.default_type != want:
        changes.append(Change(NAME, host.name, "graphics", "hostDefaultGraphicsType", graphics.default_type, want,
                              Disruption.HOST_REBOOT, action))
    for gpu in gpus:
        configured, running = graphics.configured(gpu), graphics.running.get(gpu)
        if graphics.devices.get(gpu) != want:  # not set on the device itself
            changes.append(Change(NAME, host.name, f"GPU {gpu}", "graphicsType (configured)",
                                  graphics.devices.get(gpu, f"{configured} (host default)"), want,
                                  Disruption.HOST_REBOOT if configured != want else Disruption.NONE, action))
        if configured == want and running is not None and running != want:  # set before, awaiting the reboot
            changes.append(Change(NAME, host.name, f"GPU {gpu}", "graphicsType", running, want,
                                  Disruption.HOST_REBOOT))
    return changes


def graphics_config(action: SetGraphics) -> object:
    from pyVmomi import vim

    devices = [vim.host.GraphicsConfig.DeviceType(deviceId=g, graphicsType=t) for g, t in action.devices]
    return vim.host.GraphicsConfig(hostDefaultGraphicsType=action.default_type, deviceType=devices,
                                   sharedPassthruAssignmentPolicy=action.assignment_policy)


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    action = next((c.action for c in changes if isinstance(c.action, SetGraphics)), None)
    if action is None:
        return  # only GPUs waiting for the reboot: the reboot step restarts them
    manager = ctx.session.ref("host.GraphicsManager", ctx.inventory.hosts[host.name].graphics_manager)
    config = graphics_config(action)
    call("UpdateGraphicsConfig", lambda: manager.UpdateGraphicsConfig(config))


STEP = Step(NAME, "host", host_facts, plan, apply)
