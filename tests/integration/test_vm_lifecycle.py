"""VMs created from a template and destroyed, against the simulated vCenter (no SSH): plan shows
the creates and touches nothing, apply clones, configures and powers them on, re-plan is empty;
a VM marked absent is refused without --allow-destroy and destroyed with it. Failures (wrong
template, full datastore, a clone task that fails) name VM and step, and a re-run converges."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import raw_state, use_simulator

pytestmark = pytest.mark.integration

RUNBOOK = """\
vcenter: {password_env: GPUVM_VCENTER_PASSWORD}
hosts:
  - {name: esx-01, passthrough: [{model: A100}]}
  - {name: esx-02, passthrough: [{model: A100}]}
vms:
%s
"""
VM = """\
  - name: %(name)s
    host: %(host)s
    template: %(template)s
    cpus: 8
    memory_gb: 64
    gpus: {mode: passthrough, count: 1}
    cloud_init: {address: 10.250.0.%(ip)d/24, ssh_public_key_file: key.pub}
"""


def runbook(tmp_path: Path, vms: list[dict], extra: str = "") -> Path:
    (tmp_path / "key.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuvm test@gpuvm\n")
    entries = "".join(VM % ({"template": "ubuntu-gpu"} | vm) + extra for vm in vms)
    path = tmp_path / "runbook.yaml"
    path.write_text(RUNBOOK % entries)
    return path


TRAINING = [{"name": "train-1", "host": "esx-01", "ip": 101}, {"name": "train-2", "host": "esx-02", "ip": 102}]


def simulator(monkeypatch, tmp_path: Path, **options) -> Simulator:
    sim = Simulator(hosts=2, vms_per_host=1, rebind=True, templates=["ubuntu-gpu"], **options).start()
    use_simulator(monkeypatch, sim, tmp_path / "state")
    return sim


@pytest.fixture
def sim(monkeypatch, tmp_path):
    running = simulator(monkeypatch, tmp_path)
    yield running
    running.stop()


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_create_configure_power_on_then_destroy_only_with_the_flag(sim, tmp_path):
    book = runbook(tmp_path, TRAINING)
    before = raw_state(sim)
    planned = gpuvm("plan", str(book))
    assert planned.exit_code == 0, planned.output
    assert "create: clone of ubuntu-gpu on esx-01, datastore" in planned.output.replace("\n", " ") or \
        "clone of ubuntu-gpu" in planned.output, planned.output
    assert raw_state(sim) == before, "plan created something"

    applied = gpuvm("apply", str(book), "--yes")
    assert applied.exit_code == 0, applied.output
    after = raw_state(sim)
    for name in ("train-1", "train-2"):
        vm = after[name]
        assert vm["power"] == "poweredOn" and vm["cpus"] == 8 and vm["memory"] == 65536 and vm["reserved"], vm
        assert len(vm["pci"]) == 1 and vm["firmware"] == "efi"
    assert after["esx-01-vm1"] == before["esx-01-vm1"], "a VM the runbook does not name was touched"
    assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0
    assert gpuvm("verify", str(book)).exit_code == 0

    gone = runbook(tmp_path, TRAINING[:1])
    gone.write_text(gone.read_text() + "  - {name: train-2, host: esx-02, state: absent}\n")
    shown = gpuvm("plan", str(gone))
    assert "DESTROY" in shown.output, shown.output
    refused = gpuvm("apply", str(gone), "--yes")
    assert refused.exit_code == 2 and "train-2" in refused.output and "--allow-destroy" in refused.output
    assert "--allow-power-off" in refused.output  # it runs: powered off first
    assert raw_state(sim) == after, "a refused apply touched something"
    destroyed = gpuvm("apply", str(gone), "--yes", "--allow-destroy", "--allow-power-off")
    assert destroyed.exit_code == 0, destroyed.output
    final = raw_state(sim)
    assert "train-2" not in final and final["train-1"] == after["train-1"]
    assert final["esx-01-vm1"] == before["esx-01-vm1"] and final["esx-02-vm1"] == before["esx-02-vm1"]
    assert gpuvm("plan", str(gone), "--detailed-exitcode").exit_code == 0


def test_guestinfo_carries_identity_and_only_the_public_key(sim, tmp_path):
    import base64
    import json

    from tests.integration.vcenter import pyvmomi

    assert gpuvm("apply", str(runbook(tmp_path, TRAINING[:1])), "--yes").exit_code == 0
    with pyvmomi(sim) as si:
        vm = si.content.searchIndex.FindByInventoryPath("DC0/vm/train-1")
        extra = {o.key: str(o.value) for o in vm.config.extraConfig}
    assert extra["guestinfo.metadata.encoding"] == extra["guestinfo.userdata.encoding"] == "base64"
    metadata = json.loads(base64.b64decode(extra["guestinfo.metadata"]))
    assert metadata["local-hostname"] == "train-1"
    assert metadata["network"]["ethernets"]["nics"]["addresses"] == ["10.250.0.101/24"]
    userdata = base64.b64decode(extra["guestinfo.userdata"]).decode()
    assert userdata.startswith("#cloud-config\n") and "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuvm" in userdata


def test_wrong_template_is_an_input_error_naming_the_line(sim, tmp_path):
    book = runbook(tmp_path, [TRAINING[0] | {"template": "ubuntu-typo"}])
    result = gpuvm("plan", str(book))
    assert result.exit_code == 2
    assert "runbook.yaml:8: vms[0].template" in result.output and "template 'ubuntu-typo' for VM 'train-1' not found" in result.output
    assert "templates: ubuntu-gpu" in result.output


def test_failed_clone_and_full_datastore_name_vm_and_step_and_a_rerun_converges(monkeypatch, tmp_path):
    sim = simulator(monkeypatch, tmp_path, datastore_gb=80, faults=["fail-clone=train-1"])  # room for 2 clones
    try:
        book = runbook(tmp_path, TRAINING)
        first = gpuvm("apply", str(book), "--yes")
        assert first.exit_code == 4, first.output
        assert "train-1 (vm.lifecycle)" in first.output and "gpusim injected fault: clone to train-1" in first.output
        assert "train-2 (vm.lifecycle)" not in first.output and raw_state(sim)["train-2"]["power"] == "poweredOn"
        assert gpuvm("apply", str(book), "--yes").exit_code == 0  # the clone works this time
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0

        more = runbook(tmp_path, TRAINING + [{"name": "train-3", "host": "esx-01", "ip": 103},
                                             {"name": "train-4", "host": "esx-02", "ip": 104}])
        before = raw_state(sim)
        full = gpuvm("apply", str(more), "--yes")  # refused at plan time: nothing is cloned
        assert full.exit_code == 2, full.output
        assert ("runbook.yaml:22: vms[2].template: VM train-3: its clone of ubuntu-gpu needs 40 GB on datastore "
                "LocalDS_0, which has 0 GB free") in " ".join(full.output.split()), full.output
        assert raw_state(sim) == before
        # what vSphere answers a clone that does not fit, had the space gone between plan and apply
        from pyVmomi import vim

        from tests.integration.vcenter import pyvmomi
        with pyvmomi(sim) as si:
            template = si.content.searchIndex.FindByInventoryPath("DC0/vm/ubuntu-gpu")
            task = template.CloneVM_Task(folder=template.parent, name="train-3", spec=vim.vm.CloneSpec(
                location=vim.vm.RelocateSpec(host=si.content.searchIndex.FindByInventoryPath("DC0/vm/train-1").runtime.host)))
            while task.info.state in ("queued", "running"):
                pass
            assert task.info.state == "error" and isinstance(task.info.error, vim.fault.NoDiskSpace)
            assert "Insufficient disk space on datastore 'LocalDS_0'." in task.info.error.msg
        assert "train-3" not in raw_state(sim)
        gone = runbook(tmp_path, TRAINING[:1])
        gone.write_text(gone.read_text() + "  - {name: train-2, host: esx-02, state: absent}\n")
        assert gpuvm("apply", str(gone), "--yes", "--allow-destroy", "--allow-power-off").exit_code == 0
        room = runbook(tmp_path, TRAINING[:1] + [{"name": "train-3", "host": "esx-01", "ip": 103}])
        assert gpuvm("apply", str(room), "--yes").exit_code == 0  # the destroyed clone's room came back
        assert "train-3" in raw_state(sim)
    finally:
        sim.stop()


def test_the_from_template_playbook_creates_its_group_on_an_empty_lab(monkeypatch, tmp_path):
    """playbooks/lab-from-template.yaml (the second demo) on a lab with hosts and an older template but
    no VMs: the plan shows four clones spread over both hosts, each upgraded to vmx-19 (off: no
    disruption) and given two GPUs; the vSphere half applies and re-plans empty."""
    import json

    sim = Simulator(hosts=2, vms_per_host=0, rebind=True, templates=["ubuntu-22.04-gpu"], vm_version="vmx-15").start()
    try:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        (tmp_path / "key.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuvm test@gpuvm\n")
        text = (Path(__file__).parents[2] / "playbooks" / "lab-from-template.yaml").read_text()
        book = tmp_path / "lab-from-template.yaml"
        book.write_text(text.replace("../build/testbed/client_key.pub", str(tmp_path / "key.pub"))
                        .split("\nguests:")[0] + "\n")  # the vSphere half: the guests boot only on the bed
        planned = gpuvm("plan", str(book), "--json")
        assert planned.exit_code == 0, planned.output
        changes = json.loads(planned.output)["changes"]
        creates = {c["target"]: c["after"] for c in changes if c["step"] == "vm.lifecycle"}
        assert creates == {f"train-0{n}": f"create: clone of ubuntu-22.04-gpu on esx-0{2 - n % 2}, datastore LocalDS_0"
                           for n in range(1, 5)}, creates
        upgrades = [(c["target"], c["before"], c["after"], c["disruption"]) for c in changes if c["step"] == "vm.version"]
        assert upgrades == [(f"train-0{n}", "vmx-15", "vmx-19", "none") for n in range(1, 5)]
        assert set(raw_state(sim)) == {"esx-01", "esx-02", "ubuntu-22.04-gpu"}, "plan created something"
        applied = gpuvm("apply", str(book), "--yes")
        assert applied.exit_code == 0, applied.output
        state = raw_state(sim)
        assert all(state[f"train-0{n}"]["version"] == "vmx-19" and len(state[f"train-0{n}"]["pci"]) == 2
                   and state[f"train-0{n}"]["power"] == "poweredOn" for n in range(1, 5)), state
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0
    finally:
        sim.stop()


def test_a_clone_goes_into_the_runbooks_vm_folder_and_resource_pool(monkeypatch, tmp_path):
    from tests.integration.vcenter import pyvmomi

    sim = simulator(monkeypatch, tmp_path, vm_folders=["gpu-train"], resource_pools=["training"])
    try:
        wrong = runbook(tmp_path, TRAINING[:1], extra="    folder: gpu-trian\n")
        refused = gpuvm("plan", str(wrong))
        assert refused.exit_code == 2
        assert ("runbook.yaml:13: vms[0].folder: VM folder 'gpu-trian' for VM 'train-1' not found in vCenter "
                "(VM folders: gpu-train, vm)") in " ".join(refused.output.split()), refused.output
        no_pool = runbook(tmp_path, TRAINING[:1], extra="    resource_pool: inference\n")
        refused = gpuvm("plan", str(no_pool))
        assert refused.exit_code == 2
        assert ("vms[0].resource_pool: VM train-1: resource pool 'inference' is not a pool of esx-01's cluster "
                "(its pools: Resources, training)") in " ".join(refused.output.split()), refused.output
        book = runbook(tmp_path, TRAINING[:1], extra="    folder: gpu-train\n    resource_pool: training\n")
        planned = gpuvm("plan", str(book))
        assert "datastore LocalDS_0, folder gpu-train, resource pool training" in " ".join(planned.output.split()), \
            planned.output
        assert gpuvm("apply", str(book), "--yes").exit_code == 0
        with pyvmomi(sim) as si:
            vm = si.content.searchIndex.FindByInventoryPath("DC0/vm/gpu-train/train-1")
            assert vm is not None and vm.resourcePool.name == "training"
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0
    finally:
        sim.stop()
