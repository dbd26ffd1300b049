"""Launch files for a training job over the runbook's guests: the Open MPI hostfile, horovodrun's -H.

Hosts are the guests' SSH addresses (the ones the SSH mesh trusts), in runbook order; slots are
`Guest.slots` (the GPUs a job uses there). Rendered from `templates/hostfile.j2` and
`templates/horovodrun_hosts.j2`:

    10.0.0.11 slots=2            horovodrun -np 4 -H 10.0.0.11:2,10.0.0.12:2
    10.0.0.12 slots=2
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gpuvm.errors import InputError
from gpuvm.runbook.model import Guest, Runbook

HOSTFILE_TEMPLATE = "hostfile.j2"
HOROVOD_TEMPLATE = "horovodrun_hosts.j2"


def templates_dir() -> Path:
    """`templates/` at the top of the source tree (or beside the package when installed)."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "templates", here.parent / "templates"):
        if (candidate / HOSTFILE_TEMPLATE).is_file() and (candidate / HOROVOD_TEMPLATE).is_file():
            return candidate
    raise InputError(f"launch templates {HOSTFILE_TEMPLATE}, {HOROVOD_TEMPLATE} not found beside {here.parent} "
                     "(run gpuvm from its source checkout)")


def _render(name: str, guests: Sequence[Guest]) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(templates_dir()), undefined=StrictUndefined, autoescape=False,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template(name).render(guests=list(guests))


def guests_of(runbook: Runbook) -> list[Guest]:
    guests = runbook.guests.hosts if runbook.guests else []
    if not guests:
        raise InputError(f"{runbook.file}: guests.hosts: no guests to launch on; list the guest VMs with their ssh")
    return guests


def hostfile(guests: Sequence[Guest]) -> str:
    """The Open MPI hostfile text: `address slots=N` per guest."""
    return _render(HOSTFILE_TEMPLATE, guests)


def horovod_hosts(guests: Sequence[Guest]) -> str:
    """horovodrun's host list: `a:2,b:2`."""
    return _render(HOROVOD_TEMPLATE, guests).strip()


def total_slots(guests: Sequence[Guest]) -> int:
    return sum(g.slots for g in guests)


def horovodrun_args(guests: Sequence[Guest]) -> list[str]:
    """`-np <total slots> -H <list>`, for `horovodrun`."""
    return ["-np", str(total_slots(guests)), "-H", horovod_hosts(guests)]


def write_launch_files(runbook: Runbook, out_dir: Path) -> dict[str, Path]:
    """Write `hostfile` and `horovodrun_hosts` into out_dir; return them by name."""
    guests = guests_of(runbook)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"hostfile": out_dir / "hostfile", "horovodrun_hosts": out_dir / "horovodrun_hosts"}
    files["hostfile"].write_text(hostfile(guests))
    files["horovodrun_hosts"].write_text(horovod_hosts(guests) + "\n")
    return files
