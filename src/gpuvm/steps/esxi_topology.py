"""esxi.topology: which GPUs are NVLink-bridged, read in the ESXi shell; it changes nothing.

`nvidia-smi topo -m` (the connection matrix) and `--query-gpu=index,pci.bus_id` (the GPUs' PCI
addresses) need the NVIDIA host driver and list only the GPUs it owns: GPUs enabled for
passthrough belong to the VMkernel and are not listed. Without nvidia-smi, or with no GPU listed,
nothing is known. SSH steps are observed before planning, so make_plan hands what this step read
to resolve() (`discovered`), which uses it for hosts whose runbook entry declares no `nvlink`.
A declaration that the shell contradicts is refused by `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from gpuvm.errors import RemoteCommandError
from gpuvm.parsers.nvidia_topo import BUS_IDS, TOPO, parse_bus_ids, parse_topo_matrix
from gpuvm.plan import Change
from gpuvm.desired.ssh import DesiredEsxi
from gpuvm.remote import run
from gpuvm.steps.base import Context, Step
from gpuvm.desired import Nvlink

NAME = "esxi.topology"


@dataclass(frozen=True)
class GpuLinks:
    gpus: tuple[str, ...] = ()  # PCI addresses of the GPUs nvidia-smi lists
    pairs: tuple[tuple[str, str], ...] = ()  # the NVLink-bridged pairs among them
    switched: bool = False  # all of them joined by an NVSwitch (then no pairs: every GPU reaches every other)
    unread: str = ""  # why nothing was read


def observe(ctx: Context, target: DesiredEsxi) -> GpuLinks:
    topo = run(target, ctx.cluster, TOPO.split(), check=False)
    if topo.exit_code != 0:
        said = (topo.stderr or topo.stdout).strip().splitlines()
        return GpuLinks(unread=f"`{TOPO}` exited {topo.exit_code}{': ' + said[0] if said else ''}")
    matrix = parse_topo_matrix(topo.stdout)
    if not matrix.gpus:
        return GpuLinks(unread="nvidia-smi lists no GPU")
    addresses = parse_bus_ids(run(target, ctx.cluster, BUS_IDS.split()).stdout)
    if missing := [i for i in matrix.gpus if i not in addresses]:
        raise RemoteCommandError(f"{target.name}: `{BUS_IDS}` does not list GPU(s) {missing} of `{TOPO}`")
    gpus = tuple(addresses[i] for i in matrix.gpus)
    if matrix.switched():
        return GpuLinks(gpus, switched=True)
    return GpuLinks(gpus, tuple((addresses[i], addresses[j]) for i, j in matrix.nvlinked()))


def _shown(pairs: Any) -> str:
    return ", ".join(f"{a[5:]}+{b[5:]}" for a, b in pairs) or "none"


def plan(target: DesiredEsxi, fact: GpuLinks) -> list[Change]:
    """Nothing to change; a declared `nvlink` is refused where the shell shows other pairs."""
    declared = target.nvlink
    if declared is None or not fact.gpus:
        return []
    found = {frozenset(p) for p in fact.pairs}
    seen = [p for p in declared if set(p) <= set(fact.gpus)]  # pairs of GPUs the shell can judge
    if {frozenset(p) for p in seen} != found:
        raise target.error(NAME, ("nvlink",), f"the declared NVLink pairs ({_shown(seen)}) are not what `{TOPO}` "
                                              f"shows ({_shown(fact.pairs)})")
    return []


def apply(ctx: Context, target: DesiredEsxi, changes: list[Change]) -> None:
    """`plan` makes no changes."""


def discovered(facts: Mapping[tuple[str, str], Any]) -> dict[str, Nvlink]:
    """The pairs each ESXi shell showed, by host: what resolve() uses where the runbook declares none."""
    return {host: Nvlink(fact.pairs, f"`{TOPO}` in the ESXi shell of {host}", frozenset(fact.gpus), fact.switched)
            for (step, host), fact in facts.items() if step == NAME and fact.gpus}


STEP = Step(NAME, "esxi", observe, plan, apply)
