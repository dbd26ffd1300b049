"""esxi.mig, guest.mig and guest.nic against the SSH test bed: plan → apply → re-plan is empty.

Every test puts the bed hosts it touches back as it found them (tool state and links), so the
other bed tests see fresh hosts.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import textwrap

import pytest

from gpuvm.steps.base import Context
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.parsers import mlxconfig, nvidia_smi
from gpuvm.plan import Disruption
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import esxi_mig, guest_mig, guest_nic, guest_nic_ats

pytestmark = pytest.mark.integration

TOUCHED = ("esx-01", "gpu-vm-01", "gpu-vm-02")
CONFIG = ("gpus", "mlx", "kernel", "mst_started")  # the tool state a dry run must not change (mst_started: see nic test)


@pytest.fixture(autouse=True)
def restore(testbed):
    saved = {name: testbed.state(name) for name in TOUCHED}
    yield
    for name, state in saved.items():
        for key, value in state.items():
            testbed.set_state(name, key, value)
    for name in TOUCHED[1:]:
        ip = ["ip", "-n", testbed.netns(name)]
        for nic in ("ens64np1", "ens64np2"):
            subprocess.run(ip + ["addr", "flush", "dev", nic], check=True)
            subprocess.run(ip + ["link", "set", "dev", nic, "down", "mtu", "1500"], check=True)


def make_cluster(bed, tmp_path, host: str = "", guests: dict[str, str] | None = None):
    """A runbook for esx-01 and the named guests (their extra YAML lines), and its cluster."""
    def ssh(name):
        h = bed.host(name)
        return f"{{address: {h.address}, user: {h.user}, key_file: {h.key_file}}}"

    guests = guests or {}
    text = f"""
