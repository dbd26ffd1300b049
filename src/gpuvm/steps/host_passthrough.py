"""host.passthrough: enable PCI passthrough for the devices the runbook selects.

A newly enabled device becomes active after a host reboot, unless the host can rebind devices
without one (`capability.deviceRebindWithoutRebootSupported`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.plan import Change, Disruption
from gpuvm.resolve import DesiredHost
from gpuvm.steps.base import Context, Step, host_facts
from gpuvm.vsphere.facts import HostFacts
from gpuvm.vsphere.tasks import call

NAME = "host.passthrough"


@dataclass(frozen=True)
class EnablePassthrough:
    address: str
    apply_now: bool  # the host rebinds the device without a reboot


def plan(host: DesiredHost, facts: HostFacts) -> list[Change]:
    changes = []
    reboot = Disruption.NONE if facts.rebind_without_reboot else Disruption.HOST_REBOOT
    for address in host.passthrough:
        device = facts.device(address)
        assert device is not None  # resolve checked it
        resource = f"pci {address} ({device.device_name})"
        if not device.passthru_enabled:
            changes.append(Change(NAME, host.name, resource, "passthrough", device.passthru_state, "active",
                                  reboot, EnablePassthrough(address, facts.rebind_without_reboot)))
        elif not device.passthru_active:  # enabled before: the reboot step activates it
            changes.append(Change(NAME, host.name, resource, "passthrough", device.passthru_state, "active",
                                  Disruption.HOST_REBOOT))
    return changes


def passthru_config(changes: list[Change]) -> list[object]:
    from pyVmomi import vim

    return [vim.host.PciPassthruConfig(id=c.action.address, passthruEnabled=True, applyNow=c.action.apply_now)
            for c in changes if isinstance(c.action, EnablePassthrough)]


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    config = passthru_config(changes)
    if not config:
        return  # only pending activations: the reboot step activates them
    system = ctx.session.ref("host.PciPassthruSystem", ctx.inventory.hosts[host.name].passthru_system)
    call("UpdatePassthruConfig", lambda: system.UpdatePassthruConfig(config))


STEP = Step(NAME, "host", host_facts, plan, apply)
