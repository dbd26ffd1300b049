"""From no training VMs to a configured, reachable cluster in one `gpuvm apply`: the simulator
clones four VMs (two per host) from a template, gpusim's power-on hook boots each as an SSH test
host with the address and public key of its cloud-init data, and the guest steps (the NVIDIA
driver from a stand-in .run package, inbox rdma-core through the stand-in apt-get, the SSH mesh)
run on them in the same apply. Then `plan` is empty and `verify` clean; a VM marked absent is
refused without --allow-destroy and destroyed with it. A guest that never answers fails naming
VM and step, and a re-run converges."""

from __future__ import annotations

import functools
import hashlib
import json
import http.server
import shlex
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bed import SUBNET, nvidia_run_package
from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import BED, boot_hook, raw_state, use_simulator

pytestmark = pytest.mark.integration

VMS = {"train-1": ("esx-01", "10.250.0.101"), "train-2": ("esx-01", "10.250.0.102"),
       "train-3": ("esx-02", "10.250.0.103"), "train-4": ("esx-02", "10.250.0.104")}
DRIVER = "535.183.01"
RDMA_CORE = "39.0-1"  # the apt-get stand-in's rdma-core (Ubuntu 22.04's)


# The template is a plain cloud image: a clone's first boot finds no NVIDIA driver (the stand-in
# nvidia-smi's default is a running 470 driver, whose replacement would need a VM power-off).
NO_DRIVER_YET = ("import sys; sys.path.insert(0, sys.argv[3]); from pathlib import Path; from bed import TestBed; "
                 "bed = TestBed(Path(sys.argv[2])); "
                 "'driver_version' in bed.state(sys.argv[1]) or bed.set_state(sys.argv[1], 'driver_version', None)")


