"""Several vCenters in one run: a session to each, logged in in parallel; their inventories, read in
parallel; and `Fleet`, what the engine plans across them.

A vCenter that cannot be reached (no answer, TLS or login refused) does not stop the others: its
hosts, VMs and guests are "not observed" (exit 3), as an SSH target that does not answer is. With
one vCenter (`vcenter:`, the short form) nothing changes: its failure is the run's error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from gpuvm.errors import ConnectError
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session

T = TypeVar("T")
R = TypeVar("R")


def each(items: Mapping[str, T], work: Callable[[T], R]) -> tuple[dict[str, R], dict[str, ConnectError]]:
    """`work` on every item at once (one thread each: vCenters are few), results and connection
    failures by name; any other error is raised (the first, in the items' order)."""
    if len(items) == 1:  # one vCenter: no thread, its error as it was
        ((name, item),) = items.items()
        return {name: work(item)}, {}
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="vcenter") as pool:
        futures = {name: pool.submit(work, item) for name, item in items.items()}
    results, failed = {}, {}
    for name, future in futures.items():
        error = future.exception()
        if isinstance(error, ConnectError):
            failed[name] = error
        elif error is not None:
            raise error
        else:
            results[name] = future.result()
    return results, failed


def read_all(reached: Mapping[str, Session]) -> dict[str, Inventory]:
    """Every vCenter's inventory, read at once (one request each, plus paging)."""
    inventories, failed = each(reached, read_inventory)
    if failed:  # reached a moment ago: a vCenter gone now fails the run, not just its targets
        raise next(iter(failed.values()))
    return inventories


@dataclass
class Fleet:
    """The inventories of a runbook's vCenters, by vCenter name, and the targets of those not reached."""

    inventories: dict[str, Inventory]
    unobserved: dict[str, str] = field(default_factory=dict)  # hosts, VMs, guests of vCenters not reached → why

    @classmethod
    def of(cls, book: Runbook, inventories: dict[str, Inventory], down: Mapping[str, Exception]) -> "Fleet":
        unobserved: dict[str, str] = {}
        for name, error in down.items():
            part = book.part(name)
            why = f"vCenter {name} not reached: {error}"
            unobserved |= {h.name: why for h in part.hosts} | {v.name: why for v in part.vms}
        return cls(inventories, unobserved)

    def parts(self, book: Runbook) -> list[tuple[Runbook, Inventory]]:
        """Each vCenter's part of the runbook with its inventory (one vCenter: the runbook itself)."""
        if len(self.inventories) == 1 and not self.unobserved:
            return [(book, next(iter(self.inventories.values())))]
        return [(book.part(name), inventory) for name, inventory in self.inventories.items()]

    def merged(self, book: Runbook) -> Inventory:
        """One inventory of every vCenter: the runbook's hosts and VMs from their own vCenter (what the
        steps that span vCenters read: outstanding acts, reboot memos, unobserved guests' VMs)."""
        if len(self.inventories) == 1:
            return next(iter(self.inventories.values()))
        merged = Inventory(source=", ".join(i.source for i in self.inventories.values()))
        for name, inventory in self.inventories.items():
            part = book.part(name)
            mine = {h.name for h in part.hosts} | {v.host for v in part.vms} | {v.name for v in part.vms}
            for kind in ("hosts", "vms", "templates", "datastores", "folders", "pools", "networks"):
                into, source = getattr(merged, kind), getattr(inventory, kind)
                into.update({k: v for k, v in source.items() if k in mine or k not in into})
        return merged
