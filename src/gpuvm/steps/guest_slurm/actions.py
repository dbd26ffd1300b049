"""What guest.slurm's plan and apply share: its name, its typed actions, a target's Slurm node."""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.desired.slurm import SlurmNode
from gpuvm.desired.ssh import DesiredGuest

NAME = "guest.slurm"
DEFAULTS = "/etc/default/slurmd"
GRES_CONF = "/etc/slurm/gres.conf"


@dataclass(frozen=True)
class InstallPackages:
    packages: tuple[str, ...]


@dataclass(frozen=True)
class WriteMungeKey:
    """The cluster's key into /etc/munge/munge.key (0400 munge), then munge restarted."""


@dataclass(frozen=True)
class StartService:
    service: str


@dataclass(frozen=True)
class WriteFile:
    path: str
    content: str  # not a secret: Slurm's configuration
    after_mig: bool = False  # rendered again on apply, from the MIG devices guest.mig made (gres.conf)


@dataclass(frozen=True)
class Reconfigure:
    """`scontrol reconfigure`: slurmctld reads its files again and pushes them to the slurmds."""


@dataclass(frozen=True)
class ResumeNode:
    node: str  # the Slurm node name


def slurm_node(target: DesiredGuest) -> SlurmNode:
    """The target's part in the cluster (the step's `wanted` is that it has one)."""
    assert target.slurm is not None
    return target.slurm
