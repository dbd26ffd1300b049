"""The network the study tuned: NCCL and Open MPI pointed at the ConnectX ports the runbook sets up.

From the `rdma_ports` of the guests in a point and each guest's `ibdev2netdev` port map (read over
SSH when the campaign, or its setup, starts), gpuvm derives

* `NCCL_IB_HCA=<=mlx5_0:1,...>`: the RDMA devices with their ports (`=`: exact names, not prefixes),
* `NCCL_SOCKET_IFNAME=<=ens64np1,...>`: their network interfaces,
* `-mca btl_tcp_if_include ens64np1,...`: Open MPI's TCP traffic on those interfaces (mpirun only),

each unless the run's `env` or `mpirun_args` sets it. A run's `network_mapping: [on, off]`
measures every point with and without them, as the study did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuvm.errors import GpuvmError, InputError, RemoteCommandError
from gpuvm.executors.base import Executor
from gpuvm.parsers.ibdev2netdev import PortMap, parse_ibdev2netdev
from gpuvm.runbook.benchmarks import BenchmarkRun
from gpuvm.runbook.model import Guest
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


def split(settings: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Settings as (environment for every rank, extra mpirun words)."""
    env = {k: v for k, v in settings.items() if k != BTL}
    return env, (["-mca", BTL, settings[BTL]] if BTL in settings else [])


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
