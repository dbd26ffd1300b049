"""esxi.mig: MIG mode on the host's GPUs, for MIG-backed vGPU profiles (`grid_a100-3-40c`).

`nvidia-smi -i N -mig 1` in the ESXi shell. The new mode is pending until the GPU is reset or the
host reboots, so the change is marked "needs host reboot" (the host.reboot step follows it).
The runbook's `mig` ("all" or GPU indices) only enables: GPUs it does not name are left alone.
"""

from __future__ import annotations

from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.mig import MigLayoutError, select
from gpuvm.parsers.nvidia_smi import MigMode, parse_mig_query_csv
from gpuvm.plan import Change, Disruption
from gpuvm.remote import Cluster, RemoteTarget, run

NAME = "esxi.mig"
QUERY = ["nvidia-smi", "--query-gpu=index,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"]


def wanted(target: RemoteTarget, cluster: Cluster) -> bool:
    return target.host is not None and target.host.mig is not None


def observe(target: RemoteTarget, cluster: Cluster) -> list[MigMode]:
    return parse_mig_query_csv(run(target, cluster, QUERY).stdout)


def plan(target: RemoteTarget, fact: list[MigMode], cluster: Cluster) -> list[Change]:
    host = target.host
    assert host is not None and host.mig is not None
    modes = {m.index: m for m in fact}
    try:
        indices = select(host.mig, sorted(modes))
    except MigLayoutError as e:
        index = next((i for i, h in enumerate(cluster.runbook.hosts) if h.name == host.name), 0)
        raise cluster.runbook.error(("hosts", index, "mig"), f"{NAME}: host {target.name}: {e}") from None
    return [c for i in indices for c in _plan_gpu(target.name, modes[i])]


def _plan_gpu(name: str, gpu: MigMode) -> list[Change]:
    resource = f"GPU {gpu.index} ({gpu.name})"
    shown = gpu.current if gpu.pending == gpu.current else f"{gpu.current} (pending {gpu.pending})"
    if gpu.current == "[N/A]":
        raise InputError(f"{NAME}: host {name}: GPU {gpu.index} ({gpu.name}) reports MIG mode [N/A]: it has no MIG")
    if gpu.pending != "Enabled":
        # Enabled now but a disable is pending: setting it again cancels that, no reboot needed
        disruption = Disruption.NONE if gpu.current == "Enabled" else Disruption.HOST_REBOOT
        return [Change(NAME, name, resource, "mig.mode", shown, "Enabled", disruption, spec={"gpu": gpu.index})]
    if gpu.current != "Enabled":  # set before, waiting for the reboot
        return [Change(NAME, name, resource, "mig.mode", shown, "Enabled (after reboot)", Disruption.HOST_REBOOT)]
    return []


def apply(target: RemoteTarget, changes: list[Change], cluster: Cluster) -> None:
    for change in changes:
        if not change.spec:
            continue
        gpu = change.spec["gpu"]
        run(target, cluster, ["nvidia-smi", "-i", str(gpu), "-mig", "1"])
        now = parse_mig_query_csv(run(target, cluster, QUERY[:1] + ["-i", str(gpu)] + QUERY[1:]).stdout)[0]
        if now.pending != "Enabled":
            raise RemoteCommandError(f"{target.name}: {NAME}: GPU {gpu}: MIG mode reads {now.current} "
                                     f"(pending {now.pending}) after `nvidia-smi -i {gpu} -mig 1`; "
                                     "check that SR-IOV is enabled in the BIOS")


class EsxiMigStep:
    name, role = NAME, "esxi"
    wanted = staticmethod(wanted)
    observe = staticmethod(observe)
    plan = staticmethod(plan)
    apply = staticmethod(apply)
