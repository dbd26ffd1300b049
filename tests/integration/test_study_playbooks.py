"""The study's runbooks (playbooks/study-scenario*.yaml) are valid and plan cleanly against a
simulated lab of the same shape (offline, from a snapshot: their vCenter is an example address)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session, Target

pytestmark = pytest.mark.integration
PLAYBOOKS = Path(__file__).parents[2] / "playbooks"


@pytest.mark.parametrize("name, hosts, vms_per_host, gpu_devices", [
    ("study-scenario1", 1, 2, {"esx-01-vm1": 3, "esx-01-vm2": 3}),
    ("study-scenario2", 4, 1, {f"esx-0{i}-vm1": 2 for i in range(1, 5)}),
])
def test_study_runbook_plans_on_a_lab_of_its_shape(tmp_path, monkeypatch, name, hosts, vms_per_host, gpu_devices):
    monkeypatch.setenv("VCENTER_PASSWORD", "unused")
    with Simulator(hosts=hosts, vms_per_host=vms_per_host) as sim:
        target = Target(sim.host, sim.port, "/sdk", sim.username, sim.password, False, sim.cert_file)
        with Session(target) as session:
            read_inventory(session).save(tmp_path / "inventory.json")
    runbook = PLAYBOOKS / f"{name}.yaml"
    assert CliRunner().invoke(app, ["validate", str(runbook)]).exit_code == 0
    result = CliRunner().invoke(app, ["plan", str(runbook), "--snapshot", str(tmp_path / "inventory.json"), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    added = {}
    for change in plan["changes"]:
        if change["step"] == "vm.hardware" and change["field"] == "device":
            added[change["target"]] = added.get(change["target"], 0) + 1
    assert added == gpu_devices  # GPUs plus one ConnectX-6 port each
    mmio = {c["target"]: c["after"] for c in plan["changes"] if c["field"] == "pciPassthru.64bitMMIOSizeGB"}
    assert set(mmio.values()) == ({"512"} if name == "study-scenario1" else {"256"})


@pytest.mark.parametrize("name, hosts, vms_per_host", [("study-scenario1", 1, 2), ("study-scenario2", 4, 1)])
def test_study_runbook_applies_and_verifies_with_every_setting_active(tmp_path, monkeypatch, name, hosts, vms_per_host):
    """The vSphere half of each study runbook, applied on a simulated lab of its shape with its VMs
    running: plan → apply (VMs shut down for the reboots, hosts one at a time) → verify clean, every
    passthrough device active, every VM on with its GPUs."""
    from ruamel.yaml import YAML

    from tests.integration.test_vsphere_flow import vsphere_only

    runbook = vsphere_only(PLAYBOOKS / f"{name}.yaml", tmp_path / f"{name}.yaml")
    yaml = YAML()
    data = yaml.load(runbook.read_text())
    data["vcenter"].pop("url")  # the simulator's, from GOVC_URL
    data["vcenter"]["password_env"] = "GPUVM_VCENTER_PASSWORD"
    data.pop("benchmarks", None)
    with runbook.open("w") as out:
        yaml.dump(data, out)
    _, state = converge(runbook, monkeypatch, tmp_path, hosts=hosts, vms_per_host=vms_per_host)
    for host in (f"esx-0{i}" for i in range(1, hosts + 1)):
        assert all(enabled == active for _, enabled, active in state[host]["passthru"])
    vms = [v for v in state if "-vm" in v]
    assert vms and all(state[v]["power"] == "poweredOn" and len(state[v]["pci"]) >= 2 for v in vms)


def converge(runbook: Path, monkeypatch, tmp_path: Path, **lab):
    """On a simulated lab (`lab`: gpusim's options) with its VMs running: plan shows changes, apply
    makes them (VMs shut down for the reboots), verify is clean. The apply's result and the state."""
    from tests.integration.vcenter import raw_state, use_simulator

    with Simulator(vm_power="on", **lab) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        run = CliRunner().invoke
        assert run(app, ["plan", str(runbook), "--detailed-exitcode"]).exit_code == 2
        applied = run(app, ["apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off"])
        assert applied.exit_code == 0, applied.output
        verified = run(app, ["verify", str(runbook)])
        assert verified.exit_code == 0, verified.output
        return applied, raw_state(sim)


def study_for_bed(bed, name: str, target: Path) -> Path:
    """A study runbook pointed at the simulator and the SSH test bed: its ESXi shells and guests are
    the bed's test hosts, in order. The NGC training image cannot be pulled here: it is left out."""
    from ruamel.yaml import YAML

    from bed import GUEST_USER

    yaml = YAML()
    data = yaml.load((PLAYBOOKS / f"{name}.yaml").read_text())
    data["vcenter"].pop("url")
    data["vcenter"]["password_env"] = "GPUVM_VCENTER_PASSWORD"
    data["ssh"] = {"known_hosts": str(bed.known_hosts_file)}
    for i, host in enumerate(data["hosts"], 1):
        host["ssh"].update(address=bed.address(f"esx-{i:02d}"), key_file=str(bed.client_key))
    for i, guest in enumerate(data["guests"]["hosts"], 1):
        guest["ssh"].update(address=bed.address(f"gpu-vm-{i:02d}"), user=GUEST_USER, key_file=str(bed.client_key))
    data["guests"].pop("image")
    data.pop("benchmarks")
    with target.open("w") as out:
        yaml.dump(data, out)
    return target


def test_study_scenario2_end_to_end_with_every_setting_active(testbed, tmp_path, monkeypatch):
    """Scenario 2 whole (the image aside): four hosts with ESXi shells and four guests, VMs running.
    plan → apply → verify clean; ATS active on every ESXi host and every ConnectX card (set, then
    activated by the one reboot of each host), passthrough active, every VM on."""
    from bed import TestBed

    from tests.integration.vcenter import reboot_hook

    testbed.down()  # the session's bed has two ESXi shells: this lab needs four
    bed = TestBed(tmp_path / "bed", esxi=4, guests=4)
    try:
        bed.up()
        runbook = study_for_bed(bed, "study-scenario2", tmp_path / "scenario2.yaml")
        applied, state = converge(runbook, monkeypatch, tmp_path, hosts=4, vms_per_host=1,
                                  on_reboot=reboot_hook(bed, vms_per_host=1))
        for i in range(1, 5):
            assert all(enabled == active for _, enabled, active in state[f"esx-0{i}"]["passthru"])
            assert state[f"esx-0{i}-vm1"]["power"] == "poweredOn" and len(state[f"esx-0{i}-vm1"]["pci"]) == 2
            assert bed.state(f"esx-0{i}")["kernel"]["atsSupport"]["runtime"] == "TRUE"
            assert bed.state(f"gpu-vm-0{i}")["mlx"]["ATS_ENABLED"]["current"] == "True(1)"
        assert "rebooted" in " ".join(applied.output.split())
    finally:
        bed.down()
        testbed.up()


SETUPS = ("1vm-2gpu", "2vm-1gpu", "2vm-2gpu")
# what each setup lays out: VM → (power, passthrough devices: GPUs + the ConnectX port)
LAYOUTS = {
    "1vm-2gpu": {"esx-01-vm1": ("poweredOn", 3), "esx-01-vm2": ("poweredOff", 0)},
    "2vm-1gpu": {"esx-01-vm1": ("poweredOn", 2), "esx-01-vm2": ("poweredOn", 2)},
    "2vm-2gpu": {"esx-01-vm1": ("poweredOn", 3), "esx-01-vm2": ("poweredOn", 3)},
}
# gpuvm's PyTorch training benchmark, small enough for the CPU test hosts
TRAIN = {"kind": "pytorch_train", "model": "resnet18", "python": "/usr/bin/python3",
         "args": ["--image-size", "32", "--num-iters", "2", "--num-batches-per-iter", "2", "--num-warmup-batches", "1"]}


def _layout(sim) -> dict[str, tuple[str, int]]:
    from tests.integration.vcenter import raw_state

    state = raw_state(sim)
    assert all(enabled == active for _, enabled, active in state["esx-01"]["passthru"])  # every device active
    return {vm: (state[vm]["power"], len(state[vm]["pci"])) for vm in ("esx-01-vm1", "esx-01-vm2")}


def test_scenario1_setups_apply_one_after_another_and_back(tmp_path, monkeypatch):
    """The vSphere half of scenario 1's three setups, each planned, applied and verified clean with
    every passthrough device active, 1 → 2 → 3 and back to 1 (`apply --setup NAME`)."""
    from ruamel.yaml import YAML

    from tests.integration.test_vsphere_flow import vsphere_only
    from tests.integration.vcenter import use_simulator

    runbook = vsphere_only(PLAYBOOKS / "study-scenario1.yaml", tmp_path / "scenario1.yaml")
    yaml = YAML()
    data = yaml.load(runbook.read_text())
    data["vcenter"].pop("url")
    data["vcenter"]["password_env"] = "GPUVM_VCENTER_PASSWORD"
    bench = data["benchmarks"]
    bench["container"] = False
    for setup in bench["setups"]:
        setup.pop("guests", None)  # the guests are left out here (vCenter only)
    bench["runs"] = [{"name": "train", **TRAIN}]
    with runbook.open("w") as out:
        yaml.dump(data, out)
    with Simulator(hosts=1, vms_per_host=2, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        run = CliRunner().invoke
        for setup in (*SETUPS, SETUPS[0]):
            planned = run(app, ["plan", str(runbook), "--setup", setup, "--detailed-exitcode"])
            assert planned.exit_code == 2, planned.output
            applied = run(app, ["apply", str(runbook), "--setup", setup, "--yes", "--allow-host-reboot",
                                "--allow-power-off"])
            assert applied.exit_code == 0, applied.output
            verified = run(app, ["verify", str(runbook), "--setup", setup])
            assert verified.exit_code == 0, verified.output
            assert _layout(sim) == LAYOUTS[setup], setup
        # the base layout (2 VMs x 2 GPUs) is not the one applied last: verify says so
        assert run(app, ["verify", str(runbook)]).exit_code == 5
        unknown = run(app, ["apply", str(runbook), "--setup", "3vm"])
        assert unknown.exit_code == 2 and "--setup 3vm: no such setup" in unknown.output


@pytest.fixture
def fresh_bed(testbed):
    """This test sets addresses and the SSH mesh on two guests: leave new test hosts behind."""
    yield testbed
    testbed.up()


def test_scenario1_campaign_over_its_three_setups(fresh_bed, tmp_path, monkeypatch):
    """`bench run` of scenario 1 on the simulator + SSH test hosts: refused up front without
    --allow-power-off (nothing touched), then each setup planned, applied and measured in turn
    (gpuvm's PyTorch training per VM, all at once), results per setup and per VM, compared side by side."""
    from ruamel.yaml import YAML

    testbed = fresh_bed
    from gpuvm.bench.results import load_results
    from tests.integration.vcenter import raw_state, use_simulator

    yaml = YAML()
    data = yaml.load((PLAYBOOKS / "study-scenario1.yaml").read_text())
    data["vcenter"].pop("url")
    data["vcenter"]["password_env"] = "GPUVM_VCENTER_PASSWORD"
    data["ssh"] = {"known_hosts": str(testbed.known_hosts_file)}
    for host in data["hosts"]:
        for key in ("ssh", "ats"):
            host.pop(key)
    data["guests"].pop("image")
    data["guests"]["ssh_mesh"] = {"enabled": True}
    for guest, bed in zip(data["guests"]["hosts"], ("gpu-vm-01", "gpu-vm-02"), strict=True):
        host = testbed.host(bed)
        guest["ssh"] = {"address": host.address, "user": host.user, "key_file": str(host.key_file), "sudo": True}
        guest.pop("nic_ats")
    bench = data["benchmarks"]
    bench["container"] = False
    [run] = bench["runs"]
    run.pop("precision")
    run.update({**TRAIN, "batch_size": 8, "repeats": 1, "timeout": 180,
                "env": {"OMP_NUM_THREADS": "1"}, "mpirun_args": ["--oversubscribe"]})
    runbook = tmp_path / "scenario1.yaml"
    with runbook.open("w") as out:
        yaml.dump(data, out)

    gpuvm = CliRunner().invoke
    with Simulator(hosts=1, vms_per_host=2, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        dry = gpuvm(app, ["bench", "run", str(runbook), "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert "setup 2vm-1gpu: esx-01-vm1 on (1 passthrough GPU(s)), esx-01-vm2 on (1 passthrough GPU(s))" in dry.output
        assert "NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==ens64np1 btl_tcp_if_include=ens64np1" in dry.output

        before = raw_state(sim)
        refused = gpuvm(app, ["bench", "run", str(runbook), "--yes", "--allow-host-reboot", "--out", str(tmp_path / "r")])
        assert refused.exit_code == 2, refused.output
        assert "setup 1vm-2gpu → 2vm-1gpu: VM(s) esx-01-vm1 change layout" in refused.output
        assert raw_state(sim) == before and not (tmp_path / "r").exists()  # nothing touched

        ran = gpuvm(app, ["bench", "run", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off",
                          "--out", str(tmp_path / "results")])
        [directory] = list((tmp_path / "results").iterdir())
        logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(directory.rglob("*.log")))
        assert ran.exit_code == 0, ran.output + logs
        assert _layout(sim) == LAYOUTS["2vm-2gpu"]  # the last setup's layout
        results = load_results(directory)
        assert [(s.name, [(v.name, v.gpus) for v in s.vms]) for s in results.setups] == [
            ("1vm-2gpu", [("esx-01-vm1", 2)]),
            ("2vm-1gpu", [("esx-01-vm1", 1), ("esx-01-vm2", 1)]),
            ("2vm-2gpu", [("esx-01-vm1", 2), ("esx-01-vm2", 2)]),
        ]
        [bench_results] = results.benchmarks
        points = {p.setup: p for p in bench_results.points}
        assert list(points) == list(SETUPS)
        assert [(p.vms, p.gpus_per_node) for p in points.values()] == [(1, 2), (2, 2), (2, 4)]
        for setup, point in points.items():
            [repeat] = point.repeats
            assert repeat.error is None and repeat.value > 0, (setup, repeat)
            if point.vms == 2:
                assert set(repeat.per_vm) == {"esx-01-vm1", "esx-01-vm2"}
                assert repeat.value == pytest.approx(sum(repeat.per_vm.values()))
            assert point.network == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=ens64np1",
                                     "btl_tcp_if_include": "ens64np1"}
        compared = gpuvm(app, ["bench", "compare", str(directory)])
        assert compared.exit_code == 0, compared.output
        for setup in SETUPS:
            assert setup in compared.output
        assert "└ esx-01-vm2" in compared.output and "Setup" in compared.output
        report = gpuvm(app, ["bench", "report", str(directory), "--out", str(tmp_path / "report")])
        assert report.exit_code == 0, report.output
        assert "| 2vm-1gpu |" in (tmp_path / "report" / "report.md").read_text()
