"""esxi.ats: PCIe Address Translation Services on the ESXi host, for GPU peer-to-peer.

`esxcli system settings kernel set -s atsSupport -v TRUE`, active after a reboot. The option's
name is not confirmed by VMware's documentation, so it is the runbook's `ats_option`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.parsers.esxcli import KernelSetting, esxcli_bool, parse_kernel_setting
from gpuvm.plan import Change, Disruption
from gpuvm.desired.ssh import DesiredEsxi
from gpuvm.remote import run
from gpuvm.steps.base import Context, Step

NAME = "esxi.ats"


@dataclass(frozen=True)
class SetKernelSetting:
    option: str
    value: str  # "TRUE" | "FALSE"


def wanted(target: DesiredEsxi) -> bool:
    return target.ats is not None


def observe(ctx: Context, target: DesiredEsxi) -> KernelSetting:
    result = run(target, ctx.cluster, ["esxcli", "system", "settings", "kernel", "list", "-o", target.ats_option])
    return parse_kernel_setting(result.stdout, target.ats_option)


def plan(target: DesiredEsxi, fact: KernelSetting) -> list[Change]:
    want = bool(target.ats)
    configured, running = esxcli_bool(fact.configured), esxcli_bool(fact.runtime)
    value = "TRUE" if want else "FALSE"
    if configured != want:
        return [Change(NAME, target.name, f"kernel setting {fact.name}", "configured", fact.configured, value,
                       Disruption.HOST_REBOOT, SetKernelSetting(fact.name, value))]
    if running != want:  # set before, waiting for the reboot
        return [Change(NAME, target.name, f"kernel setting {fact.name}", "runtime", fact.runtime, value,
                       Disruption.HOST_REBOOT)]
    return []


def apply(ctx: Context, target: DesiredEsxi, changes: list[Change]) -> None:
    for change in changes:
        if isinstance(action := change.action, SetKernelSetting):
            run(target, ctx.cluster, ["esxcli", "system", "settings", "kernel", "set", "-s", action.option,
                                      "-v", action.value])


STEP = Step(NAME, "esxi", observe, plan, apply, wanted=wanted)
