"""Where gpuvm asks Slurm about the nodes of a host's VMs before it reboots the host (host.reboot
drains them first): the guest that runs the controller, and the compute guests. A guest's node
is named after its short host name (as guest.slurm writes slurm.conf), read when the drain is
planned; a guest not answering then is taken to be named after its VM."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmNodes:
    controller: str  # the guest (named after its VM) where scontrol and squeue run
    compute: tuple[str, ...] = ()  # the guests (VM names) that run slurmd

    def of(self, vms: Iterable[str]) -> list[str]:
        """Those of `vms` whose guests are Slurm nodes."""
        return [vm for vm in vms if vm in self.compute]
