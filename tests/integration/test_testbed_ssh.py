"""SshExecutor against the test bed's real OpenSSH servers, and the stand-in tools through the parsers."""

from __future__ import annotations

import logging
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.errors import ConnectError, HostKeyError, RemoteCommandError, TargetFailures
from gpuvm.executors import SshExecutor, run_group
from gpuvm.parsers import esxcli, ibdev2netdev, mlxconfig, mst, nvidia_smi

pytestmark = pytest.mark.integration


def executor(bed, name, **kwargs) -> SshExecutor:
    host = bed.host(name)
    kwargs.setdefault("known_hosts", [bed.known_hosts_file])
    return SshExecutor(name, host.address, host.user, key_file=host.key_file, connect_timeout=5, **kwargs)


@pytest.fixture
def guest(testbed):
    ex = executor(testbed, "gpu-vm-01")
    yield ex
    ex.close()


@pytest.fixture
def esx(testbed):
    ex = executor(testbed, "esx-01")
    yield ex
    ex.close()


def test_runs_on_every_host(testbed):
    for host in testbed.hosts:
        ex = executor(testbed, host.name)
        try:
            result = ex.run(["sh", "-c", 'echo "$(hostname) $(id -un)"'])
            assert result.stdout.split() == [host.name, host.user]
            assert ex.run(["nvidia-smi", "-L"]).stdout.startswith("GPU 0: NVIDIA A100 80GB PCIe")
        finally:
            ex.close()


def test_hosts_are_isolated(testbed):
    a, b = executor(testbed, "esx-01"), executor(testbed, "esx-02")
    a.run(["sh", "-c", "echo mine > /root/isolation-marker"])
    assert a.run(["cat", "/root/isolation-marker"]).stdout == "mine\n"
    assert b.run(["test", "-e", "/root/isolation-marker"], check=False).exit_code == 1
    g1, g2 = executor(testbed, "gpu-vm-01"), executor(testbed, "gpu-vm-02")
    g1.put(b"x", "/etc/gpuvm-marker", sudo=True)
    assert g2.run(["test", "-e", "/etc/gpuvm-marker"], check=False).exit_code == 1
    for ex in (a, b, g1, g2):
        ex.close()


def test_sudo_and_put_get(guest):
    assert guest.run(["id", "-u"], sudo=True).stdout == "0\n"
    guest.put(b"\x00binary\xff", "/root/blob", mode=0o600, sudo=True)
    assert guest.run(["stat", "-c", "%a %U", "/root/blob"], sudo=True).stdout == "600 root\n"
    guest.put(b"\x00binary\xff", "/home/gpuadmin/blob")
    assert guest.get("/home/gpuadmin/blob") == b"\x00binary\xff"


def test_unknown_host_key_is_refused(testbed):
    ex = executor(testbed, "esx-02", known_hosts=[])
    with pytest.raises(ConnectError, match=r"esx-02: host key for 10\.250\.0\.12:22 is unknown \(ssh-ed25519 SHA256:\S+\); pass --accept-new-host-keys"):
        ex.run(["true"])


def test_unknown_host_key_accepted_and_recorded(testbed, tmp_path, caplog):
    record = tmp_path / "known_hosts"
    ex = executor(testbed, "esx-02", known_hosts=[], accept_new_host_keys=True, record_to=record)
    assert ex.run(["hostname"]).stdout == "esx-02\n"
    line = record.read_text().strip()
    assert line == ex.host_key_line()
    assert line.split()[2] == testbed.host("esx-02").host_key_line.split()[2]
    assert "SHA256:" in caplog.text
    ex.close()
    # the recorded key is now known: a strict executor with that file connects
    strict = executor(testbed, "esx-02", known_hosts=[record])
    assert strict.run(["true"]).exit_code == 0
    strict.close()


