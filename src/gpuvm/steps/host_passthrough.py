"""host.passthrough: enable PCI passthrough for the devices the runbook selects.

A newly enabled device becomes active after a host reboot, unless the host can rebind devices
without one (`capability.deviceRebindWithoutRebootSupported`).
"""

from __future__ import annotations

from gpuvm.plan import Change, Disruption
from gpuvm.resolve import Desired
from gpuvm.steps.base import ApplyContext
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.tasks import call

NAME = "host.passthrough"


def plan(desired: Desired, inventory: Inventory, prior: list[Change]) -> list[Change]:
    changes = []
    for host in desired.hosts.values():
        facts = inventory.hosts[host.name]
        reboot = Disruption.NONE if facts.rebind_without_reboot else Disruption.HOST_REBOOT
        for address in host.passthrough:
            device = facts.device(address)
            assert device is not None  # resolve checked it
            resource = f"pci {address} ({device.device_name})"
            if not device.passthru_enabled:
                changes.append(Change(NAME, host.name, resource, "passthrough", device.passthru_state, "active",
                                      reboot, spec={"address": address, "enable": True}))
            elif not device.passthru_active:
                changes.append(Change(NAME, host.name, resource, "passthrough", device.passthru_state, "active",
                                      Disruption.HOST_REBOOT, spec={"address": address}))
    return changes


def apply(ctx: ApplyContext, target: str, changes: list[Change]) -> None:
    from pyVmomi import vim

    enable = [c.spec["address"] for c in changes if c.spec.get("enable")]
    if not enable:
        return  # only pending activations: the reboot step activates them
    facts = ctx.inventory.hosts[target]
    system = ctx.session.ref("host.PciPassthruSystem", facts.passthru_system)
    config = [vim.host.PciPassthruConfig(id=a, passthruEnabled=True, applyNow=facts.rebind_without_reboot)
              for a in enable]
    call(target, NAME, "UpdatePassthruConfig", lambda: system.UpdatePassthruConfig(config))


class HostPassthroughStep:
    name, scope = NAME, "host"
    plan = staticmethod(plan)
    apply = staticmethod(apply)
