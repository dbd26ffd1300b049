"""esxi.mig: MIG mode on the host's GPUs, for MIG-backed vGPU profiles (`grid_a100-3-40c`).

`nvidia-smi -i N -mig 1` in the ESXi shell. The new mode is pending until the GPU is reset or the
host reboots, so the change is marked "needs host reboot" (the host.reboot step follows it).
The runbook's `mig` ("all" or GPU indices) only enables: GPUs it does not name are left alone.
nvidia-smi comes with the NVIDIA vGPU manager: on a host where it does not run yet, MIG mode is
planned for the apply after the reboot that starts the manager (`esxi.vgpu_manager`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.desired.ssh import DesiredEsxi
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.mig import MigLayoutError, select
from gpuvm.parsers.nvidia_smi import MigMode, parse_mig_query_csv
from gpuvm.plan import Change, Disruption
from gpuvm.remote import run
from gpuvm.steps.base import Context, Step
from gpuvm.steps.installer import missing

NAME = "esxi.mig"
NO_DRIVER = 9  # nvidia-smi: "couldn't communicate with the NVIDIA driver"
QUERY = ["nvidia-smi", "--query-gpu=index,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"]


@dataclass(frozen=True)
class EnableMig:
    gpu: int


def wanted(target: DesiredEsxi) -> bool:
    return target.mig is not None


def observe(ctx: Context, target: DesiredEsxi) -> list[MigMode] | None:
    """The GPUs' MIG modes; None: no nvidia-smi, or no driver it can reach (no vGPU manager runs)."""
    result = run(target, ctx.cluster, QUERY, check=False)
    if missing(result) or result.exit_code == NO_DRIVER:
        return None
    if not result.ok:
        raise RemoteCommandError(f"{' '.join(QUERY)} failed (exit {result.exit_code}): {result.last_line}")
    return parse_mig_query_csv(result.stdout)


def plan(target: DesiredEsxi, fact: list[MigMode] | None) -> list[Change]:
    assert target.mig is not None
    if fact is None:
        if not target.runs_manager:
            raise target.error(NAME, ("mig",), "nvidia-smi does not answer in the ESXi shell: no NVIDIA vGPU manager "
                                               "runs (hosts[].nvidia_host_driver installs it)")
        return [Change(NAME, target.name, "GPUs", "mig.mode", "unknown (no vGPU manager runs yet)",
                       "Enabled, on the apply after the reboot that starts the manager", Disruption.NONE)]
    modes = {m.index: m for m in fact}
    try:
        indices = select(target.mig, sorted(modes))
    except MigLayoutError as e:
        raise target.error(NAME, ("mig",), str(e)) from None
    return [c for i in indices for c in _plan_gpu(target.name, modes[i])]


def _plan_gpu(name: str, gpu: MigMode) -> list[Change]:
    resource = f"GPU {gpu.index} ({gpu.name})"
    shown = gpu.current if gpu.pending == gpu.current else f"{gpu.current} (pending {gpu.pending})"
    if gpu.current == "[N/A]":
        raise InputError(f"{NAME}: host {name}: GPU {gpu.index} ({gpu.name}) reports MIG mode [N/A]: it has no MIG")
    if gpu.pending != "Enabled":
        # Enabled now but a disable is pending: setting it again cancels that, no reboot needed
        disruption = Disruption.NONE if gpu.current == "Enabled" else Disruption.HOST_REBOOT
        return [Change(NAME, name, resource, "mig.mode", shown, "Enabled", disruption, EnableMig(gpu.index))]
    if gpu.current != "Enabled":  # set before, waiting for the reboot
        return [Change(NAME, name, resource, "mig.mode", shown, "Enabled (after reboot)", Disruption.HOST_REBOOT)]
    return []


def apply(ctx: Context, target: DesiredEsxi, changes: list[Change]) -> None:
    for change in changes:
        if not isinstance(change.action, EnableMig):
            continue  # enabled before, waiting for the reboot
        gpu = change.action.gpu
        run(target, ctx.cluster, ["nvidia-smi", "-i", str(gpu), "-mig", "1"])
        now = parse_mig_query_csv(run(target, ctx.cluster, QUERY[:1] + ["-i", str(gpu)] + QUERY[1:]).stdout)[0]
        if now.pending != "Enabled":
            raise RemoteCommandError(f"GPU {gpu}: MIG mode reads {now.current} "
                                     f"(pending {now.pending}) after `nvidia-smi -i {gpu} -mig 1`; "
                                     "check that SR-IOV is enabled in the BIOS")


STEP = Step(NAME, "esxi", observe, plan, apply, wanted=wanted)
