"""The derived network on the SSH test bed: NCCL_IB_HCA, NCCL_SOCKET_IFNAME and btl_tcp_if_include
from the guests' rdma_ports and the bed's ibdev2netdev, each point measured with the mapping on and
off; results of two campaigns compared side by side."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.bench.results import load_results
from gpuvm.cli.main import app
from tests.integration.test_bench_run import PYTHON, SMALL, mesh  # noqa: F401  (mesh: a fixture)
from tests.integration.vcenter import guest_ssh

pytestmark = pytest.mark.integration
OOB = ["-mca", "oob_tcp_if_include", "10.250.0.0/24"]  # mpirun's own control channel: the bed's network


def gpuvm(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def fabric(mesh):
    """gpu-vm-01..02 with their first ConnectX port up on the bed's fabric (192.168.100.0/24)."""
    for i, name in enumerate(("gpu-vm-01", "gpu-vm-02"), 21):
        from gpuvm.executors import SshExecutor

        host = mesh.host(name)
        ex = SshExecutor(name, host.address, host.user, key_file=host.key_file, known_hosts=[mesh.known_hosts_file])
        ex.run(["sudo", "ip", "addr", "replace", f"192.168.100.{i}/24", "dev", "ens64np1"])
        ex.run(["sudo", "ip", "link", "set", "ens64np1", "up"])
        ex.close()
    yield mesh
    mesh.up()  # addresses and links back as new


def bench_runbook(bed, path: Path, guests: dict[str, str], runs: str) -> Path:
    """A runbook of the bed's `guests` (name → more lines of its entry), their VMs on esx-01, and
    gpu-vm-01 launching `runs` (the lines under `runs:`)."""
    entries = "".join(f"    - vm: {name}\n      ssh: {guest_ssh(bed, name)}{more}\n" for name, more in guests.items())
    vms = "".join(f"  - {{name: {name}, host: esx-01}}\n" for name in guests)
    path.write_text(f"ssh: {{known_hosts: {bed.known_hosts_file}}}\nhosts: [{{name: esx-01}}]\nvms:\n{vms}"
                    f"guests:\n  hosts:\n{entries}benchmarks:\n  launcher: gpu-vm-01\n  runs:\n{runs}")
    return path


def write_runbook(bed, path: Path) -> Path:
    port = "\n      rdma_ports: [{device: mlx5_0, port: 1}]"
    return bench_runbook(bed, path, {"gpu-vm-01": port, "gpu-vm-02": port}, f"""\
    - name: train
      kind: pytorch_train
      model: resnet18
      python: {PYTHON}
      args: {SMALL}
      batch_size: 8
      nodes: [2]
      network_mapping: [on, off]
      repeats: 1
      timeout: 180
      env: {{OMP_NUM_THREADS: "1"}}
      mpirun_args: ["--oversubscribe", {", ".join(f'"{w}"' for w in OOB)}]
    - name: env-on-rank-1
      kind: command
      command: "sh -c 'echo $OMPI_COMM_WORLD_RANK ifname=$NCCL_SOCKET_IFNAME hca=$NCCL_IB_HCA 1'"
      pattern: "1 ifname==ens64np1 hca==mlx5_0:1 ([0-9])"
      nodes: [2]
      repeats: 1
      timeout: 60
      mpirun_args: {OOB}
""")


