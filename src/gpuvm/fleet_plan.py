"""`plan` over several vCenters, each vCenter's part planned in the process that read its inventory.

`make_plan` over a `Fleet` plans every vCenter's hosts and VMs against its own inventory, one after
another in one process, after the children that read the inventories sent them back. A runbook
without SSH targets (no ESXi shell, no guest) has nothing to plan across vCenters: each vCenter's
part is planned where its inventory was read (vsphere/fleet.py's child), and only the parts come
back, merged here in the order `make_plan` gives (steps in order, each step's vCenters in order;
notes as it lists them). The parent no longer pays for the others' plans, nor for unpickling their
inventories. With SSH targets, their facts (NVLink topology, the ATS a reboot activates) feed the
host steps and are observed after the reads: `make_plan` then plans all.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.engine import STEPS, plan_by_step
from gpuvm.outstanding import outstanding
from gpuvm.plan import Change, Note, Plan
from gpuvm.runbook.model import Runbook
from gpuvm.steps import reboot_memo
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.named import named_for


@dataclass
class Part:
    """One vCenter's part of the plan, as make_plan puts it together."""

    resolved: list[Note]  # resolve's notes
    outstanding: list[Note]  # what gpuvm began on its objects and has not finished
    changes: list[list[Change]]  # by step, in STEPS' order
    repeats: list[Note]  # hosts rebooted again for a change still pending


def apart(book: Runbook) -> bool:
    """Whether the runbook's vCenters can be planned apart: several, and no SSH target (`remote` has
    none to observe)."""
    return len(book.vcenters or ()) > 1 and not book.guests and not any(h.ssh for h in book.hosts)


def plan_part(part: Runbook, inventory: Inventory) -> Part:
    """One vCenter's hosts and VMs (`part`: the runbook's part of it) planned against its inventory
    (under the runbook's names: `<vcenter>/<name>` where a name is in several vCenters)."""
    inventory = named_for(part, inventory)
    desired, changes = plan_by_step(part, inventory)
    done = [change for step in changes for change in step]
    return Part(resolved=desired.notes, outstanding=outstanding(inventory, desired.hosts, desired.vms),
                changes=changes, repeats=reboot_memo.notes(reboot_memo.repeats(done, inventory)))


def merged(parts: list[Part], unobserved: dict[str, str]) -> Plan:
    """The plan of every vCenter's part, in order; the targets of the vCenters not reached not observed."""
    plan = Plan(notes=[n for p in parts for n in p.resolved] + [n for p in parts for n in p.outstanding],
                unobserved=dict(unobserved))
    for index in range(len(STEPS)):
        for part in parts:
            plan.changes.extend(part.changes[index])
    plan.notes += [n for p in parts for n in p.repeats]
    plan.notes += [Note(name, "observe", why) for name, why in unobserved.items()]
    return plan
