"""Where gpuvm asks Slurm about the nodes of a host's VMs before it reboots the host (host.reboot
drains them first): the guest that runs the controller, and the compute guests, each the Slurm
node named after its VM (as guest.slurm writes slurm.conf)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmNodes:
    controller: str  # the guest (named after its VM) where scontrol and squeue run
    compute: tuple[str, ...] = ()  # the guests that run slurmd: their VMs' names, their nodes' names

    def of(self, vms: Iterable[str]) -> list[str]:
        """The Slurm nodes among `vms`."""
        return [vm for vm in vms if vm in self.compute]
