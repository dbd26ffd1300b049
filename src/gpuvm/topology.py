"""GPU topology: which GPUs a VM gets, and where they break the rules of NUMA nodes and NVLink pairs.

The rules: a VM's GPUs share one NUMA node (its `numa_node` when given); a VM with several GPUs
gets whole NVLink-bridged pairs; its passed-through NICs sit on its GPUs' node. `best_set` picks
the classic DirectPath GPUs that keep them where the free GPUs allow; `gpu_problems`,
`dynamic_problems` (the GPUs vSphere may pick) and `nic_problems` say where a choice breaks one.
resolve() turns each problem into a plan warning, or an input error under `topology: strict`.

vSphere has no API field for NVLink bridges. The runbook declares them (`hosts[].nvlink`); where it
does not, the `esxi.topology` step has read `nvidia-smi topo -m` in the host's ESXi shell before
planning, and make_plan hands what it found to resolve() (that step also refuses a declaration the
shell contradicts). The host's nvidia-smi sees only the GPUs its NVIDIA driver owns, not those
enabled for passthrough: for those, the declaration is what gpuvm knows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb

from gpuvm.desired import Nvlink
from gpuvm.pci import NVLINK_PAIRED
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere.facts import HostFacts, PciDevice

Loc = tuple[str | int, ...]


def host_nvlink(rb: Runbook, i: int, facts: HostFacts, discovered: Mapping[str, Nvlink]) -> Nvlink:
    """The pairs of hosts[i]: declared (each address a GPU of the host), else discovered, else unknown."""
    host = rb.hosts[i]
    if host.nvlink is None:
        via = "plan live, with the NVIDIA host driver on the host" if host.ssh else "give the host ssh"
        return discovered.get(host.name) or Nvlink(
            source=f"declare hosts[{i}].nvlink, or {via}: gpuvm reads them with `nvidia-smi topo -m` in its ESXi shell")
    gpus = sorted(d.id for d in facts.gpus)
    for j, pair in enumerate(host.nvlink):
        if missing := [a for a in pair if a not in gpus]:
            raise rb.error(("hosts", i, "nvlink", j), f"no GPU at {', '.join(missing)} on host {host.name} "
                                                      f"(GPUs: {', '.join(gpus) or 'none'})")
    return Nvlink(tuple(host.nvlink), f"hosts[{i}].nvlink")


@dataclass(frozen=True)
class Problem:
    loc: Loc  # the field of the VM's runbook entry it is about
    message: str


def best_set(candidates: Sequence[PciDevice], count: int, numa_node: int | None, nvlink: Nvlink,
             cost: Callable[[PciDevice], int]) -> list[PciDevice]:
    """The `count` candidates that best keep the rules, in this order: on `numa_node` (when given),
    in whole NVLink pairs, on one NUMA node, leaving free pairs whole, at the lowest `cost`; ties
    go to the earliest candidates."""
    if len(candidates) <= count:
        return list(candidates)
    free = {d.id for d in candidates}
    costs = {d.id: cost(d) for d in candidates}
    pair_of = {a: b for x, y in nvlink.pairs or () for a, b in ((x, y), (y, x))}
    partners = {d.id: pair_of.get(d.id) if nvlink.knows(d.id) else None for d in candidates}

    def score(chosen: Sequence[PciDevice]) -> tuple[int, ...]:
        ids = {d.id for d in chosen}
        alone = [d for d in chosen if nvlink.knows(d.id) and partners[d.id] not in ids]
        return (sum(numa_node is not None and d.numa_node != numa_node for d in chosen),
                len(alone) if count > 1 else 0,
                len({d.numa_node for d in chosen}),
                sum(partners[d.id] in free for d in alone),
                sum(costs[d.id] for d in chosen))

    reduced = _distinct(candidates, count, free, costs, partners, nvlink)
    if comb(len(reduced), count) > MAX_SETS:
        return list(min(_greedy_sets(reduced, count, costs, partners), key=score))
    return list(min(combinations(reduced, count), key=score))


MAX_SETS = 20_000  # sets scored exhaustively (8 of 16 GPUs: 12,870); past it, a few good ones


def _distinct(candidates: Sequence[PciDevice], count: int, free: set[str], costs: Mapping[str, int],
              partners: Mapping[str, str | None], nvlink: Nvlink) -> list[PciDevice]:
    """The candidates with all but the first `count` of each kind left out: GPUs (or bridged pairs)
    of one NUMA node, cost and NVLink standing score alike, so a set never needs a later one. A
    host with thousands of GPUs (an inventory snapshot says so) is then no slower to plan than a
    real one: `combinations` over all of them grows with the square of their number, or worse."""
    by_id = {d.id: d for d in candidates}
    kept: dict[tuple[object, ...], int] = {}
    done: set[str] = set()
    out: list[PciDevice] = []
    for d in candidates:
        if d.id in done:
            continue
        partner = partners[d.id]
        if partner in free and partners[partner] == d.id:  # a bridged pair: kept or left out whole
            other = by_id[partner]
            key: tuple[object, ...] = ("pair", *sorted([(_node(d), costs[d.id]), (_node(other), costs[partner])]))
            members = [d, other]
        else:
            key = ("one", _node(d), costs[d.id], nvlink.knows(d.id))
            members = [d]
        done.update(m.id for m in members)
        if kept.get(key, 0) < count:
            kept[key] = kept.get(key, 0) + 1
            out.extend(members)
    order = {d.id: i for i, d in enumerate(candidates)}
    return sorted(out, key=lambda d: order[d.id])


def _node(device: PciDevice) -> int:
    return -1 if device.numa_node is None else device.numa_node


def _greedy_sets(candidates: Sequence[PciDevice], count: int, costs: Mapping[str, int],
                 partners: Mapping[str, str | None]) -> list[list[PciDevice]]:
    """A few good sets, for hosts with more GPUs than any server: per NUMA node, its whole pairs
    then its single GPUs, cheapest first, topped up from the other nodes."""
    ids = {d.id for d in candidates}

    def rank(d: PciDevice) -> tuple[int, int]:
        return (0 if partners[d.id] in ids else 1, costs[d.id])

    sets = []
    for node in dict.fromkeys(d.numa_node for d in candidates):
        here = sorted((d for d in candidates if d.numa_node == node), key=rank)
        rest = sorted((d for d in candidates if d.numa_node != node), key=lambda d: costs[d.id])
        sets.append((here + rest)[:count])
    return sets


def _unpaired(chosen: Sequence[PciDevice], nvlink: Nvlink) -> list[PciDevice]:
    """The chosen GPUs known not to have their NVLink partner among the chosen."""
    ids = {d.id for d in chosen}
    return [d for d in chosen if nvlink.knows(d.id) and nvlink.partner(d.id) not in ids]


def numa_nodes(devices: Sequence[PciDevice]) -> list[int]:
    return sorted({d.numa_node for d in devices if d.numa_node is not None})


def _on_nodes(devices: Sequence[PciDevice]) -> str:
    return ", ".join(f"{d.id} on {d.numa_node}" for d in devices)


def gpu_problems(gpus: Sequence[PciDevice], count: int, numa_node: int | None, nvlink: Nvlink) -> list[Problem]:
    """Where classic DirectPath GPUs given to a VM break the rules."""
    problems = []
    away = [d for d in gpus if numa_node is not None and d.numa_node != numa_node]
    if away:
        nodes = ", ".join(map(str, numa_nodes(away))) or "unknown"
        problems.append(Problem(("numa_node",), f"GPU(s) {', '.join(d.id for d in away)} are on NUMA node(s) {nodes}, "
                                                f"not on {numa_node}"))
    elif len(numa_nodes(gpus)) > 1:
        nodes = " and ".join(map(str, numa_nodes(gpus)))
        problems.append(Problem(("gpus",), f"its {len(gpus)} GPUs span NUMA nodes {nodes} ({_on_nodes(gpus)}): "
                                           "host memory traffic crosses the socket interconnect"))
    if count > 1:
        problems += _nvlink_problems(gpus, nvlink)
    return problems


def _nvlink_problems(gpus: Sequence[PciDevice], nvlink: Nvlink) -> list[Problem]:
    if any(not nvlink.knows(d.id) for d in gpus):
        if any(d.device_id in NVLINK_PAIRED for d in gpus):
            return [Problem(("gpus",), f"which GPUs are NVLink-bridged is not known ({nvlink.source}): "
                                       "its GPUs may not be bridged")]
        return []
    alone = _unpaired(gpus, nvlink)
    if alone:
        return [Problem(("gpus",), f"GPU(s) {', '.join(d.id for d in alone)} have no NVLink partner among its GPUs "
                                   f"(pairs: {nvlink.describe()}): their traffic crosses PCIe")]
    return []


def dynamic_problems(candidates: Sequence[PciDevice], count: int, nvlink: Nvlink) -> list[Problem]:
    """Where the GPUs vSphere may pick for a dynamic DirectPath VM break the rules."""
    if count < 2:
        return []
    problems = []
    if len(numa_nodes(candidates)) > 1:
        problems.append(Problem(("numa_node",), f"vSphere picks its {count} GPUs at power-on from "
                                                f"{_on_nodes(candidates)}: they may span NUMA nodes; set numa_node "
                                                "to keep them on one"))
    if len(candidates) > count and all(nvlink.knows(d.id) for d in candidates):
        problems.append(Problem(("gpus",), f"vSphere picks its {count} GPUs at power-on from {len(candidates)}: "
                                           f"they may not be NVLink-bridged pairs (pairs: {nvlink.describe()})"))
    else:
        problems += _nvlink_problems(candidates, nvlink)
    return problems


def nic_problems(nics: Sequence[tuple[int, PciDevice]], gpu_nodes: Sequence[int]) -> list[Problem]:
    """Passed-through NICs (with their index in the VM's `nics`) not on the node of the VM's GPUs."""
    if len(gpu_nodes) != 1:
        return []  # no GPU, or GPUs on several nodes (a problem of their own)
    return [Problem(("nics", j, "address"), f"NIC {nic.id} is on NUMA node {nic.numa_node}, its GPUs on "
                                            f"{gpu_nodes[0]}: RDMA traffic to them crosses the socket interconnect")
            for j, nic in nics if nic.numa_node is not None and nic.numa_node != gpu_nodes[0]]
