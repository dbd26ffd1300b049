"""The runbook's `slurm:` section: the Slurm cluster that runs on the guests.

Only what host reboots need so far: the guest that runs the controller (`scontrol` and `squeue`
run there, over the guest's SSH). Each guest's Slurm node name is its VM's name.
"""

from __future__ import annotations

from gpuvm.runbook.strict import Strict


class Slurm(Strict):
    controller: str  # the guest (its VM's name) that runs slurmctld