def test_network_mapping_on_and_off_across_two_guests(fabric, tmp_path):
    runbook = write_runbook(fabric, tmp_path / "bed.yaml")
    state = ["--state-dir", tmp_path / "state"]
    dry = gpuvm("bench", "run", runbook, "--dry-run", *state)
    assert dry.exit_code == 0, dry.output
    for name in ("gpu-vm-01", "gpu-vm-02"):
        assert f"network on {name} (derived from ibdev2netdev): NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens64np1 " \
               "btl_tcp_if_include=ens64np1" in " ".join(dry.output.split())

    directories = []
    for out in ("first", "second"):
        result = gpuvm("bench", "run", runbook, "--out", tmp_path / out, *state)
        [directory] = list((tmp_path / out).iterdir())
        logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(directory.rglob("*.log")))
        assert result.exit_code == 0, result.output + logs
        directories.append(directory)

    results = load_results(directories[0])
    train = results.benchmark("train")
    on, off = sorted(train.points, key=lambda p: p.network_mapping != "on")
    assert (on.network_mapping, off.network_mapping) == ("on", "off")
    # with the mapping, Open MPI's TCP traffic may use ens64np1 only: the 2-node job ran over the fabric
    assert on.network == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=ens64np1",
                          "btl_tcp_if_include": "ens64np1"}
    assert off.network == {}
    assert on.repeats[0].value > 0 and off.repeats[0].value > 0
    command = (directories[0] / "logs/train/nodes-2-mapping-on/command.sh").read_text()
    assert " ./gpuvm-net-train-nodes-2-mapping-on.sh " in command  # each guest's values, from its workdir
    assert "gpuvm-net" not in (directories[0] / "logs/train/nodes-2-mapping-off/command.sh").read_text()
    # the derived values reach the remote rank (gpu-vm-02)
    assert results.benchmark("env-on-rank-1").points[0].repeats[0].value == 1.0

    compared = gpuvm("bench", "compare", *directories)
    assert compared.exit_code == 0, compared.output
    assert "network mapping on against off" in compared.output
    from gpuvm.bench.compare import compare
    from gpuvm.bench.results import merge_results

    merged = compare(merge_results([("first", results), ("second", load_results(directories[1]))]))
    points = merged.benchmarks[0].points
    assert [(p.setup, p.mapping) for p in points] == [("first", "on"), ("first", "off"), ("second", "on"),
                                                      ("second", "off")]  # side by side, each campaign a setup
    assert all((p.mapping_gain is not None) == (p.mapping == "on") for p in points)
    report = gpuvm("bench", "report", *directories, "--out", tmp_path / "report")
    assert report.exit_code == 0, report.output
    assert "mapping on" in (tmp_path / "report" / "report.md").read_text()


def test_each_guest_gets_the_network_settings_of_its_own_ports(mesh, tmp_path):
    """Issue 22, item 7: gpu-vm-01 (mlx5_0 port 1), gpu-vm-02 (mlx5_1 port 1) and gpu-vm-03 (no
    rdma_ports) in one 3-rank job under the bed's real Open MPI: each rank sees its own guest's
    values, the guest without ports none (NCCL's default interface list, no HCA, no BTL limit)."""
    ports = {"gpu-vm-01": "\n      rdma_ports: [{device: mlx5_0, port: 1}]",
             "gpu-vm-02": "\n      rdma_ports: [{device: mlx5_1, port: 1}]", "gpu-vm-03": ""}
    runbook = bench_runbook(mesh, tmp_path / "bed.yaml", ports, f"""\
    - name: env
      kind: command
      command: "sh -c 'echo rank=$OMPI_COMM_WORLD_RANK hca=$NCCL_IB_HCA ifname=$NCCL_SOCKET_IFNAME btl=$OMPI_MCA_btl_tcp_if_include value=1'"
      pattern: "rank=0 .* value=([0-9])"
      nodes: [3]
      repeats: 1
      timeout: 60
      mpirun_args: {OOB}
""")
    result = gpuvm("bench", "run", runbook, "--out", tmp_path / "out", "--state-dir", tmp_path / "state")
    [directory] = list((tmp_path / "out").iterdir())
    log = "\n".join(p.read_text(errors="replace") for p in directory.rglob("*.log"))
    assert result.exit_code == 0, result.output + log
    seen = {int(m[0]): m[1:] for m in
            __import__("re").findall(r"rank=(\d) hca=(\S*) ifname=(\S*) btl=(\S*) value=1", log)}
    assert seen == {0: ("=mlx5_0:1", "=ens64np1", "ens64np1"),
                    1: ("=mlx5_1:1", "=ens64np2", "ens64np2"),
                    2: ("", "^lo,docker0", "")}, log
    command = (directory / "logs/env/nodes-3/command.sh").read_text()
    assert "-x NCCL_IB_HCA" not in command and "-mca btl_tcp_if_include" not in command  # nothing global
    assert " ./gpuvm-net-env-nodes-3.sh sh -c " in command
