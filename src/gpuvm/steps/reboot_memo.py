"""The reboot memo: what gpuvm rebooted a host for, kept on the host, so that a setting a reboot does
not activate is not rebooted for again and again (issue 21, item 4).

After `host.reboot` rebooted a host for the changes waiting on it (on the host, its ESXi shell, the
guests of its VMs), the memo is recorded on the host as the intent act "rebooted": those changes'
identities (digests of step, target, resource with field, and with the wanted value) and the host's
boot time after the reboot; `why` names the first few for people reading the attribute. A
change still pending on the next plan, with the host not rebooted since (same boot time), is one
that reboot did not activate (a ConnectX setting a warm reboot does not apply, a missing vGPU
manager, a kernel option ESXi does not take; or a guest that lies): planning another reboot for it
would power off every VM on the host on every apply. The plan says so (a note at error level) and
`apply` refuses up front, exit 4, unless --allow-repeat-reboot; with it the host reboots again and
the memo is replaced. An apply that finds nothing waiting on the host any more clears the memo.

A pending change matches a memo entry of the same step, target and resource when the field or the
wanted value is the same: the half a step configured before the reboot ("ATS_ENABLED", "configured")
and the running half still pending after it ("ATS_ENABLED (current)", "runtime") are one setting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuvm.errors import MAX_LINES, TaskError, listed
from gpuvm.names import vsphere_name
from gpuvm.plan import Change, Disruption, Note, Plan
from gpuvm.vsphere.facts import HostFacts, Inventory
from gpuvm.vsphere.intent import Intent
from gpuvm.vsphere.records import DIGEST, MAX_REMEMBERED, REBOOTED
from gpuvm.vsphere.inventory import boot_time
from gpuvm.vsphere.tasks import call

ACT = REBOOTED
REBOOT_STEP = "host.reboot"
FLAG = "--allow-repeat-reboot"
# DIGEST: hex characters of each key, 48 bits, no two settings of one host alike; MAX_REMEMBERED: changes
# a memo names (~6,000 characters), those past it may be rebooted for once more (records.RebootedData)


class RepeatedReboot(TaskError):
    """A change is still pending after gpuvm rebooted its host for it: not rebooted for again without
    --allow-repeat-reboot. Nothing was touched."""


def identity(change: Change) -> list[str]:
    """What names a waiting change in the memo, compactly (a host's custom attribute holds every
    act, at most records.MAX_CHARS characters): digests of its setting with its field, and with the
    value it wants; a change matches a memo entry when either digest is the same. The target by its
    name in vCenter (the memo is on a host of one vCenter): the same whether a runbook shows it as
    `east/esx-01` or `esx-01`."""
    setting = (change.step, vsphere_name(change.target), change.resource)
    return [_digest(*setting, "field", change.field), _digest(*setting, "after", change.after)]


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:DIGEST]


def by_target(changes: Iterable[Change]) -> dict[str, list[Change]]:
    """The changes that wait for a host reboot, by target (indexed once: a plan may hold 100,000 changes)."""
    index: dict[str, list[Change]] = {}
    for change in changes:
        if change.disruption == Disruption.HOST_REBOOT and change.step != REBOOT_STEP:
            index.setdefault(change.target, []).append(change)
    return index


def waiting_on(host: str, index: dict[str, list[Change]], inventory: Inventory) -> list[Change]:
    """The changes that wait for `host`'s reboot (`index`: `by_target`): on the host (or its ESXi
    shell), or on a VM on it (or its guest, named after its VM), as `host.reboot` finds them."""
    return [c for name in [host] + [vm.name for vm in inventory.vms_on(host)] for c in index.get(name, [])]


def still_pending(facts: HostFacts, waiting: Iterable[Change]) -> list[Change]:
    """The pending changes among `waiting` that gpuvm rebooted the host for, the host not rebooted since
    (the memo read strictly: `records.RebootedData`, its changes lists of digests)."""
    memo = facts.intents.get(ACT)
    if memo is None or not facts.booted or memo.data["booted"] != facts.booted:
        return []
    known = {key for entry in memo.data["changes"] for key in entry}
    return [c for c in waiting if c.pending and known.intersection(identity(c))]


@dataclass(frozen=True)
class Repeat:
    """A host whose planned reboot would be for changes its last gpuvm reboot did not activate."""

    host: str
    memo: Intent
    changes: list[Change]

    def message(self) -> str:
        settings = "; ".join(f"{c.field} of {c.resource} on {c.target} ({c.step})" for c in self.changes[:3])
        more = f" and {len(self.changes) - 3} more" if len(self.changes) > 3 else ""
        return (f"host {self.host}: {settings}{more} still pending after gpuvm rebooted the host for it "
                f"(run {self.memo.run} at {self.memo.since}): a reboot does not apply it (a warm reboot that does "
                f"not reset the device? a missing driver?); pass {FLAG} to reboot again")


def repeats(changes: list[Change], inventory: Inventory) -> list[Repeat]:
    """Every host the plan reboots for a change still pending after gpuvm's last reboot of it."""
    hosts = dict.fromkeys(c.target for c in changes if c.step == REBOOT_STEP and c.disruption == Disruption.HOST_REBOOT
                          and c.target in inventory.hosts and ACT in inventory.hosts[c.target].intents)
    found = []
    index = by_target(changes) if hosts else {}
    for host in hosts:
        facts = inventory.hosts[host]
        if again := still_pending(facts, waiting_on(host, index, inventory)):
            found.append(Repeat(host, facts.intents[ACT], again))
    return found