ssh: {{known_hosts: {bed.known_hosts_file}}}
hosts:
  - name: esx-01
    ssh: {ssh("esx-01")}
{textwrap.indent(textwrap.dedent(host).strip(), "    ")}
vms:
{"".join(f"  - {{name: {g}, host: esx-01}}" + chr(10) for g in guests) or "  []"}
"""
    if guests:
        text += "guests:\n  hosts:\n" + "".join(
            f"    - vm: {g}\n      ssh: {ssh(g)}\n{textwrap.indent(textwrap.dedent(extra).strip(), ' ' * 6)}\n"
            for g, extra in guests.items())
    path = tmp_path / "runbook.yaml"
    path.write_text(text)
    cluster = build_cluster(load_runbook(path), tmp_path / "state")
    return cluster


def plan_of(step, cluster, name):
    target = cluster.targets[name]
    return step.plan(target, step.observe(Context(cluster=cluster), target))


def configuration(bed, name):
    state = bed.state(name)
    return {k: state.get(k) for k in CONFIG}


# -- esxi.mig ---------------------------------------------------------------------------------

def test_esxi_mig_pending_until_the_host_reboots(testbed, tmp_path):
    cluster = make_cluster(testbed, tmp_path, host="mig: all")
    try:
        before = configuration(testbed, "esx-01")
        changes = plan_of(esxi_mig, cluster, "esx-01")
        assert [(c.resource, c.before, c.after, c.disruption) for c in changes] == [
            (f"GPU {i} (NVIDIA A100 80GB PCIe)", "Disabled", "Enabled", Disruption.HOST_REBOOT) for i in range(4)]
        assert configuration(testbed, "esx-01") == before  # observing and planning is a dry run

        esxi_mig.apply(Context(cluster=cluster), cluster.targets["esx-01"], changes)
        pending = plan_of(esxi_mig, cluster, "esx-01")
        assert [(c.before, c.after, c.disruption, c.action) for c in pending] == [
            ("Disabled (pending Enabled)", "Enabled (after reboot)", Disruption.HOST_REBOOT, None)] * 4
        esxi_mig.apply(Context(cluster=cluster), cluster.targets["esx-01"], pending)  # nothing to run: waiting for the reboot
        assert [g["mig_pending"] for g in testbed.state("esx-01")["gpus"]] == ["Enabled"] * 4

        cluster.executors["esx-01"].run(["gpuvm-fake-reboot"])
        assert plan_of(esxi_mig, cluster, "esx-01") == []
        modes = nvidia_smi.parse_mig_query_csv(cluster.executors["esx-01"].run(esxi_mig.QUERY).stdout)
        assert {(m.current, m.pending) for m in modes} == {("Enabled", "Enabled")}
    finally:
        cluster.close()


def test_esxi_mig_names_a_missing_gpu(testbed, tmp_path):
    cluster = make_cluster(testbed, tmp_path, host="mig: [1, 7]")
    try:
        with pytest.raises(InputError, match=r"runbook\.yaml:\d+: hosts\[0\]\.mig: esxi\.mig: host esx-01: GPU 7 not found"):
            plan_of(esxi_mig, cluster, "esx-01")
    finally:
        cluster.close()


# -- guest.mig --------------------------------------------------------------------------------

PER_DEVICE = """
mig:
  - {devices: [0, 1], mig-enabled: true, mig-devices: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
  - {devices: [2], mig-enabled: true, mig-devices: {"7g.80gb": 1}}
  - {devices: [3], mig-enabled: false}
"""


def converge(step, cluster, names):
    for name in names:
        changes = plan_of(step, cluster, name)
        assert changes, f"nothing planned for {name}"
        step.apply(Context(cluster=cluster), cluster.targets[name], changes)
    for name in names:
        assert plan_of(step, cluster, name) == [], f"{name} still has changes"


def test_guest_mig_layouts(testbed, tmp_path):
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-01": "mig: all-3g.40gb", "gpu-vm-02": PER_DEVICE})
    try:
        before = {n: configuration(testbed, n) for n in ("gpu-vm-01", "gpu-vm-02")}
        first = plan_of(guest_mig, cluster, "gpu-vm-01")
        assert [(c.resource[:5], c.field, c.before, c.after) for c in first[:2]] == [
            ("GPU 0", "mig.mode", "Disabled", "Enabled"), ("GPU 0", "gpu instances", "none", "3g.40gb x2")]
        assert len(first) == 8
        plan_of(guest_mig, cluster, "gpu-vm-02")
        assert {n: configuration(testbed, n) for n in before} == before  # a dry run changes nothing

        converge(guest_mig, cluster, ["gpu-vm-01", "gpu-vm-02"])

        one = nvidia_smi.parse_gpu_list(cluster.executors["gpu-vm-01"].run(["nvidia-smi", "-L"]).stdout)
        assert [[d.profile for d in g.mig_devices] for g in one] == [["3g.40gb", "3g.40gb"]] * 4
        two = nvidia_smi.parse_gpu_list(cluster.executors["gpu-vm-02"].run(["nvidia-smi", "-L"]).stdout)
        assert [sorted(d.profile for d in g.mig_devices) for g in two] == [
            ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]] * 2 + [["7g.80gb"], []]
        assert [g["mig_current"] for g in testbed.state("gpu-vm-02")["gpus"]] == ["Enabled"] * 3 + ["Disabled"]
    finally:
        cluster.close()


def test_guest_mig_relayout_then_disable(testbed, tmp_path):
    for layout in ("all-3g.40gb", "all-1g.10gb", "all-disabled"):
        cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-01": f"mig: {layout}"})
        try:
            converge(guest_mig, cluster, ["gpu-vm-01"])
            gpus = testbed.state("gpu-vm-01")["gpus"]
            if layout == "all-disabled":
                assert {(g["mig_current"], len(g["gpu_instances"])) for g in gpus} == {("Disabled", 0)}
            else:
                assert {len(g["gpu_instances"]) for g in gpus} == {2 if layout == "all-3g.40gb" else 7}
        finally:
            cluster.close()


def test_guest_mig_pending_mode_needs_a_reset(testbed, tmp_path):
    testbed.set_state("gpu-vm-02", "mig_needs_reset", True)
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-02": "mig: [{devices: [0], mig-enabled: true, "
                                                                  "mig-devices: {\"4g.40gb\": 1}}]"})
    try:
        target = cluster.targets["gpu-vm-02"]
        with pytest.raises(RemoteCommandError, match=r"^GPU 0: MIG mode Enabled is pending until the "
                                                     r"GPU is reset"):
            guest_mig.apply(Context(cluster=cluster), target, plan_of(guest_mig, cluster, "gpu-vm-02"))
        changes = plan_of(guest_mig, cluster, "gpu-vm-02")
        assert [(c.field, c.after, c.disruption) for c in changes] == [
            ("mig.mode", "Enabled (GPU reset)", Disruption.VM_POWER_OFF), ("gpu instances", "4g.40gb x1", Disruption.NONE)]
        guest_mig.apply(Context(cluster=cluster), target, changes)
        assert plan_of(guest_mig, cluster, "gpu-vm-02") == []
    finally:
        cluster.close()


def test_guest_mig_refuses_a_profile_of_another_gpu(testbed, tmp_path):
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-01": "mig: all-1g.5gb"})
    try:
        with pytest.raises(InputError, match=r"guest gpu-vm-01: layout all-1g\.5gb: profile 1g\.5gb is not a MIG profile "
                                             r"of GPU 0 \(NVIDIA A100 80GB PCIe\)"):
            plan_of(guest_mig, cluster, "gpu-vm-01")
    finally:
        cluster.close()


def test_guest_mig_on_h200s_plans_from_their_own_list(testbed, tmp_path):
    """A guest whose GPUs are H200s (the stand-in then lists an H200's real `nvidia-smi mig -lgip`)."""
    testbed.set_state("gpu-vm-01", "gpus", [dict(g, name="NVIDIA H200") for g in testbed.state("gpu-vm-01")["gpus"]])
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-01": "mig: all-3g.71gb"})
    try:
        first = plan_of(guest_mig, cluster, "gpu-vm-01")
        assert [(c.resource, c.after) for c in first if c.field == "gpu instances"] == [
            (f"GPU {i} (NVIDIA H200)", "3g.71gb x2") for i in range(4)]
        converge(guest_mig, cluster, ["gpu-vm-01"])
        listed = nvidia_smi.parse_gpu_list(cluster.executors["gpu-vm-01"].run(["nvidia-smi", "-L"]).stdout)
        assert [[d.profile for d in g.mig_devices] for g in listed] == [["3g.71gb", "3g.71gb"]] * 4
    finally:
        cluster.close()
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-01": "mig: all-3g.40gb"})
    try:
        with pytest.raises(InputError, match=r"guest gpu-vm-01: layout all-3g\.40gb: profile 3g\.40gb is not a MIG profile of "
                                             r"GPU 0 \(NVIDIA H200\); its profiles are 1g\.18gb, 1g\.18gb\+me, 1g\.35gb, "
                                             r"2g\.35gb, 3g\.71gb, 4g\.71gb, 7g\.141gb$"):
            plan_of(guest_mig, cluster, "gpu-vm-01")
    finally:
        cluster.close()


# -- guest.nic --------------------------------------------------------------------------------

NIC = """
nic_ats: true
rdma_ports:
  - {device: mlx5_0, port: 1, ip: 192.168.100.11/24, mtu: 9000}
"""


def links(cluster, name):
    return {e["ifname"]: e for e in json.loads(cluster.executors[name].run(["ip", "-j", "addr", "show"]).stdout)}


def test_guest_nic(testbed, tmp_path):
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-01": NIC})
    try:
        before_links = links(cluster, "gpu-vm-01")["ens64np1"]
        ats = plan_of(guest_nic_ats, cluster, "gpu-vm-01")
        assert [(c.field, c.before, c.after, c.disruption) for c in ats] == [
            ("ATS_ENABLED", False, True, Disruption.HOST_REBOOT)]
        changes = plan_of(guest_nic, cluster, "gpu-vm-01")
        assert [(c.field, c.before, c.after, c.disruption) for c in changes] == [
            ("mtu", 1500, 9000, Disruption.NONE), ("state", "down", "up", Disruption.NONE),
            ("address", "absent", "192.168.100.11/24", Disruption.NONE)]
        assert changes[0].resource == "ens64np1 (mlx5_0 port 1)"
        # a dry run changes nothing: no setting, and it does not even load the MST driver
        assert testbed.state("gpu-vm-01")["mlx"]["ATS_ENABLED"]["next"] == "False(0)"
        assert not testbed.state("gpu-vm-01").get("mst_started")
        assert links(cluster, "gpu-vm-01")["ens64np1"] == before_links

        guest_nic_ats.apply(Context(cluster=cluster), cluster.targets["gpu-vm-01"], ats)
        guest_nic.apply(Context(cluster=cluster), cluster.targets["gpu-vm-01"], changes)
        assert plan_of(guest_nic, cluster, "gpu-vm-01") == []
        [pending] = plan_of(guest_nic_ats, cluster, "gpu-vm-01")  # set for the next boot, not active
        assert pending.pending and (pending.before, pending.after) == (False, True)

        nic = links(cluster, "gpu-vm-01")["ens64np1"]
        assert "UP" in nic["flags"] and nic["mtu"] == 9000
        assert ipaddress.ip_interface("192.168.100.11/24") in [
            ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}") for a in nic["addr_info"]]
        run = cluster.executors["gpu-vm-01"].run
        params = mlxconfig.parse_mlxconfig_params(
            run(["mlxconfig", "-d", "ca:00.0", "-e", "q", "ATS_ENABLED"], sudo=True).stdout)
        assert (params["ATS_ENABLED"].current, params["ATS_ENABLED"].next_boot) == ("False(0)", "True(1)")  # host reboot
        assert "mlx5_0 port 1 ==> ens64np1 (Up)" in run(["ibdev2netdev"]).stdout
        testbed.reboot("gpu-vm-01")  # its host rebooted: the card runs what was set
        assert plan_of(guest_nic_ats, cluster, "gpu-vm-01") == []

        guest_nic.apply(Context(cluster=cluster), cluster.targets["gpu-vm-01"], [])  # idempotent: nothing to do, nothing done
        assert plan_of(guest_nic, cluster, "gpu-vm-01") == []
    finally:
        cluster.close()


def test_guest_nic_by_interface_and_unknown_port(testbed, tmp_path):
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-02": "rdma_ports: [{interface: ens64np2, mtu: 4200}]"})
    try:
        converge(guest_nic, cluster, ["gpu-vm-02"])
        assert links(cluster, "gpu-vm-02")["ens64np2"]["mtu"] == 4200
    finally:
        cluster.close()
    cluster = make_cluster(testbed, tmp_path, guests={"gpu-vm-02": "rdma_ports: [{device: mlx5_3, port: 1}]"})
    try:
        with pytest.raises(InputError, match=r"guest gpu-vm-02: port mlx5_3 port 1 not found by ibdev2netdev"):
            plan_of(guest_nic, cluster, "gpu-vm-02")
    finally:
        cluster.close()