def test_changed_host_key_is_refused_even_when_accepting(testbed, tmp_path):
    wrong = testbed.host("esx-01").host_key_line.split()
    changed = tmp_path / "known_hosts"
    changed.write_text(f"{testbed.host('esx-02').address} {wrong[1]} {wrong[2]}\n")
    ex = executor(testbed, "esx-02", known_hosts=[changed], accept_new_host_keys=True, record_to=changed)
    with pytest.raises(ConnectError, match="esx-02: host key for 10.250.0.12:22 has CHANGED"):
        ex.run(["true"])


def test_known_hosts_lines_openssh_has_but_gpuvm_cannot_use_break_nothing(testbed, tmp_path, caplog):
    """Issue 11, item 11: a @cert-authority line, a non-UTF-8 byte and a garbled line are skipped,
    each named by file and line; the hosts' own lines still work."""
    caplog.set_level(logging.INFO)
    messy = tmp_path / "known_hosts"
    messy.write_bytes(b"@cert-authority *.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
                      b"caf\xe9.example.com ssh-rsa AAAA\n"
                      b"this is not a key line\n"
                      + testbed.known_hosts_file.read_bytes())
    ex = executor(testbed, "esx-02", known_hosts=[messy])
    assert ex.run(["hostname"]).stdout == "esx-02\n"
    ex.close()
    assert f"{messy}:1: @cert-authority skipped" in caplog.text
    assert f"{messy}:2: not UTF-8" in caplog.text and f"{messy}:3: not a host key line" in caplog.text


def test_a_revoked_host_key_is_refused(testbed, tmp_path):
    revoked = tmp_path / "known_hosts"
    _, kind, blob = testbed.host("esx-02").host_key_line.split()
    revoked.write_text(testbed.known_hosts_file.read_text() + f"@revoked * {kind} {blob}\n")
    ex = executor(testbed, "esx-02", known_hosts=[revoked])
    with pytest.raises(HostKeyError, match=r"esx-02: host key for 10\.250\.0\.12:22 \(ssh-ed25519 SHA256:\S+\) is @revoked"):
        ex.run(["true"])


def test_stopped_sshd_is_a_connect_error(testbed):
    ex = executor(testbed, "gpu-vm-04")
    assert ex.run(["true"]).exit_code == 0
    testbed.stop_sshd("gpu-vm-04")
    try:
        with pytest.raises(ConnectError, match=r"gpu-vm-04: .*10\.250\.0\.16:22"):
            ex.run(["true"])
    finally:
        testbed.start_sshd("gpu-vm-04")
    assert ex.run(["true"]).exit_code == 0  # reconnects by itself
    ex.close()


def test_hanging_tool_times_out_and_is_killed(testbed, guest):
    testbed.set_state("gpu-vm-01", "hang", ["nvidia-smi"])
    try:
        start = time.monotonic()
        with pytest.raises(RemoteCommandError, match=r"gpu-vm-01: `nvidia-smi -L` timed out after 2s"):
            guest.run(["nvidia-smi", "-L"], timeout=2)
        assert time.monotonic() - start < 5
    finally:
        testbed.set_state("gpu-vm-01", "hang", [])
    assert guest.run(["nvidia-smi", "-L"]).exit_code == 0  # the executor is not stuck
    # sshd signals the session's process group (non-root logins only: see SshExecutor)
    time.sleep(0.3)
    assert "nvidia-smi -L" not in guest.run(["pgrep", "-u", "gpuadmin", "-af", "nvidia-smi"], check=False).stdout


def test_hanging_tool_as_root_still_times_out(testbed, esx):
    testbed.set_state("esx-01", "hang", ["nvidia-smi"])
    try:
        with pytest.raises(RemoteCommandError, match=r"esx-01: `nvidia-smi -L` timed out after 1s"):
            esx.run(["nvidia-smi", "-L"], timeout=1)
    finally:
        testbed.set_state("esx-01", "hang", [])
    assert esx.run(["nvidia-smi", "-L"]).exit_code == 0


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
@settings(max_examples=30, deadline=None)
def test_quoting_over_ssh(testbed, s):
    ex = _shared(testbed)
    assert ex.run(["printf", "%s", s]).stdout == s


