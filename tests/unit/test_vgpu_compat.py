"""NVIDIA's vGPU manager / guest driver compatibility, and the runbook refusing a guest driver that
cannot load in a VM (wrong kind, or a vGPU branch the host's manager does not accept)."""

from __future__ import annotations

import textwrap

import pytest

from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook
from gpuvm.vgpu_compat import compatible

SHA = "a" * 64


@pytest.mark.parametrize("manager, guest, ok", [
    ("535.154.02", "535.154.05", True),  # same release (vGPU 16.3)
    ("535.161.05", "535.54.03", True),  # same branch, another release
    ("550.54.16", "535.154.05", True),  # a later branch with guest drivers of the branch just before
    ("535.154.02", "550.54.15", False),  # a guest driver newer than the manager's branch
    ("550.54.16", "525.85.05", False),  # two branches back
    ("535.154.02", "470.223.02", True),  # a long-term support manager with the previous LTS branch
    ("570.124.03", "470.223.02", False),  # not an LTS manager
    ("570.124.03", "535.154.05", False),  # R550 is the branch before R570, not R535
    ("999.10.01", "999.12.02", True),  # an unknown branch: its own only
    ("999.10.01", "580.65.06", False),
])
def test_nvidia_compatibility_rule(manager, guest, ok):
    assert compatible(manager, guest) is ok


def write(tmp_path, driver: str, gpus: str = "{mode: vgpu, profile: grid_a100d-4c}", manager: str = "535.154.02"):
    path = tmp_path / "runbook.yaml"
    path.write_text(textwrap.dedent(f"""\
        hosts:
          - name: esx-01
            ssh: {{address: 10.0.0.11, user: root}}
            nvidia_host_driver: {{bundle: /vmfs/volumes/ds1/NVD-AIE-800_{manager}-1OEM.800.1.0.20613240_1.zip, version: {manager}, sha256: "{SHA}"}}
        vms:
          - {{name: vm1, host: esx-01, gpus: {gpus}}}
        guests:
          driver: {driver}
          hosts:
            - {{vm: vm1, ssh: {{address: 10.0.0.21, user: gpuadmin}}}}
        """))
    return path


def test_a_vgpu_guest_driver_from_a_newer_branch_than_the_hosts_manager_is_refused(tmp_path):
    path = write(tmp_path, f'{{version: 550.54.15, kind: vgpu, sha256: "{SHA}"}}')
    with pytest.raises(InputError, match=r"runbook\.yaml:\d+: guests\.driver\.version: VM 'vm1' on host esx-01: "
                                         r"guest driver 550\.54\.15 \(vGPU 17, R550\) does not load on the host's "
                                         r"vGPU manager 535\.154\.02 \(vGPU 16, R535\)") as refused:
        load_runbook(path)
    assert refused.value.exit_code == 2


def test_a_compatible_vgpu_guest_driver_is_accepted(tmp_path):
    load_runbook(write(tmp_path, f'{{version: 535.154.05, kind: vgpu, sha256: "{SHA}"}}'))


def test_the_data_center_driver_is_refused_in_a_vgpu_vm_and_the_vgpu_driver_in_a_passthrough_vm(tmp_path):
    with pytest.raises(InputError, match=r"guests\.driver\.kind: VM 'vm1' on host esx-01 has vGPU grid_a100d-4c: "
                                         r"it needs NVIDIA's vGPU guest driver \(kind: vgpu\)"):
        load_runbook(write(tmp_path, f'{{version: 535.154.05, sha256: "{SHA}"}}'))
    with pytest.raises(InputError, match=r"guests\.driver\.kind: VM 'vm1' on host esx-01 has GPUs in passthrough "
                                         r"\(passthrough\): it needs NVIDIA's data-center driver"):
        load_runbook(write(tmp_path, f'{{version: 535.154.05, kind: vgpu, sha256: "{SHA}"}}',
                           gpus="{mode: passthrough, count: 1}"))


def test_the_host_driver_needs_an_esxi_shell_and_a_sha256(tmp_path):
    path = tmp_path / "runbook.yaml"
    path.write_text("hosts:\n  - {name: esx-01, nvidia_host_driver: {bundle: /vmfs/volumes/ds1/x.zip, version: 535.154.02}}\n")
    with pytest.raises(InputError, match=r"hosts\[0\]\.nvidia_host_driver\.sha256: required field is missing"):
        load_runbook(path)
    path.write_text(f"hosts:\n  - {{name: esx-01, nvidia_host_driver: {{bundle: /vmfs/volumes/ds1/x.zip, "
                    f"version: 535.154.02, sha256: '{SHA}'}}}}\n")
    with pytest.raises(InputError, match=r"hosts\[0\]: nvidia_host_driver is set through the ESXi shell"):
        load_runbook(path)