def fresh_clone_hook(testbed) -> str:
    """gpusim's -on-power-on: boot the guest (bed.py boot); on its first boot it has no driver."""
    return (f'{boot_hook(testbed)} && {shlex.quote(sys.executable)} -c {shlex.quote(NO_DRIVER_YET)} '
            f'"$GPUSIM_VM" {shlex.quote(str(testbed.root))} {shlex.quote(str(BED.parent))}')


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def mirror(tmp_path):
    """A download server on the bed's bridge (as a lab's mirror) with the stand-in driver package:
    fresh guests have nothing of this machine's /tmp to install from."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    nvidia_run_package(folder / f"NVIDIA-Linux-x86_64-{DRIVER}.run", DRIVER)
    server = http.server.ThreadingHTTPServer((f"{SUBNET}.1", 0), functools.partial(QuietHandler, directory=folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{SUBNET}.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def write_runbook(bed, tmp_path: Path, vms: dict[str, tuple[str, str]], boot_timeout: int = 20,
                  connect_timeout: int = 3, mirror: str | None = None, absent: tuple[str, ...] = ()) -> Path:
    lines = ["vcenter: {password_env: GPUVM_VCENTER_PASSWORD}",
             f"ssh: {{known_hosts: {tmp_path / 'known_hosts'}, connect_timeout: {connect_timeout}, boot_timeout: {boot_timeout}}}",
             "hosts: [{name: esx-01, passthrough: [{model: A100}]}, {name: esx-02, passthrough: [{model: A100}]}]",
             "vms:"]
    lines += [f"  - {{name: {vm}, host: {host}, template: ubuntu-gpu, cpus: 8, memory_gb: 64, "
              f"gpus: {{mode: passthrough, count: 1}}, "
              f"cloud_init: {{address: {ip}/24, ssh_public_key_file: {bed.client_key}.pub}}}}"
              for vm, (host, ip) in vms.items() if vm not in absent]
    lines += [f"  - {{name: {vm}, host: {vms[vm][0]}, state: absent}}" for vm in absent]
    lines += ["guests:", "  ssh_mesh: {}"]
    if mirror:
        digest = hashlib.sha256((tmp_path / "mirror" / f"NVIDIA-Linux-x86_64-{DRIVER}.run").read_bytes()).hexdigest()
        lines += [f"  driver: {{version: '{DRIVER}', installer: '{mirror}/NVIDIA-Linux-x86_64-{{version}}.run', "
                  f"sha256: {digest}}}",
                  "  rdma: {stack: inbox}"]
    lines += ["  hosts:"]
    lines += [f"    - {{vm: {vm}, ssh: {{address: {ip}, user: gpuadmin, key_file: {bed.client_key}}}}}"
              for vm, (_, ip) in vms.items() if vm not in absent]
    path = tmp_path / "runbook.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def sim(testbed, monkeypatch, tmp_path):
    sim = Simulator(hosts=2, vms_per_host=0, rebind=True, templates=["ubuntu-gpu"], on_power_on=fresh_clone_hook(testbed)).start()
    use_simulator(monkeypatch, sim, tmp_path / "state")
    try:
        yield sim
    finally:
        sim.stop()
        for name in VMS:
            testbed.remove(name)


def test_from_empty_lab_to_a_reachable_meshed_cluster_in_one_apply(testbed, sim, mirror, tmp_path):
    book = write_runbook(testbed, tmp_path, VMS, mirror=mirror)
    planned = gpuvm("plan", str(book), "--accept-new-host-keys", "--detailed-exitcode")
    assert planned.exit_code == 2, planned.output  # changes; the new VMs' guests are known after apply, not missing
    assert planned.output.count("clone of ubuntu-gpu") == 4, planned.output
    assert "not reachable over SSH yet" in planned.output and "known after apply" in planned.output
    assert set(raw_state(sim)) == {"esx-01", "esx-02", "ubuntu-gpu"}, "plan created something"

    applied = gpuvm("apply", str(book), "--yes", "--accept-new-host-keys")
    assert applied.exit_code == 0, applied.output
    for step in ("guest.driver", "guest.rdma", "guest.ssh_mesh"):
        assert step in applied.output, applied.output
    testbed.reload()
    assert testbed.booted == {vm: ip for vm, (_, ip) in VMS.items()}  # booted by the power-on hook
    assert all(raw_state(sim)[vm]["power"] == "poweredOn" for vm in VMS)
    for vm in VMS:  # what the stand-ins (nvidia-smi, dpkg-query) now report, as the installers left it
        state = testbed.state(vm)
        assert state["driver_version"] == DRIVER, (vm, state)
        assert state["packages"] == {"rdma-core": RDMA_CORE, "ibverbs-utils": RDMA_CORE}, (vm, state)

    replanned = gpuvm("plan", str(book), "--detailed-exitcode")
    assert replanned.exit_code == 0, replanned.output
    verified = gpuvm("verify", str(book))
    assert verified.exit_code == 0, verified.output
    assert "SSH mesh: all 4 guests reach each other." in verified.output

    before = raw_state(sim)
    gone = write_runbook(testbed, tmp_path, VMS, mirror=mirror, absent=("train-4",))
    refused = gpuvm("apply", str(gone), "--yes")
    assert refused.exit_code == 2, refused.output
    assert "train-4" in refused.output and "--allow-destroy" in refused.output, refused.output
    assert raw_state(sim) == before, "a refused apply touched something"
    destroyed = gpuvm("apply", str(gone), "--yes", "--allow-destroy", "--allow-power-off")
    assert destroyed.exit_code == 0, destroyed.output
    after = raw_state(sim)
    assert "train-4" not in after and all(after[vm] == before[vm] for vm in ("train-1", "train-2", "train-3"))
    testbed.remove("train-4")  # its guest went with the VM
    assert gpuvm("plan", str(gone), "--detailed-exitcode").exit_code == 0
    verified = gpuvm("verify", str(gone))
    assert verified.exit_code == 0, verified.output
    assert "SSH mesh: all 3 guests reach each other." in verified.output


def test_a_guest_that_never_answers_names_vm_and_step_and_a_rerun_converges(testbed, sim, tmp_path):
    quiet = {"train-1": ("esx-01", "10.250.0.101")}
    book = write_runbook(testbed, tmp_path, quiet, boot_timeout=6, connect_timeout=2)
    text = book.read_text()
    book.write_text(text.replace("address: 10.250.0.101, user", "address: 10.250.0.109, user"))  # not its address
    applied = gpuvm("apply", str(book), "--yes", "--accept-new-host-keys")
    assert applied.exit_code == 3, applied.output  # not reachable: the README's exit code 3
    assert "train-1 (observe)" in applied.output, applied.output
    book.write_text(text)
    again = gpuvm("apply", str(book), "--yes", "--accept-new-host-keys")
    assert again.exit_code == 0, again.output + sim.log()
    assert gpuvm("verify", str(book)).exit_code == 0


def test_the_from_template_playbook_plans_its_new_guests_known_after_apply_and_apply_observes_them(
        testbed, monkeypatch, tmp_path):
    """Issue 34, item 5: `plan playbooks/lab-from-template.yaml --detailed-exitcode` exits 2, not 3:
    the guests of the four VMs it creates cannot answer yet, so their guest steps are planned from
    the runbook alone, marked known after apply; `apply` creates and boots the VMs, observes the
    guests and sets them up; the plan is empty after."""
    text = (Path(__file__).parents[2] / "playbooks" / "lab-from-template.yaml").read_text()
    book = tmp_path / "lab-from-template.yaml"
    book.write_text(text.replace("../build/testbed/known_hosts", str(tmp_path / "known_hosts"))
                    .replace("../build/testbed/client_key", str(testbed.client_key)))
    guests = [f"train-0{n}" for n in range(1, 5)]
    sim = Simulator(hosts=2, vms_per_host=0, rebind=True, templates=["ubuntu-22.04-gpu"], vm_version="vmx-15",
                    on_power_on=boot_hook(testbed)).start()
    try:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        planned = gpuvm("plan", str(book), "--detailed-exitcode", "--json")
        assert planned.exit_code == 2, planned.output
        plan = json.loads(planned.stdout)
        assert plan["not_observed"] == {} and plan["summary"]["known_after_apply"] > 0
        later = {(c["target"], c["step"]) for c in plan["changes"] if c["known_after_apply"]}
        assert {target for target, _ in later} == set(guests) and ("train-01", "guest.ssh_mesh") in later
        assert set(raw_state(sim)) == {"esx-01", "esx-02", "ubuntu-22.04-gpu"}, "plan created something"

        applied = gpuvm("apply", str(book), "--yes", "--accept-new-host-keys")
        assert applied.exit_code == 0, applied.output
        assert "known after apply" not in applied.output.split("Applied")[-1]
        assert "guest.ssh_mesh" in applied.output
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0
    finally:
        sim.stop()
        for name in guests:
            testbed.remove(name)
