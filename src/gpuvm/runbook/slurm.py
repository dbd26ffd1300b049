"""The runbook's `slurm:` section: the cluster's scheduler, configured on the guests (guest.slurm).

slurmctld runs on one guest (`controller`), slurmd on the compute guests (`compute`, default every
guest). slurm.conf, gres.conf and cgroup.conf are rendered from these settings and what the guests
have (CPUs, memory, GPUs, the MIG layout or vGPU profile the runbook gives them); the compute nodes
take them from the controller (Slurm's configless mode), so they live in one place.

`check_slurm` checks what needs the rest of the runbook (guests named that exist); it runs after
the runbook's own checks (loader.py), with errors at `file:line: slurm.<field>`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, field_validator, model_validator

from gpuvm.errors import listed
from gpuvm.runbook.strict import Strict, checked_reference, shown

if TYPE_CHECKING:
    from gpuvm.runbook.model import Runbook

GuestName = Annotated[str, AfterValidator(checked_reference)]  # a guest, by its VM's name
SLURM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")
# slurm.conf keys gpuvm writes itself: an `extra` line setting one would contradict the rendered file
MANAGED_KEYS = frozenset(k.lower() for k in (
    "ClusterName", "SlurmctldHost", "SlurmctldParameters", "AuthType", "MpiDefault", "ProctrackType",
    "TaskPlugin", "GresTypes", "NodeName", "PartitionName", "SlurmUser", "StateSaveLocation",
    "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile", "SlurmdLogFile"))
EXTRA_LINE = re.compile(r"([A-Za-z][A-Za-z0-9]*)=(\S.*)")


def _slurm_name(value: str) -> str:
    if not SLURM_NAME.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a Slurm name (a letter, then letters, digits, '_', '-'; max 40)")
    return value


class SlurmPartition(Strict):
    """A partition (PartitionName=) over some of the compute guests."""

    name: Annotated[str, AfterValidator(_slurm_name)]  # as users name it: srun -p <name>
    nodes: Literal["all"] | list[GuestName] = "all"  # the guests (VM names) in it; all: every compute guest
    default: bool = False  # the partition jobs go to without -p; default: the first partition
    max_time: str = "INFINITE"  # MaxTime=: INFINITE, minutes, or days-hours:minutes:seconds

    @field_validator("max_time")
    @classmethod
    def _time(cls, value: str) -> str:
        if not re.fullmatch(r"INFINITE|UNLIMITED|\d+(-\d+)?(:\d+){0,2}", value):
            raise ValueError(f"{shown(value)} is not a Slurm time (INFINITE, minutes, or days-hours:minutes:seconds)")
        return value


class SlurmCgroup(Strict):
    """cgroup.conf's constraints: jobs see only their cores, GPUs (devices) and memory."""

    constrain_cores: bool = True  # ConstrainCores
    constrain_devices: bool = True  # ConstrainDevices: a job sees only the GPUs it was given
    constrain_ram_space: bool = True  # ConstrainRAMSpace


class Slurm(Strict):
    """Slurm on the guests: slurmctld on `controller`, slurmd on the compute guests, munge on all."""

    controller: GuestName  # the guest (VM name) that runs slurmctld
    compute: list[GuestName] | None = None  # the guests that run slurmd (VM names); default: every guest
    cluster_name: Annotated[str, AfterValidator(_slurm_name)] = "gpuvm"  # ClusterName
    partitions: list[SlurmPartition] = [SlurmPartition(name="gpu")]  # default: one partition, gpu, of every compute guest
    mpi_default: Literal["pmix", "pmi2", "none"] = "pmi2"  # MpiDefault: how srun starts MPI ranks
    # task/cgroup and proctrack/cgroup with these constraints; null: neither (proctrack/linuxproc), for
    # guests without a systemd cgroup tree (containers)
    cgroup: SlurmCgroup | None = SlurmCgroup()
    extra: list[str] = []  # more slurm.conf lines, Key=Value, appended as given (not the keys gpuvm writes)

    @field_validator("extra")
    @classmethod
    def _extra(cls, lines: list[str]) -> list[str]:
        for line in lines:
            match = EXTRA_LINE.fullmatch(line)
            if match is None or "\n" in line or "\r" in line:
                raise ValueError(f"{shown(line)} is not one slurm.conf line Key=Value (like SchedulerType=sched/backfill)")
            if match[1].lower() in MANAGED_KEYS:
                raise ValueError(f"{match[1]} is written by gpuvm from the runbook; set it through the slurm section's "
                                 "fields, not extra")
        return lines

    @model_validator(mode="after")
    def _partitions(self) -> "Slurm":
        names = [p.name for p in self.partitions]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"partition {twice[0]} is declared twice")
        if not self.partitions:
            raise ValueError("partitions is empty: give at least one (jobs need a partition)")
        if sum(p.default for p in self.partitions) > 1:
            raise ValueError("more than one partition has default: true")
        return self

    @property
    def default_partition(self) -> str:
        return next((p.name for p in self.partitions if p.default), self.partitions[0].name)


def check_slurm(runbook: "Runbook") -> None:
    """The guests `slurm` names are the runbook's guests (qualified names): InputError at file:line."""
    slurm = runbook.slurm
    if slurm is None:
        return
    guests = [g.vm for g in runbook.guests.hosts] if runbook.guests else []
    if not guests:
        raise runbook.error(("slurm",), "slurm runs on the guests: give guests.hosts")

    def known(loc: tuple[str | int, ...], name: str) -> None:
        if name not in guests:
            raise runbook.error(("slurm",) + loc, f"'{name}' is not a guest (guests: {listed(guests)})")

    known(("controller",), slurm.controller)
    for i, name in enumerate(slurm.compute or []):
        known(("compute", i), name)
    compute = slurm.compute if slurm.compute is not None else guests
    if not compute:
        raise runbook.error(("slurm", "compute"), "no compute guests: name at least one (or leave compute out: every guest)")
    for i, partition in enumerate(slurm.partitions):
        for j, name in enumerate(partition.nodes if partition.nodes != "all" else []):
            known(("partitions", i, "nodes", j), name)
            if name not in compute:
                raise runbook.error(("slurm", "partitions", i, "nodes", j), f"'{name}' is not a compute guest "
                                    f"(compute: {listed(compute)})")
