"""resolve_ssh: the runbook's ESXi shells and guests as typed desired state, and SSH steps that read
only that (issue 23: no step reads the raw runbook, no step case embeds one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from gpuvm.desired import DesiredEsxi, DesiredGuest
from gpuvm.desired.ssh import DriverInstall, GuestImage, GuestLicence, GuestMesh, Login, RdmaStack, VgpuManager
from gpuvm.engine import STEPS
from gpuvm.image import recipe
from gpuvm.resolve_ssh import resolve_ssh
from gpuvm.runbook.loader import load_runbook

ROOT = Path(__file__).resolve().parents[2]
SHA = "a" * 64
RUNBOOK = f"""\
hosts:
  - name: esx-01
    ssh: {{address: esx-01.lab, user: root}}
    mig: [0, 1]
    ats: true
    nvlink: [[0000:17:00.0, 0000:31:00.0]]
  - name: esx-02
vms: [{{name: gpu-vm-01, host: esx-01}}, {{name: gpu-vm-02, host: esx-01}}]
guests:
  image: {{horovod: 0.28.1, registry: r.example:5000}}
  driver: {{version: 535.183.01, sha256: {SHA}}}
  rdma: {{stack: mofed, version: 5.8-3.0.7.0, installer: "https://mlnx.example/{{version}}.tgz", sha256: {SHA}}}
  ssh_mesh: {{container_port: 12345}}
  hosts:
    - {{vm: gpu-vm-01, ssh: {{address: 10.0.0.11, user: gpuadmin, sudo: true}}, mig: all-3g.40gb}}
    - vm: gpu-vm-02
      ssh: {{address: 10.0.0.12, port: 2222}}
      nic_ats: true
      rdma_ports:
        - {{device: mlx5_0, ip: 192.168.100.12/24}}
        - {{interface: ens64np2, mtu: 9000}}
