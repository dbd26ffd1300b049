"""What `gpuvm inventory` shows of a runbook's vCenters: every host and VM of every vCenter reached
(not only the runbook's), each a name that two vCenters hold as `<vcenter>/<name>` (gpuvm/names.py),
whether both were reached or the other is the runbook's in a vCenter not reached: so that no object
of one vCenter is ever shown under a name that means another's. The vCenters not reached are
listed with why (the command warns of each, and exits 3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuvm.names import qualified, vsphere_name
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.fleet import Fleet
from gpuvm.vsphere.named import renamed


@dataclass
class Shown:
    """The inventory shown, each host's and VM's vCenter by the name shown (a runbook with
    `vcenters:` only), and the vCenters not reached → why."""

    inventory: Inventory
    host_vcenters: dict[str, str] = field(default_factory=dict)
    vm_vcenters: dict[str, str] = field(default_factory=dict)
    down: dict[str, str] = field(default_factory=dict)

    def warnings(self, book: Runbook) -> list[str]:
        """One line per vCenter not reached, naming it and the runbook's hosts and VMs not shown."""
        lines = []
        for name, why in self.down.items():
            part = book.part(name)
            missing = [h.name for h in part.hosts] + [v.name for v in part.vms]
            lines.append(f"vCenter {name} not reached, its hosts and VMs not shown"
                         + (f" ({', '.join(missing)})" if missing else "") + f": {why}")
        return lines


def shown(book: Runbook, fleet: Fleet) -> Shown:
    """Every vCenter reached's hosts and VMs under one roof (one vCenter: its inventory as read)."""
    if not book.vcenters:
        return Shown(fleet.merged(book))
    holders = _holders(book, fleet)
    merged = Inventory(source=", ".join(i.source for i in fleet.inventories.values()))
    hosts: dict[str, str] = {}
    vms: dict[str, str] = {}
    for vcenter, inventory in fleet.inventories.items():
        named = renamed(inventory, _shared(vcenter, "host", inventory.hosts, holders),
                        _shared(vcenter, "vm", inventory.vms, holders))
        merged.hosts.update(named.hosts)
        merged.vms.update(named.vms)
        hosts.update(dict.fromkeys(named.hosts, vcenter))
        vms.update(dict.fromkeys(named.vms, vcenter))
    return Shown(merged, hosts, vms, {name: str(why) for name, why in fleet.down.items()})


def _shared(vcenter: str, kind: str, names: Iterable[str], holders: dict[tuple[str, str], set[str]]) -> list[str]:
    """The names of one vCenter's hosts or VMs that another vCenter holds too, qualified."""
    return [qualified(vcenter, vsphere_name(n)) for n in names if len(holders[kind, vsphere_name(n)]) > 1]


def _holders(book: Runbook, fleet: Fleet) -> dict[tuple[str, str], set[str]]:
    """("host" or "vm", name in vCenter) → the vCenters that hold one: those reached, as read, and
    every vCenter of the runbook, as it declares them."""
    holders: dict[tuple[str, str], set[str]] = {}
    for vcenter, inventory in fleet.inventories.items():
        for kind, names in (("host", inventory.hosts), ("vm", inventory.vms)):
            for name in names:
                holders.setdefault((kind, vsphere_name(name)), set()).add(vcenter)
    for vcenter in book.all_vcenters:
        part = book.part(vcenter)
        for kind, names in (("host", [h.name for h in part.hosts]), ("vm", [v.name for v in part.vms])):
            for name in names:
                holders.setdefault((kind, vsphere_name(name)), set()).add(vcenter)
    return holders
