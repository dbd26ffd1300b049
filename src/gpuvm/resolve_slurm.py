"""From the runbook's `slurm:` section to `SlurmNodes`: what host.reboot needs to drain a host's
Slurm nodes before it reboots the host. Each guest is a node named after its VM (Slurm's names
hold no '/': a VM named `east/gpu-01` is node `gpu-01`)."""

from __future__ import annotations

from gpuvm.desired.slurm_nodes import SlurmNodes
from gpuvm.names import vsphere_name
from gpuvm.parsers.slurm import NODE_NAME
from gpuvm.runbook.model import Runbook


def slurm_nodes(runbook: Runbook) -> SlurmNodes | None:
    """None: the runbook has no Slurm cluster (host reboots drain nothing)."""
    if runbook.slurm is None:
        return None
    guests = [g.vm for g in runbook.guests.hosts] if runbook.guests is not None else []
    if runbook.slurm.controller not in guests:
        raise runbook.error(("slurm", "controller"), f"{runbook.slurm.controller!r} is not a guest of the runbook "
                            f"(guests.hosts: {', '.join(guests) or 'none'})")
    for i, vm in enumerate(guests):
        if not NODE_NAME.fullmatch(vsphere_name(vm)):
            raise runbook.error(("guests", "hosts", i, "vm"), f"{vm!r} cannot name a Slurm node "
                                "(letters, digits, '.', '_', '-', at most 64)")
    return SlurmNodes(runbook.slurm.controller, {vm: vsphere_name(vm) for vm in guests})
