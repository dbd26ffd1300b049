"""The network the study tuned: NCCL and Open MPI pointed at the ConnectX ports the runbook sets up.

From each guest's `rdma_ports` and its `ibdev2netdev` port map (read over SSH when the campaign,
or its setup, starts), gpuvm derives, per guest,

* `NCCL_IB_HCA=<=mlx5_0:1,...>`: the RDMA devices with their ports (`=`: exact names, not prefixes),
* `NCCL_SOCKET_IFNAME=<=ens64np1,...>`: their network interfaces,
* `btl_tcp_if_include ens64np1,...`: Open MPI's TCP traffic on those interfaces (mpirun only),

each unless the run's `env` or `mpirun_args` sets it. Guests differ (another port, or none), and
Open MPI's `-x` and `-mca` are the same for every rank, so the values go into a small script in each
guest's workdir (`rank_script`): every rank starts through it and takes its own guest's values; a
guest without `rdma_ports` gets a script that sets nothing. A run's `network_mapping: [on, off]`
measures every point with and without them, as the study did.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuvm.errors import GpuvmError, InputError, RemoteCommandError
from gpuvm.executors.base import Executor
from gpuvm.parsers.ibdev2netdev import PortMap, parse_ibdev2netdev
from gpuvm.runbook.benchmarks import BenchmarkRun
from gpuvm.runbook.guests import Guest
from gpuvm.untrusted import interface, rdma_device

BTL = "btl_tcp_if_include"
PortMaps = Mapping[str, Sequence[PortMap]]  # guest VM name → its ibdev2netdev lines


@dataclass(frozen=True)
class NetworkMapping:
    hcas: tuple[str, ...]  # "mlx5_0:1"
    netdevs: tuple[str, ...]  # "ens64np1"

    def settings(self, run: BenchmarkRun) -> dict[str, str]:
        """What the mapping sets for `run`: every value the run does not set itself."""
        out = {}
        if "NCCL_IB_HCA" not in run.env:
            out["NCCL_IB_HCA"] = "=" + ",".join(self.hcas)
        if "NCCL_SOCKET_IFNAME" not in run.env:
            out["NCCL_SOCKET_IFNAME"] = "=" + ",".join(self.netdevs)
        mpi_set = any("btl_tcp_if_" in word for word in run.mpirun_args) or any("BTL_TCP_IF_" in n for n in run.env)
        if run.launch == "mpirun" and not mpi_set:
            out[BTL] = ",".join(self.netdevs)
        return out


def rank_env(settings: Mapping[str, str]) -> dict[str, str]:
    """Settings as a rank's environment (an MCA parameter as its OMPI_MCA_ variable)."""
    return {(f"OMPI_MCA_{k}" if k == BTL else k): v for k, v in settings.items()}


def rank_script(settings: Mapping[str, str]) -> str:
    """The per-guest wrapper every rank of a point starts through: exports its guest's settings
    (shell-quoted: they come from the guest), then runs the rank's command."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in rank_env(settings).items())
    return f"#!/bin/sh\n# gpuvm: this guest's network settings (bench/network.py)\n{exports}exec \"$@\"\n"


def script_name(run: str, label: str) -> str:
    """The wrapper's file in the workdir, one per point (`./` so that ranks run it from there)."""
    return f"./gpuvm-net-{run}-{label}.sh"


def per_guest(run: BenchmarkRun, guests: Sequence[Guest], ports: PortMaps) -> dict[str, dict[str, str]]:
    """Each guest's settings for `run`: from its own ports; empty for a guest without rdma_ports."""
    out = {}
    for guest in guests:
        found = derive([guest], ports)
        out[guest.vm] = found.settings(run) if found else {}
    return out


def guests_with_ports(guests: Sequence[Guest]) -> list[Guest]:
    return [g for g in guests if g.rdma_ports]


def derive(guests: Sequence[Guest], ports: PortMaps) -> NetworkMapping | None:
    """The mapping of these guests' configured ports (None when they configure none)."""
    hcas: dict[str, None] = {}
    netdevs: dict[str, None] = {}
    for guest in guests_with_ports(guests):
        seen = ports.get(guest.vm)
        if seen is None:
            raise InputError(f"guest {guest.vm}: its ibdev2netdev port map was not read")
        for port in guest.rdma_ports:
            found = next((p for p in seen if (p.ibdev, p.port) == (port.device, port.port)
                          or (port.interface is not None and p.netdev == port.interface)), None)
            if found is None:
                known = ", ".join(f"{p.ibdev} port {p.port} ==> {p.netdev}" for p in seen) or "none"
                raise InputError(f"guest {guest.vm}: rdma port {port.describe()} not found by ibdev2netdev "
                                 f"(ports: {known})")
            # checked again here, whoever built the map: Open MPI forwards these values to the other
            # nodes' daemons through ssh inside double quotes, where `$(…)` would run
            hcas[f"{rdma_device(found.ibdev, 'ibdev2netdev')}:{int(found.port)}"] = None
            netdevs[interface(found.netdev, "ibdev2netdev")] = None
    if not hcas:
        return None
    return NetworkMapping(tuple(hcas), tuple(netdevs))


def read_port_maps(executors: Mapping[str, Executor], guests: Sequence[Guest]) -> dict[str, list[PortMap]]:
    """`ibdev2netdev` on every guest with rdma_ports (read only); errors name the guest."""
    maps = {}
    for guest in guests_with_ports(guests):
        try:
            maps[guest.vm] = parse_ibdev2netdev(executors[guest.vm].run(["ibdev2netdev"], timeout=60).stdout)
        except GpuvmError as e:
            raise RemoteCommandError(f"guest {guest.vm}: cannot read the port map (ibdev2netdev): {e}") from None
    return maps
