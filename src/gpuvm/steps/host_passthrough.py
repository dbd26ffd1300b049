"""host.passthrough: enable PCI passthrough for the devices the runbook selects, and turn it off
again for devices gpuvm enabled that nothing uses any more (`DesiredHost.release`).

A change becomes active after a host reboot, unless the host can rebind devices without one
(`capability.deviceRebindWithoutRebootSupported`). Which devices gpuvm enabled is kept on the host
itself (`gpuvm.owned`, vsphere/owned.py), written before each call: a device enabled by hand is
never turned off, whichever machine or state directory runs gpuvm. A device gpuvm enabled and
now sees off (a reinstall reset it) is planned out of that record (`Forget`): turned on again by
hand later, it is not gpuvm's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.plan import Change, Disruption
from gpuvm.desired import DesiredHost
from gpuvm.steps.base import Context, Step, host_facts
from gpuvm.vsphere.facts import HostFacts
from gpuvm.vsphere.owned import Owned, OwnedStore
from gpuvm.vsphere.tasks import call

NAME = "host.passthrough"
ON, OFF = "active", "off"  # the changes' `after`


@dataclass(frozen=True)
class SetPassthrough:
    address: str
    enabled: bool
    apply_now: bool  # the host rebinds the device without a reboot


@dataclass(frozen=True)
class Forget:
    """gpuvm's record that it enabled `address` is dropped: the device was seen off."""

    address: str


def resource(address: str, device_name: str) -> str:
    return f"pci {address} ({device_name})"


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
    for address in host.forget:
        device = facts.device(address)
        assert device is not None  # resolve found it
        changes.append(Change(NAME, host.name, resource(address, device.device_name), "owner", "gpuvm",
                              f"none (seen {device.passthru_state})", Disruption.NONE, Forget(address)))
    return changes


def passthru_config(changes: list[Change]) -> list[object]:
    from pyVmomi import vim

    return [vim.host.PciPassthruConfig(id=c.action.address, passthruEnabled=c.action.enabled,
                                       applyNow=c.action.apply_now)
            for c in changes if isinstance(c.action, SetPassthrough)]


def owned_after(owned: Owned, changes: list[Change], facts: HostFacts) -> Owned:
    """The host's `gpuvm.owned` record once `changes` are made: devices enabled join "passthrough",
    devices turned off move to "released" (until the reboot), forgotten ones leave; "released"
    keeps only devices still waiting for their reboot."""
    mine, released = dict.fromkeys(owned.passthrough), dict.fromkeys(owned.released)
    for address in list(released):
        device = facts.device(address)
        if device is None or device.passthru_enabled or not device.passthru_active:
            del released[address]
    for change in changes:
        action = change.action
        if isinstance(action, SetPassthrough):
            (mine if action.enabled else released)[action.address] = None
            (released if action.enabled else mine).pop(action.address, None)
        elif isinstance(action, Forget):
            mine.pop(action.address, None)
    return Owned(passthrough=list(mine), released=list(released))


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    config = passthru_config(changes)
    facts = ctx.inventory.hosts[host.name]
    if config or any(isinstance(c.action, Forget) for c in changes):  # recorded before the act
        run = ctx.journal.run_id if ctx.journal is not None else "0" * 12  # no journal: the step tested alone
        OwnedStore(ctx.session, run).edit(ctx.session.ref("HostSystem", facts.moid), "record passthrough gpuvm owns",
                                          lambda owned: owned_after(owned, changes, facts))
    if not config:
        return  # only pending activations (the reboot step activates them) or records
    system = ctx.session.ref("host.PciPassthruSystem", facts.passthru_system)
    call("UpdatePassthruConfig", lambda: system.UpdatePassthruConfig(config))


STEP = Step(NAME, "host", host_facts, plan, apply)
