"""Outstanding intent: what gpuvm runs recorded on the runbook's hosts and VMs (and the VMs on its
hosts) before a disruptive act and never cleared — a run was killed, or could not undo what it did.

`plan` lists each as a note, `verify` as drift: until an `apply` finishes or undoes the act, the
world is not what the runbook says, even where every setting matches (a host still held in
maintenance mode, a VM still owed its power-on). The records themselves live on the vCenter objects
(`gpuvm.vsphere.intent`).

What gpuvm's attributes hold that gpuvm did not write (`records.Foreign`: on any host, VM or template
of the vCenter, runbook's or not, and the root folder's leases and locks) is no unfinished act: no
`apply` finishes or undoes it. `plan` and `verify` show each as a warning naming the object, the
attribute and the command that clears it; `verify` does not count it as drift (exit 0 when nothing
else differs), since gpuvm never acts on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuvm.plan import Note
from gpuvm.steps import reboot_memo
from gpuvm.vsphere.facts import Inventory

STEP = "intent"  # the notes' step
FOREIGN = "foreign"  # the step of the notes on values gpuvm did not write
MEMOS = frozenset({reboot_memo.ACT})  # records kept on purpose once the act is done (the reboot a change had): not unfinished


def outstanding(inventory: Inventory, hosts: Iterable[str], vms: Iterable[str]) -> list[Note]:
    """One warning per unfinished act on `hosts`, `vms` and every VM on those hosts, naming the
    object, the act, the run that began it, since when and why."""
    host_names = [h for h in dict.fromkeys(hosts) if h in inventory.hosts]
    objects = {h: inventory.hosts[h].intents for h in host_names}
    vm_names = [v for v in vms if v in inventory.vms]
    vm_names += [vm.name for h in host_names for vm in inventory.vms_on(h)]
    objects |= {v: inventory.vms[v].intents for v in dict.fromkeys(vm_names)}
    return foreign(inventory) + [Note(name, STEP, f"gpuvm intent {act!r} outstanding: recorded by run {intent.run}"
                             + (f" at {intent.since}" if intent.since else "") + (f" ({intent.why})" if intent.why else "")
                             + "; `apply` finishes or undoes it")
            for name, intents in objects.items() for act, intent in intents.items() if act not in MEMOS]


def foreign(inventory: Inventory) -> list[Note]:
    """One warning per value (or act's record) in gpuvm's attributes that gpuvm did not write, on every
    object of the vCenter: never acted on, so reported wherever it is."""
    found = [(obj.name, f) for kind in (inventory.hosts, inventory.vms, inventory.templates) for obj in kind.values()
             for f in obj.foreign] + [(f.object, f) for f in inventory.foreign]
    return [Note(name, FOREIGN, f.message()) for name, f in found]  # by the runbook's name (east/esx-01)
