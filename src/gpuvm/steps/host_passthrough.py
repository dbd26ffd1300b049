"""host.passthrough: enable PCI passthrough for the devices the runbook selects, and turn it off
again for devices gpuvm enabled that nothing uses any more (`DesiredHost.release`).

A change becomes active after a host reboot, unless the host can rebind devices without one
(`capability.deviceRebindWithoutRebootSupported`). Which devices gpuvm enabled is read from the
journal (`set_by_gpuvm`): a device enabled by hand, or from another state directory, is never
turned off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuvm.plan import Change, Disruption
from gpuvm.resolve import DesiredHost
from gpuvm.steps.base import Context, Step, host_facts
from gpuvm.vsphere.facts import HostFacts
from gpuvm.vsphere.tasks import call

NAME = "host.passthrough"
ON, OFF = "active", "off"  # the changes' `after`: what the journal reads back


@dataclass(frozen=True)
class SetPassthrough:
    address: str
    enabled: bool
    apply_now: bool  # the host rebinds the device without a reboot


def resource(address: str, device_name: str) -> str:
    return f"pci {address} ({device_name})"


def set_by_gpuvm(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Host → PCI address → the passthrough state (ON or OFF) gpuvm set last, from the journal's
    done changes (oldest first)."""
    last: dict[str, dict[str, str]] = {}
    for entry in entries:
        words = str(entry.get("resource", "")).split()
        if (entry.get("step") == NAME and entry.get("status") == "done" and entry.get("after") in (ON, OFF)
                and len(words) > 1 and words[0] == "pci"):
            last.setdefault(str(entry.get("target")), {})[words[1]] = str(entry["after"])
    return last


def plan(host: DesiredHost, facts: HostFacts) -> list[Change]:
    changes = []
    reboot = Disruption.NONE if facts.rebind_without_reboot else Disruption.HOST_REBOOT
    for address in host.passthrough:
        device = facts.device(address)
        assert device is not None  # resolve checked it
        name = resource(address, device.device_name)
        if not device.passthru_enabled:
            changes.append(Change(NAME, host.name, name, "passthrough", device.passthru_state, ON,
                                  reboot, SetPassthrough(address, True, facts.rebind_without_reboot)))
        elif not device.passthru_active:  # enabled before: the reboot step activates it
            changes.append(Change(NAME, host.name, name, "passthrough", device.passthru_state, ON,
                                  Disruption.HOST_REBOOT))
    for address in host.release:
        device = facts.device(address)
        assert device is not None  # resolve found it
        name = resource(address, device.device_name)
        if device.passthru_enabled:
            changes.append(Change(NAME, host.name, name, "passthrough", device.passthru_state, OFF, reboot,
                                  SetPassthrough(address, False, facts.rebind_without_reboot)))
        elif device.passthru_active:  # turned off before: the reboot step releases it
            changes.append(Change(NAME, host.name, name, "passthrough", device.passthru_state, OFF,
                                  Disruption.HOST_REBOOT))
    return changes


def passthru_config(changes: list[Change]) -> list[object]:
    from pyVmomi import vim

    return [vim.host.PciPassthruConfig(id=c.action.address, passthruEnabled=c.action.enabled,
                                       applyNow=c.action.apply_now)
            for c in changes if isinstance(c.action, SetPassthrough)]


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    config = passthru_config(changes)
    if not config:
        return  # only pending activations: the reboot step activates them
    system = ctx.session.ref("host.PciPassthruSystem", ctx.inventory.hosts[host.name].passthru_system)
    call("UpdatePassthruConfig", lambda: system.UpdatePassthruConfig(config))


STEP = Step(NAME, "host", host_facts, plan, apply)