def test_plan_refuses_a_mismatched_guest_driver_with_exit_2_before_connecting(tmp_path):
    from typer.testing import CliRunner

    from gpuvm.cli.main import app

    path = write(tmp_path, f'{{version: 550.54.15, kind: vgpu, sha256: "{SHA}"}}')
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert "VM 'vm1' on host esx-01" in result.output and "550.54.15" in result.output and "535.154.02" in result.output
    assert "Traceback" not in result.output


def mixed(tmp_path, drivers: str, own: str = ""):
    """A passthrough VM, a vGPU VM and a VM without GPUs, a guest in each; no vGPU manager in the runbook."""
    path = tmp_path / "runbook.yaml"
    path.write_text(textwrap.dedent(f"""\
        hosts:
          - {{name: esx-01, ssh: {{address: 10.0.0.11, user: root}}}}
          - {{name: esx-02, ssh: {{address: 10.0.0.12, user: root}}}}
        vms:
          - {{name: pt, host: esx-01, gpus: {{mode: passthrough, count: 1}}}}
          - {{name: vg, host: esx-02, gpus: {{mode: vgpu, profile: grid_a100d-4c}}}}
          - {{name: cpu, host: esx-02}}
        guests:
          {drivers}
          hosts:
            - {{vm: pt, ssh: {{address: 10.0.0.21, user: gpuadmin}}}}
            - {{vm: vg, ssh: {{address: 10.0.0.22, user: gpuadmin}}{own}}}
            - {{vm: cpu, ssh: {{address: 10.0.0.23, user: gpuadmin}}}}
        """))
    return path


DATACENTER = f'{{version: 535.183.01, sha256: "{SHA}"}}'
VGPU = f'{{version: 535.154.05, kind: vgpu, sha256: "{SHA}"}}'


def drivers_of(runbook):
    from gpuvm.resolve_ssh import resolve_ssh

    targets = resolve_ssh(runbook)
    guests = {n: t.driver.version if t.driver else None for n, t in targets.items() if t.role == "guest"}
    checked = {n: [(g.vm, g.version, g.where) for g in t.vgpu_guests] for n, t in targets.items() if t.role == "esxi"}
    return guests, checked


def test_a_passthrough_vm_and_a_vgpu_vm_each_get_their_kind_of_driver_and_a_vm_without_gpus_none(tmp_path):
    guests, checked = drivers_of(load_runbook(mixed(tmp_path, f"driver: [{DATACENTER}, {VGPU}]")))
    assert guests == {"pt": "535.183.01", "vg": "535.154.05", "cpu": None}
    # the vGPU VM's host is given no manager: the one it runs is read and checked (esxi.vgpu_manager)
    assert checked == {"esx-01": [], "esx-02": [("vg", "535.154.05", ("guests", "driver", 1, "version"))]}


def test_a_guest_of_its_own_driver_over_the_guest_wide_one(tmp_path):
    guests, checked = drivers_of(load_runbook(mixed(tmp_path, f"driver: {DATACENTER}", own=f", driver: {VGPU}")))
    assert guests == {"pt": "535.183.01", "vg": "535.154.05", "cpu": "535.183.01"}  # one driver: every guest
    assert checked["esx-02"] == [("vg", "535.154.05", ("guests", "hosts", 1, "driver", "version"))]
    guests, _ = drivers_of(load_runbook(mixed(tmp_path, f"driver: [{DATACENTER}, {VGPU}]", own=", driver: none")))
    assert guests == {"pt": "535.183.01", "vg": None, "cpu": None}


@pytest.mark.parametrize("drivers, own, error", [
    (f"driver: {DATACENTER}", "", r"guests\.driver\.kind: VM 'vg' on host esx-02 has vGPU grid_a100d-4c: it needs "
                                  r"NVIDIA's vGPU guest driver"),
    (f"driver: [{DATACENTER}]", "", r"guests\.driver: VM 'vg' has vGPU grid_a100d-4c: guests\.driver lists no "
                                    r"kind: vgpu driver for it"),
    (f"driver: [{VGPU}, {VGPU}]", "", r"guests\.driver\[1\]\.kind: a second vgpu driver \(also guests\.driver\[0\]\)"),
    (f"driver: [{DATACENTER}]", f", driver: {DATACENTER}",
     r"guests\.hosts\[1\]\.driver\.kind: VM 'vg' on host esx-02 has vGPU grid_a100d-4c"),
])
def test_a_driver_that_does_not_suit_its_vm_is_refused_at_the_field_that_chose_it(tmp_path, drivers, own, error):
    with pytest.raises(InputError, match=r"runbook\.yaml:\d+: " + error):
        load_runbook(mixed(tmp_path, drivers, own))
