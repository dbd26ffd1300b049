"""What a benchmark needs on the guests is checked before anything runs (issue 22, item 6), on the
SSH test bed's real sshd and shells: a missing data directory is named per guest (not fio's raw
`lstat` error), a training image never built is named with what to do (not Docker's "See 'docker
run --help'"). Both exit 2: nothing was measured, and `gpuvm apply` or the runbook fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.image import image_ref
from gpuvm.runbook.loader import load_runbook
from tests.integration.test_bench_run import mesh  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration
GUESTS = ("gpu-vm-01", "gpu-vm-02")


def gpuvm(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def write_runbook(bed, path: Path, top: str, guests: str, runs: str) -> Path:
    hosts = "".join(f"    - {{vm: {n}, ssh: {{address: {bed.host(n).address}, user: {bed.host(n).user}, "
                    f"key_file: {bed.host(n).key_file}}}}}\n" for n in GUESTS)
    path.write_text(f"ssh: {{known_hosts: {bed.known_hosts_file}}}\nhosts: [{{name: esx-01}}]\nvms:\n"
                    + "".join(f"  - {{name: {n}, host: esx-01}}\n" for n in GUESTS)
                    + f"guests:\n{guests}  hosts:\n{hosts}benchmarks:\n{top}  launcher: gpu-vm-01\n  runs:\n{runs}")
    return path


def test_a_missing_data_directory_is_named_on_each_guest(mesh, tmp_path):
    runbook = write_runbook(mesh, tmp_path / "rb.yaml", "", "", """\
    - {name: reads, kind: storage, data: /srv/no-such-dataset, scenario: concurrent, groups: [[gpu-vm-01, gpu-vm-02]],
       args: ["--runtime=1", "--size=1m"], repeats: 1, timeout: 60}
""")
    result = gpuvm("bench", "run", runbook, "--out", tmp_path / "out", "--state-dir", tmp_path / "state")
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    for guest in GUESTS:
        assert f"{guest}: the data directory /srv/no-such-dataset does not exist on guest {guest} " \
               "(benchmark 'reads')" in output, output
    assert "lstat" not in output and "Traceback" not in output


def test_a_training_image_never_built_is_named_with_what_to_do(mesh, tmp_path):
    image = ("  image: {name: gpuvm/ci, base: 'debian:bookworm', mpi: distro, framework: pytorch, "
             "framework_from: distro, ofed: inbox, horovod: null, gpus: false}\n  ssh_mesh: {container_port: 12345}\n")
    runbook = write_runbook(mesh, tmp_path / "rb.yaml", "  container: true\n", image, """\
    - {name: probe, kind: command, command: "echo x=1", pattern: "x=([0-9])", nodes: [2], repeats: 1, timeout: 60}
""")
    ref = image_ref(load_runbook(runbook).guests.image)
    result = gpuvm("bench", "run", runbook, "--out", tmp_path / "out", "--state-dir", tmp_path / "state")
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    for guest in GUESTS:
        assert f"{guest}: image {ref} is not on guest {guest}: build it first with `gpuvm apply`" in output, output
    assert "docker run --help" not in output


def test_a_second_campaign_on_the_same_guests_is_refused_naming_the_first(mesh, tmp_path):
    """Issue 22, item 9: campaign A (a 2-node job that takes a few seconds) runs in its own process;
    campaign B on the same guests is refused (exit 7) naming A, measures nothing, and A's results
    are clean; the guests' locks are gone after A."""
    import os
    import subprocess
    import sys
    import time

    runbook = write_runbook(mesh, tmp_path / "rb.yaml", "", "", """\
    - {name: slow, kind: command, command: "sh -c 'sleep 4; echo x=1'", pattern: "x=([0-9])", nodes: [2],
       repeats: 1, timeout: 60, mpirun_args: ["-mca", "oob_tcp_if_include", "10.250.0.0/24"]}
""")
    locks = [mesh.host_dir(name) / "tmp" / "gpuvm-bench.lock" for name in GUESTS]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    first = subprocess.Popen([sys.executable, "-c", "from gpuvm.cli.main import app; app()", "bench", "run", str(runbook), "--out", str(tmp_path / "a"),
                              "--state-dir", str(tmp_path / "state")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all(lock.exists() for lock in locks) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(lock.exists() for lock in locks), first.communicate()[0] if first.poll() is not None else "no lock"
        second = gpuvm("bench", "run", runbook, "--out", tmp_path / "b", "--state-dir", tmp_path / "state")
        output = " ".join(second.output.split())
        assert second.exit_code == 7, second.output
        assert "guest gpu-vm-01: another benchmark campaign runs there: 'gpuvm-bench-campaign " in output, output
        assert f"pid {first.pid} since " in output
        assert not list((tmp_path / "b").rglob("*.log"))  # nothing measured
    finally:
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    [directory] = list((tmp_path / "a").iterdir())
    from gpuvm.bench.results import load_results

    [point] = load_results(directory).benchmark("slow").points
    assert point.repeats[0].value == 1.0 and point.repeats[0].error is None
    assert not any(lock.exists() for lock in locks)