def notes(found: list[Repeat]) -> list[Note]:
    """What `plan` and `verify` show: one error-level note per host."""
    return [Note(r.host, REBOOT_STEP, r.message() + f" (apply refuses without {FLAG})", level="error") for r in found]


def refused_in(plan: Plan) -> list[str]:
    """What `apply` of this plan refuses without FLAG, read from the notes `notes` put on it: one
    line per host (a caller that has the plan, not the inventory: `bench run`'s preflight)."""
    suffix = f" (apply refuses without {FLAG})"
    return [f"{n.message.removesuffix(suffix)}" for n in plan.notes
            if n.step == REBOOT_STEP and n.level == "error" and n.message.endswith(suffix)]


def refuse(found: list[Repeat], allow: bool) -> None:
    """Stop `apply` before anything is touched, unless the user allowed a repeated reboot."""
    if found and not allow:
        lines = [r.message() for r in found[:MAX_LINES]]
        if len(found) > MAX_LINES:
            lines.append(f"… and {len(found) - MAX_LINES:,} more host(s) (plan lists every one)")
        raise RepeatedReboot(f"refusing to reboot {listed(r.host for r in found)} again; nothing was changed:\n  "
                             + "\n  ".join(lines))


def remember(ctx: Any, host: str) -> None:
    """Record, once the host is back from gpuvm's reboot, what it rebooted for and its new boot time."""
    if ctx.intents is None:
        return
    ref = ctx.session.ref("HostSystem", ctx.inventory.hosts[host].moid)
    booted = boot_time(call("read boot time", lambda: ref.runtime.bootTime))
    index = by_target(c for name in [host] + [vm.name for vm in ctx.inventory.vms_on(host)]
                      for c in ctx.planned_on(name))  # the plan's own index: hosts reboot in parallel
    waiting = waiting_on(host, index, ctx.inventory)
    ctx.intents.record(ref, ACT, _shown(f"rebooted for {len(waiting)} change(s): ", waiting), booted=booted,
                       changes=[identity(c) for c in waiting[:MAX_REMEMBERED]])


def _shown(lead: str, changes: list[Change], limit: int = 200) -> str:
    """What a reboot was for, for people reading the memo: each setting on each target once, with the
    devices it is wanted on ("passthrough of pci 0000:3b:00.0, pci 0000:5e:00.0 on esx-01; mig.mode of GPU 0
    on esx-01"), cut at `limit` characters."""
    devices: dict[tuple[str, str], list[str]] = {}
    for change in changes:
        named = devices.setdefault((change.field, change.target), [])
        if (device := change.resource.split(" (")[0]) not in named:  # the device, not its long name
            named.append(device)
    text = lead + "; ".join(f"{field} of {', '.join(named)} on {target}" for (field, target), named in devices.items())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def settle(store: Any, session: Any, changes: list[Change], inventory: Inventory, hosts: Iterable[str]) -> None:
    """Clear the memo of the `hosts` (planned whole, every guest observed) on which nothing waits any more."""
    remembered = [h for h in hosts if h in inventory.hosts and ACT in inventory.hosts[h].intents]
    index = by_target(changes) if remembered else {}
    for host in remembered:
        if not waiting_on(host, index, inventory):
            store.clear(session.ref("HostSystem", inventory.hosts[host].moid), ACT)


