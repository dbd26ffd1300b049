"""Where gpuvm asks Slurm about the nodes of a host's VMs before it reboots the host (host.reboot
drains them first): the guest that runs the controller, and each VM's Slurm node name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SlurmNodes:
    controller: str  # the guest (named after its VM) where scontrol and squeue run
    nodes: dict[str, str] = field(default_factory=dict)  # VM name → its guest's Slurm node name

    def of(self, vms: Iterable[str]) -> dict[str, str]:
        """The Slurm node names of those `vms` whose guests are nodes: node → VM."""
        return {self.nodes[vm]: vm for vm in vms if vm in self.nodes}