_shared_executors: dict = {}


def _shared(bed) -> SshExecutor:
    if id(bed) not in _shared_executors:
        _shared_executors[id(bed)] = executor(bed, "gpu-vm-02")
    return _shared_executors[id(bed)]


def test_esxcli_ats_round_trip(testbed, esx):
    def setting():
        return esxcli.parse_kernel_setting(esx.run(["esxcli", "system", "settings", "kernel", "list", "-o", "atsSupport"]).stdout, "atsSupport")

    assert (setting().configured, setting().runtime) == ("FALSE", "FALSE")
    esx.run(["esxcli", "system", "settings", "kernel", "set", "-s", "atsSupport", "-v", "TRUE"])
    assert (setting().configured, setting().runtime, setting().pending) == ("TRUE", "FALSE", True)
    esx.run(["gpuvm-fake-reboot"])
    assert (setting().configured, setting().runtime) == ("TRUE", "TRUE")
    with pytest.raises(RemoteCommandError, match="exited 1"):
        esx.run(["esxcli", "system", "settings", "kernel", "set", "-s", "noSuchOption", "-v", "TRUE"])


def test_mlxconfig_ats_round_trip(guest):
    devices = mst.parse_mst_status(guest.run(["mst", "status", "-v"]).stdout)
    assert [d.mst for d in devices] == [None, None]
    guest.run(["mst", "start"], sudo=True)
    dev = next(d.mst for d in mst.parse_mst_status(guest.run(["mst", "status", "-v"]).stdout) if d.rdma == "mlx5_0")
    query = ["mlxconfig", "-d", dev, "q", "ATS_ENABLED"]
    assert mlxconfig.parse_mlxconfig_query(guest.run(query, sudo=True).stdout)["ATS_ENABLED"] == "False(0)"
    guest.run(["mlxconfig", "-y", "-d", dev, "set", "ATS_ENABLED=true"], sudo=True)
    assert mlxconfig.parse_mlxconfig_query(guest.run(query, sudo=True).stdout)["ATS_ENABLED"] == "True(1)"
    params = mlxconfig.parse_mlxconfig_params(guest.run(["mlxconfig", "-d", dev, "-e", "q", "ATS_ENABLED"], sudo=True).stdout)
    assert (params["ATS_ENABLED"].current, params["ATS_ENABLED"].next_boot) == ("False(0)", "True(1)")


def test_mig_round_trip(testbed, guest):
    modes = nvidia_smi.parse_mig_query_csv(
        guest.run(["nvidia-smi", "--query-gpu=index,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"]).stdout
    )
    assert [m.current for m in modes] == ["Disabled"] * 4
    denied = guest.run(["nvidia-smi", "-i", "0", "-mig", "1"], check=False)  # needs root, like the real one
    assert denied.exit_code == 4 and "Insufficient Permissions" in denied.stdout
    guest.run(["nvidia-smi", "-i", "0", "-mig", "1"], sudo=True)
    created = nvidia_smi.parse_created_instances(guest.run(["nvidia-smi", "mig", "-cgi", "9,3g.40gb", "-C", "-i", "0"], sudo=True).stdout)
    assert [c.kind for c in created] == ["GPU", "compute", "GPU", "compute"]
    instances = nvidia_smi.parse_gpu_instances(guest.run(["nvidia-smi", "mig", "-lgi"], sudo=True).stdout)
    assert [(i.profile, i.placement_start) for i in instances] == [("3g.40gb", 0), ("3g.40gb", 4)]
    gpus = nvidia_smi.parse_gpu_list(guest.run(["nvidia-smi", "-L"]).stdout)
    assert [len(g.mig_devices) for g in gpus] == [2, 0, 0, 0]
    with pytest.raises(RemoteCommandError, match="Insufficient Resources"):
        guest.run(["nvidia-smi", "mig", "-cgi", "19", "-i", "0"], sudo=True)


