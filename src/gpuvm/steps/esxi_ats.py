"""esxi.ats: PCIe Address Translation Services on the ESXi host, for GPU peer-to-peer.

`esxcli system settings kernel set -s atsSupport -v TRUE`, active after a reboot. The option's
name is not confirmed by VMware's documentation, so it is the runbook's `ats_option`.
"""

from __future__ import annotations

from gpuvm.parsers.esxcli import KernelSetting, esxcli_bool, parse_kernel_setting
from gpuvm.plan import Change, Disruption
from gpuvm.remote import Cluster, RemoteTarget, run

NAME = "esxi.ats"


def wanted(target: RemoteTarget, cluster: Cluster) -> bool:
    return target.host is not None and target.host.ats is not None


def observe(target: RemoteTarget, cluster: Cluster) -> KernelSetting:
    option = target.host.ats_option  # type: ignore[union-attr]
    result = run(target, cluster, ["esxcli", "system", "settings", "kernel", "list", "-o", option])
    return parse_kernel_setting(result.stdout, option)


def plan(target: RemoteTarget, fact: KernelSetting, cluster: Cluster) -> list[Change]:
    want = bool(target.host.ats)  # type: ignore[union-attr]
    configured, running = esxcli_bool(fact.configured), esxcli_bool(fact.runtime)
    value = "TRUE" if want else "FALSE"
    if configured != want:
        return [Change(NAME, target.name, f"kernel setting {fact.name}", "configured", fact.configured, value,
                       Disruption.HOST_REBOOT, spec={"option": fact.name, "value": value})]
    if running != want:  # set before, waiting for the reboot
        return [Change(NAME, target.name, f"kernel setting {fact.name}", "runtime", fact.runtime, value,
                       Disruption.HOST_REBOOT)]
    return []


def apply(target: RemoteTarget, changes: list[Change], cluster: Cluster) -> None:
    for change in changes:
        if change.spec:
            run(target, cluster, ["esxcli", "system", "settings", "kernel", "set", "-s", change.spec["option"],
                                  "-v", change.spec["value"]])


class EsxiAtsStep:
    name, role = NAME, "esxi"
    wanted = staticmethod(wanted)
    observe = staticmethod(observe)
    plan = staticmethod(plan)
    apply = staticmethod(apply)
