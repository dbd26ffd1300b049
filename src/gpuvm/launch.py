"""Launch files for a training job over all the runbook's guests: the Open MPI hostfile and
horovodrun's `-H` list (`gpuvm launch-files`). Hosts are the guests' SSH addresses (the ones the SSH
mesh trusts), in runbook order; slots are each guest's `slots`, else its VM's GPU count. The hostfile is rendered by the same
template the benchmark runner uses (`templates/bench/hostfile.j2`):

    10.0.0.11 slots=2            horovodrun -np 4 -H 10.0.0.11:2,10.0.0.12:2
    10.0.0.12 slots=2
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gpuvm.errors import InputError
from gpuvm.runbook.guests import Guest
from gpuvm.runbook.model import Runbook


def guests_of(runbook: Runbook) -> list[Guest]:
    """The runbook's guests, each with its slots (`Runbook.slots_of`: given, or its VM's GPU count)."""
    guests = runbook.guests.hosts if runbook.guests else []
    if not guests:
        raise InputError(f"{runbook.file}: guests.hosts: no guests to launch on; list the guest VMs with their ssh")
    return [g.model_copy(update={"slots": runbook.slots_of(g)}) for g in guests]


def _slots(guests: Sequence[Guest]) -> list[tuple[str, int]]:
    return [(g.ssh.address, g.slots or 1) for g in guests]


def hostfile(guests: Sequence[Guest]) -> str:
    """The Open MPI hostfile text: `address slots=N` per guest."""
    from gpuvm.bench.commands import render_hostfile

    return render_hostfile(_slots(guests))


def horovod_hosts(guests: Sequence[Guest]) -> str:
    """horovodrun's host list: `a:2,b:2`."""
    return ",".join(f"{address}:{slots}" for address, slots in _slots(guests))


def total_slots(guests: Sequence[Guest]) -> int:
    return sum(g.slots or 1 for g in guests)


def horovodrun_args(guests: Sequence[Guest]) -> list[str]:
    """`-np <total slots> -H <list>`, for `horovodrun`."""
    return ["-np", str(total_slots(guests)), "-H", horovod_hosts(guests)]


def write_launch_files(runbook: Runbook, out_dir: Path) -> dict[str, Path]:
    """Write `hostfile` and `horovodrun_hosts` into out_dir; return them by name."""
    from gpuvm.files import writing

    guests = guests_of(runbook)
    files = {"hostfile": out_dir / "hostfile", "horovodrun_hosts": out_dir / "horovodrun_hosts"}
    with writing(out_dir, "launch files"):
        out_dir.mkdir(parents=True, exist_ok=True)
        files["hostfile"].write_text(hostfile(guests))
        files["horovodrun_hosts"].write_text(horovod_hosts(guests) + "\n")
    return files
