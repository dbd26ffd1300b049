"""The containerised multi-node path for real: a dockerd in each of four guests' network namespaces,
the training image built by `gpuvm apply` (guest.docker) from gpuvm's Dockerfile on a Debian base
made here (debootstrap, `docker import`: no registry; it already carries the Debian packages the
Dockerfile installs, so its apt-get lines run and find them: `make test` bootstraps it beforehand,
and the test run downloads no PyTorch; testbed/base_image.py), shipped with `docker save | load`, then
`gpuvm bench run` with `container: true`: a worker container running sshd with the mesh key on
every guest, mpirun inside the launcher's container across all four, a PyTorch DDP (gloo) training.
"""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from base_image import PRELOADED, base_tarball
from gpusim import Simulator
from gpuvm.bench.results import load_results
from gpuvm.cli.main import app
from gpuvm.image import image_ref
from gpuvm.runbook.loader import load_runbook
from tests.integration.test_bench_run import SMALL
from tests.integration.vcenter import use_simulator

pytestmark = pytest.mark.integration

GUESTS = ["gpu-vm-01", "gpu-vm-02", "gpu-vm-03", "gpu-vm-04"]
VMS = ["esx-01-vm1", "esx-01-vm2", "esx-02-vm1", "esx-02-vm2"]  # gpusim's, paired with GUESTS in order
BASE = "gpuvm-base/debian:bookworm"


def gpuvm(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def docker_bed(testbed):
    """The test bed with a real dockerd on each guest; the builder has the Debian base image (with the
    Dockerfile's Debian packages preinstalled)."""
    if shutil.which("dockerd") is None or shutil.which("debootstrap") is None:
        pytest.fail("the container test needs Docker and debootstrap: apt-get install -y docker.io debootstrap")
    tarball = base_tarball("bookworm", include=PRELOADED)
    try:
        for guest in GUESTS:
            testbed.start_docker(guest)
        testbed.docker(GUESTS[0], "import", str(tarball), BASE)
        yield testbed
    finally:  # each stop removes that guest's data root (the ~1 GB image): the four overlap
        with ThreadPoolExecutor(len(GUESTS)) as pool:
            list(pool.map(testbed.stop_docker, GUESTS))


def runbook_for(bed, path: Path) -> Path:
    lines = [
        "vcenter: {password_env: GPUVM_VCENTER_PASSWORD}",
        f"ssh: {{known_hosts: {bed.known_hosts_file}}}",
        "hosts: [{name: esx-01}, {name: esx-02}]",
        "vms:", *[f"  - {{name: {vm}, host: {vm[:6]}}}" for vm in VMS],
        "guests:",
        f"  image: {{name: gpuvm/ci, base: '{BASE}', mpi: distro, framework: pytorch, framework_from: distro,",
        "          ofed: inbox, horovod: null, gpus: false, build_network: host, build_timeout: 1200}",
        "  ssh_mesh: {container_port: 12345}",
        "  hosts:",
    ]
    for vm, guest in zip(VMS, GUESTS, strict=True):
        host = bed.host(guest)
        lines.append(f"    - {{vm: {vm}, ssh: {{address: {host.address}, user: {host.user}, "
                     f"key_file: {host.key_file}, sudo: true}}}}")
    lines += [
        "benchmarks:",
        "  container: true",
        "  runs:",
        "    - name: ddp-gloo",
        "      kind: pytorch_train  # gpuvm's training workload, in the image's Python (Debian's python3-torch)",
        "      model: resnet18",
        "      python: python3",
        f"      args: {SMALL}",
        "      env: {GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: '1'}",
        "      batch_size: 8",
        "      nodes: [1, 4]",
        "      repeats: 1",
        "      timeout: 300",
        '      mpirun_args: ["-mca", "btl_tcp_if_include", "eth0", "-mca", "oob_tcp_if_include", "eth0"]',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def containers(bed, guest: str) -> list[str]:
    return bed.docker(guest, "ps", "-a", "--format", "{{.Names}}").stdout.split()


def test_containerised_campaign_on_real_docker(docker_bed, tmp_path, monkeypatch):
    bed = docker_bed
    runbook = runbook_for(bed, tmp_path / "containers.yaml")
    ref = image_ref(load_runbook(runbook).guests.image)
    with Simulator(hosts=2, vms_per_host=2) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        applied = gpuvm("apply", runbook, "--yes")
        assert applied.exit_code == 0, applied.output
        assert "guest.image" in applied.output
        # the long build and ship say how far they got (issue 22, item 6); a first apply ships the image
        # over the mesh it has just set up (issue 27): guest to guest, nothing through gpuvm's machine
        shown = " ".join(applied.output.split())
        assert re.search(rf"guest.image {VMS[0]}: image {re.escape(ref)} built in \d+ s", shown), shown
        assert re.search(rf"image {re.escape(ref)} down a pipelined tree of 2 level\(s\) to 3 of 3 guest\(s\)", shown), shown
        assert re.search(rf"image {re.escape(ref)} copied to 3 of 3 guest\(s\) over the mesh in a pipelined tree and "
                         r"0 round\(s\)", shown), shown
        assert "through gpuvm's machine" not in shown and "image shipped and loaded" not in shown
        for vm in VMS[1:]:
            assert re.search(rf"{vm}: image {re.escape(ref)} copied from \S+ over the mesh in \d+ s \(pipelined\)", shown), (vm, shown)

    # built once, on the builder, from gpuvm's Dockerfile; the same id on every guest
    ids = {g: bed.docker(g, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() for g in GUESTS}
    assert len(set(ids.values())) == 1 and re.fullmatch(r"sha256:[0-9a-f]{64}", ids[GUESTS[0]]), ids
    history = bed.docker(GUESTS[0], "image", "inspect", "--format", "{{json .Config.Labels}}", ref).stdout
    assert "org.gpuvm.recipe" in json.loads(history)
    assert bed.docker(GUESTS[1], "image", "inspect", BASE, check=False).returncode != 0  # loaded, never built there

    result = gpuvm("bench", "run", runbook, "--out", tmp_path / "results")
    assert result.exit_code == 0, result.output
    [directory] = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    results = load_results(directory)
    [bench] = results.benchmarks
    assert [(p.nodes, len(p.repeats)) for p in bench.points] == [(1, 1), (4, 1)]
    assert all(r.value and r.value > 0 and r.error is None for p in bench.points for r in p.repeats)
    assert {g: results.software[g]["image"] for g in VMS} == {vm: ids[GUESTS[0]] for vm in VMS}
    assert all(results.software[vm]["image_name"] == ref for vm in VMS)

    log = (directory / bench.points[1].repeats[0].log).read_text()
    assert "Total img/sec on 4 CPU(s):" in log and "Model: resnet18" in log
    # mpirun in the launcher's container reached the other three guests only through port 12345: the
    # workers' sshd (the guests' own listens on 22), so every remote rank ran in a worker container
    command = (directory / "logs/ddp-gloo/nodes-4/command.sh").read_text()
    assert command.count("docker run") == 1 and "plm_rsh_args '-p 12345'" in command
    assert "--gpus" not in command  # gpus: false

    for guest in GUESTS:  # the worker containers are gone, and so is every job's container
        assert containers(bed, guest) == [], guest
    assert results.note is None  # it would name guests where a worker was left