def test_mig_on_esxi_is_pending_until_reboot(esx):
    esx.run(["nvidia-smi", "-i", "1", "-mig", "1"])
    modes = nvidia_smi.parse_mig_query_csv(
        esx.run(["nvidia-smi", "--query-gpu=index,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"]).stdout
    )
    assert (modes[1].current, modes[1].pending) == ("Disabled", "Enabled")
    esx.run(["nvidia-smi", "--gpu-reset", "-i", "1"])
    assert "1, NVIDIA A100 80GB PCIe, Enabled, Enabled" in esx.run(
        ["nvidia-smi", "--query-gpu=index,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"]).stdout


def test_ibdev2netdev_follows_the_links(guest):
    guest.run(["ip", "link", "set", "ens64np1", "up"], sudo=True)
    guest.run(["ip", "link", "set", "ens64np2", "down"], sudo=True)
    for args in (["ibdev2netdev"], ["ibdev2netdev", "-v"]):
        ports = ibdev2netdev.parse_ibdev2netdev(guest.run(args).stdout)
        assert [(p.ibdev, p.netdev, p.up) for p in ports] == [("mlx5_0", "ens64np1", True), ("mlx5_1", "ens64np2", False)]
    guest.run(["ip", "addr", "replace", "192.168.100.13/24", "dev", "ens64np1"], sudo=True)
    guest.run(["ip", "link", "set", "ens64np1", "mtu", "9000"], sudo=True)
    assert "mtu 9000" in guest.run(["ip", "link", "show", "ens64np1"]).stdout


def test_docker_build_save_load(testbed, guest):
    other = executor(testbed, "gpu-vm-03")
    dockerfile = b"FROM ubuntu:20.04\nRUN apt-get update\n"
    guest.put(dockerfile, "/home/gpuadmin/Dockerfile")
    guest.run(["docker", "build", "-t", "gpuvm/horovod:test", "-f", "/home/gpuadmin/Dockerfile", "/home/gpuadmin"])
    image_id = guest.run(["docker", "image", "inspect", "--format", "{{.Id}}", "gpuvm/horovod:test"]).stdout.strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", image_id)
    with pytest.raises(RemoteCommandError, match="No such image: gpuvm/horovod:test"):
        other.run(["docker", "image", "inspect", "--format", "{{.Id}}", "gpuvm/horovod:test"])
    import io

    tar = io.BytesIO()
    guest.run(["docker", "save", "gpuvm/horovod:test"], stdout_to=tar)
    assert other.run(["docker", "load"], stdin=tar.getvalue()).stdout == "Loaded image: gpuvm/horovod:test\n"
    assert other.run(["docker", "image", "inspect", "--format", "{{.Id}}", "gpuvm/horovod:test"]).stdout.strip() == image_id
    assert other.run(["docker", "run", "--rm", "gpuvm/horovod:test", "echo", "in", "container"]).stdout == "in container\n"
    other.close()


def test_run_group_with_one_host_down(testbed):
    guests = {h.name: executor(testbed, h.name) for h in testbed.hosts if h.role == "guest"}
    testbed.stop_sshd("gpu-vm-03")
    try:
        with pytest.raises(TargetFailures) as info:
            run_group(guests, lambda ex: ex.run(["hostname"]).stdout.strip()).raise_failures()
    finally:
        testbed.start_sshd("gpu-vm-03")
    assert list(info.value.failures) == ["gpu-vm-03"]
    assert isinstance(info.value.failures["gpu-vm-03"], ConnectError)
    assert info.value.results == {"gpu-vm-01": "gpu-vm-01", "gpu-vm-02": "gpu-vm-02", "gpu-vm-04": "gpu-vm-04"}
    assert info.value.exit_code == ConnectError.exit_code
    for ex in guests.values():
        ex.close()