"""


def _resolved(tmp_path: Path, text: str = RUNBOOK):
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    book = load_runbook(path)
    return book, resolve_ssh(book)


def test_hosts_with_a_shell_then_guests_each_with_the_settings_it_needs(tmp_path):
    book, targets = _resolved(tmp_path)
    assert list(targets) == ["esx-01", "gpu-vm-01", "gpu-vm-02"]  # esx-02 has no shell
    esxi = targets["esx-01"]
    assert esxi == DesiredEsxi("esx-01", Login("esx-01.lab"), ("hosts", 0), mig=(0, 1), ats=True,
                               nvlink=(("0000:17:00.0", "0000:31:00.0"),))
    first, second = targets["gpu-vm-01"], targets["gpu-vm-02"]
    rendered = recipe(book.guests.image)
    image = GuestImage(rendered.ref, rendered.dockerfile, "gpu-vm-01", "r.example:5000")
    driver = DriverInstall("535.183.01",
                           "https://us.download.nvidia.com/tesla/535.183.01/NVIDIA-Linux-x86_64-535.183.01.run", SHA)
    rdma = RdmaStack("mofed", "5.8-3.0.7.0", "https://mlnx.example/5.8-3.0.7.0.tgz", SHA)
    assert first == DesiredGuest("gpu-vm-01", Login("10.0.0.11", "gpuadmin", sudo=True), ("guests", "hosts", 0),
                                 driver=driver, rdma=rdma, mig="all-3g.40gb", image=image,
                                 mesh=GuestMesh("gpuadmin", 12345))
    assert second.login == Login("10.0.0.12", "root", 2222) and second.nic_ats is True
    assert [p.describe() for p in second.rdma_ports] == ["mlx5_0 port 1", "ens64np2"]
    assert (second.image, second.driver, second.rdma) == (image, driver, rdma)  # guest-wide: the same on all
    assert second.mesh == GuestMesh("root", 12345)  # the mesh user defaults to each guest's SSH user
    assert (first.role, esxi.role) == ("guest", "esxi") and not second.root and first.root


def test_the_builder_named_and_what_is_left_out(tmp_path):
    text = RUNBOOK.replace("registry: r.example:5000", "builder: gpu-vm-02").replace(
        "ssh_mesh: {container_port: 12345}", "ssh_mesh: {enabled: false}")
    _, targets = _resolved(tmp_path, text)
    assert {t.image.builder for t in targets.values() if isinstance(t, DesiredGuest)} == {"gpu-vm-02"}
    assert all(t.mesh is None for t in targets.values() if isinstance(t, DesiredGuest))
    _, bare = _resolved(tmp_path, "hosts: [{name: esx-01}]\nvms: [{name: vm-1, host: esx-01}]\n"
                                  "guests:\n  hosts: [{vm: vm-1, ssh: {address: 10.0.0.1}}]\n")
    assert bare == {"vm-1": DesiredGuest("vm-1", Login("10.0.0.1"), ("guests", "hosts", 0))}


def test_the_vgpu_manager_and_the_licence_each_target_needs(tmp_path):
    bundle = "/vmfs/volumes/ds1/NVD-AIE-800_535.154.02-1OEM.800.1.0.20613240_1.zip"
    text = RUNBOOK.replace("    ats: true\n", f"    ats: true\n    nvidia_host_driver: {{bundle: {bundle}, "
                           f"version: 535.154.02, sha256: {SHA}, state: absent}}\n").replace(
        "{name: gpu-vm-01, host: esx-01}", "{name: gpu-vm-01, host: esx-01, gpus: {mode: passthrough, count: 1}}"
    ).replace("  ssh_mesh:", "  licensing: {token_file: nls.tok, passthrough: vcs, min_validity: 172800}\n  ssh_mesh:")
    _, targets = _resolved(tmp_path, text)
    assert targets["esx-01"].host_driver == VgpuManager(bundle, "535.154.02", SHA, state="absent")
    assert not targets["esx-01"].runs_manager
    line = text.splitlines().index("  licensing: {token_file: nls.tok, passthrough: vcs, min_validity: 172800}") + 1
    assert targets["gpu-vm-01"].licence == GuestLicence(tmp_path / "nls.tok", 4, 172800, 120,
                                                        f"{tmp_path / 'rb.yaml'}:{line}: guests.licensing.token_file")
    assert targets["gpu-vm-02"].licence is None  # a VM without GPUs needs no licence


def test_an_error_names_the_runbook_line_of_the_field(tmp_path):
    _, targets = _resolved(tmp_path)
    error = targets["gpu-vm-02"].error("guest.nic", ("rdma_ports", 1), "interface ens64np2 not found")
    line = RUNBOOK.splitlines().index("        - {interface: ens64np2, mtu: 9000}") + 1
    assert str(error) == f"{tmp_path / 'rb.yaml'}:{line}: guests.hosts[1].rdma_ports[1]: guest.nic: guest gpu-vm-02: " \
                         "interface ens64np2 not found"
    assert str(targets["esx-01"].error("esxi.mig", ("mig",), "GPU 5 not found")).startswith(
        f"{tmp_path / 'rb.yaml'}:4: hosts[0].mig: esxi.mig: host esx-01: ")
    # given as data (a step case), the field alone
    assert str(DesiredEsxi("esx-01", Login("a"), ("hosts", 0)).error("esxi.ats", (), "x")) == \
        "hosts[0]: esxi.ats: host esx-01: x"


SSH_STEP_FILES = sorted(p for p in (ROOT / "src/gpuvm/steps").rglob("*.py")
                        if p.name.startswith(("esxi_", "guest_", "installer")) or "guest_ssh_mesh" in p.parts)


@pytest.mark.parametrize("path", SSH_STEP_FILES, ids=lambda p: str(p.relative_to(ROOT / "src/gpuvm/steps")))
def test_ssh_steps_read_desired_state_never_the_runbook(path):
    tree = ast.parse(path.read_text())
    read = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("runbook", "access")})
    imported = sorted({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                       and n.module.startswith(("gpuvm.runbook", "gpuvm.resolve"))})
    assert (read, imported) == ([], [])


def test_ssh_step_cases_give_the_desired_target_not_a_runbook():
    roles = {s.name: s.role for s in STEPS if s.over_ssh}
    for path in sorted((ROOT / "tests/steps").glob("*/*.yaml")):
        if path.parent.name in roles:
            case = YAML(typ="safe").load(path.read_text())
            assert "runbook" not in case and roles[path.parent.name] in case, path.relative_to(ROOT)
