"""guest.ssh_mesh against the test bed's four guests: real OpenSSH servers and clients."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from gpuvm.steps.base import Context
from gpuvm.errors import RemoteCommandError
from gpuvm.journal import state_dir
from gpuvm.steps.guest_ssh_mesh import verify
from gpuvm.steps.guest_ssh_mesh.files import IDENTITY
from gpuvm.steps.guest_ssh_mesh.key import key_path
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_ssh_mesh as mesh

pytestmark = pytest.mark.integration

GUESTS = ["gpu-vm-01", "gpu-vm-02", "gpu-vm-03", "gpu-vm-04"]
HOME = "/home/gpuadmin/.ssh"


def write_runbook(bed, path: Path, container_port: int | None = None) -> Path:
    lines = [f"ssh: {{known_hosts: {bed.known_hosts_file}, connect_timeout: 5, command_timeout: 60}}",
             "hosts: [{name: esx-01}]", "vms:"]
    lines += [f"  - {{name: {g}, host: esx-01}}" for g in GUESTS]
    lines += ["guests:", "  ssh_mesh: " + (f"{{container_port: {container_port}}}" if container_port else "{}"),
              "  hosts:"]
    lines += [f"    - {{vm: {g}, slots: 1, ssh: {{address: {bed.address(g)}, user: gpuadmin, key_file: {bed.client_key}}}}}"
              for g in GUESTS]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def cluster(testbed, tmp_path):
    book = load_runbook(write_runbook(testbed, tmp_path / "runbook.yaml", container_port=12345))
    c = build_cluster(book, state_dir(tmp_path / "state"))
    yield c
    _reset(c)
    c.close()


def _reset(cluster) -> None:
    """Leave the bed's guests as they were: only the bed's client key authorised."""
    for name in cluster.of_role("guest"):
        cluster.executors[name].run_script(f"cd {HOME} && rm -f {IDENTITY} {IDENTITY}.pub known_hosts config && "
                                           "grep -v gpuvm-mesh authorized_keys > a.new; mv a.new authorized_keys; "
                                           "chmod 600 authorized_keys")


def observe_all(cluster) -> dict:
    return {n: mesh.observe(Context(cluster=cluster), t) for n, t in cluster.of_role("guest").items()}


def plan_all(cluster) -> dict:
    facts = observe_all(cluster)
    return {n: mesh.plan(cluster.targets[n], f) for n, f in facts.items()}


def snapshot(cluster) -> dict:
    return {n: cluster.executors[n].run_script(f"ls -la {HOME}; cat {HOME}/* 2>/dev/null | sha256sum").stdout
            for n in cluster.of_role("guest")}


def test_dry_run_changes_nothing(cluster):
    before = snapshot(cluster)
    plans = plan_all(cluster)
    assert all({c.field for c in changes} == {"identity", "authorized_keys", "known_hosts", "config"}
               for changes in plans.values())
    assert snapshot(cluster) == before
    assert not key_path(cluster.state_dir).exists()  # planning makes no key


def test_apply_replan_empty_then_real_ssh_between_every_pair(cluster, testbed):
    plans = plan_all(cluster)
    failures = mesh.apply_all(Context(cluster=cluster), plans)
    assert failures == {}
    assert plan_all(cluster) == {g: [] for g in GUESTS}  # re-plan: nothing to do
    # idempotent: applying again changes nothing on disk and still verifies
    before = snapshot(cluster)
    assert mesh.apply_all(Context(cluster=cluster), {g: [] for g in GUESTS}) == {}
    assert snapshot(cluster) == before

    # every ordered pair, with plain ssh as gpuadmin: only the tool's key, config and known_hosts
    addresses = {g: testbed.address(g) for g in GUESTS}
    for origin in cluster.of_role("guest"):
        for peer in GUESTS:
            if peer == origin:
                continue
            # -F default config (ours); no agent; the bed's client key is not in the guest
            out = cluster.executors[origin].run(["ssh", "-o", "BatchMode=yes", addresses[peer], "hostname"])
            assert out.stdout == f"{peer}\n"
    g1 = cluster.executors["gpu-vm-01"]
    stat = g1.run(["stat", "-c", "%n %U %a", HOME, f"{HOME}/{IDENTITY}", f"{HOME}/authorized_keys",
                   f"{HOME}/known_hosts", f"{HOME}/config"]).stdout.split("\n")
    assert stat[:5] == [f"{HOME} gpuadmin 700", f"{HOME}/{IDENTITY} gpuadmin 600",
                        f"{HOME}/authorized_keys gpuadmin 600", f"{HOME}/known_hosts gpuadmin 644",
                        f"{HOME}/config gpuadmin 600"]
    # the bed's own client key is still authorised (we append, never replace), once each
    authorized = g1.get(f"{HOME}/authorized_keys").decode()
    assert "gpuvm-testbed-client" in authorized and authorized.count("gpuvm-mesh") == 1
    known = g1.get(f"{HOME}/known_hosts").decode().splitlines()
    assert len(known) == 8 and f"[{addresses['gpu-vm-02']}]:12345" in {line.split()[0] for line in known}
    # keys came from gpuadmin's verified connection: they equal the bed's host keys
    assert {" ".join(line.split()[1:]) for line in known} == {
        " ".join(testbed.host(g).host_key_line.split()[1:]) for g in GUESTS}


def test_broken_authorized_keys_reports_exactly_the_pairs_into_that_guest(cluster):
    assert mesh.apply_all(Context(cluster=cluster), plan_all(cluster)) == {}
    victim = cluster.executors["gpu-vm-03"]
    victim.run_script(f"grep -v gpuvm-mesh {HOME}/authorized_keys > /tmp/a; cat /tmp/a > {HOME}/authorized_keys")
    pairs = verify.verify_mesh(cluster, parallel=4)
    assert sorted((p.origin, p.peer) for p in pairs) == [("gpu-vm-01", "gpu-vm-03"), ("gpu-vm-02", "gpu-vm-03"),
                                                         ("gpu-vm-04", "gpu-vm-03")]
    assert all("Permission denied" in p.reason for p in pairs)
    with pytest.raises(RemoteCommandError) as info:
        verify.check_mesh(cluster)
    message = str(info.value)
    assert "3 of 12 guest pair(s)" in message and "gpu-vm-02  gpu-vm-03  " in message
    # the plan sees it, and apply mends it
    plans = plan_all(cluster)
    assert [(c.target, c.field, c.before) for cs in plans.values() for c in cs] == [
        ("gpu-vm-03", "authorized_keys", "missing mesh key")]
    assert mesh.apply_all(Context(cluster=cluster), plans) == {}
    assert verify.verify_mesh(cluster) == []


def test_other_mesh_user_through_sudo(testbed, tmp_path):
    """ssh_mesh.user other than the login user: files written as that user (sudo -u), owned by it."""
    path = write_runbook(testbed, tmp_path / "runbook.yaml")
    path.write_text(path.read_text().replace("ssh_mesh: {}", "ssh_mesh: {user: mpiuser}"))
    cluster = build_cluster(load_runbook(path), state_dir(tmp_path / "state"))
    add = "id -u mpiuser >/dev/null 2>&1 || useradd -m -d /home/mpiuser -s /bin/sh mpiuser; usermod -p '*' mpiuser"
    for name in cluster.of_role("guest"):
        cluster.executors[name].run(["sh", "-c", add], sudo=True)
    try:
        plans = plan_all(cluster)
        assert {c.field for c in plans["gpu-vm-01"]} == {"directory", "identity", "authorized_keys",
                                                           "known_hosts", "config"}
        for name, changes in plans.items():  # the other guests are written as ever
            mesh.apply(Context(cluster=cluster), cluster.targets[name], changes)
            assert mesh.plan(cluster.targets[name], mesh.observe(Context(cluster=cluster), cluster.targets[name])) == []
        assert plan_all(cluster) == {g: [] for g in GUESTS}
        g1 = cluster.executors["gpu-vm-01"]
        assert g1.run(["stat", "-c", "%U %a", "/home/mpiuser/.ssh"], sudo=True).stdout == "mpiuser 700\n"
        out = g1.run(["sudo", "-n", "-u", "mpiuser", "-H", "ssh", testbed.address("gpu-vm-04"), "id", "-un"])
        assert out.stdout == "mpiuser\n"
    finally:
        for name in cluster.of_role("guest"):
            cluster.executors[name].run(["sh", "-c", "userdel -r mpiuser 2>/dev/null; true"], sudo=True)
        cluster.close()


def test_state_key_is_reused_across_runs(cluster, tmp_path, testbed):
    assert mesh.apply_all(Context(cluster=cluster), plan_all(cluster)) == {}
    first = key_path(cluster.state_dir).read_bytes()
    # a second run (new connections, same state directory) plans nothing and keeps the key
    again = build_cluster(load_runbook(write_runbook(testbed, tmp_path / "rb2.yaml", container_port=12345)),
                          cluster.state_dir)
    try:
        assert plan_all(again) == {g: [] for g in GUESTS}
    finally:
        again.close()
    assert key_path(cluster.state_dir).read_bytes() == first


CANARY = "/root/gpuvm-canary"  # root's own file on the guest (0600), standing in for /etc/shadow
CANARY_TEXT = "root-only-canary-7c41"


@pytest.mark.parametrize("link, points_to", [
    ("known_hosts", CANARY),  # as root, observe read it into the plan and apply wrote it back as mpiuser's
    ("authorized_keys", CANARY),
    (".", CANARY + ".d"),  # ~/.ssh itself: as root, apply chowned and chmodded root's directory and wrote into it
])
def test_root_never_follows_a_link_in_the_mesh_users_ssh_dir(testbed, tmp_path, link, points_to):
    """A mesh user other than the login user plants a link in ~/.ssh to a root-only file: that guest
    fails, naming the link; the file is neither read nor changed; the other guests get their mesh."""
    path = write_runbook(testbed, tmp_path / "runbook.yaml")
    path.write_text(path.read_text().replace("ssh_mesh: {}", "ssh_mesh: {user: mpiuser}"))
    cluster = build_cluster(load_runbook(path), state_dir(tmp_path / "state"))
    victim = cluster.executors["gpu-vm-02"]
    planted = "/home/mpiuser/.ssh" + ("" if link == "." else f"/{link}")
    for name in cluster.of_role("guest"):
        cluster.executors[name].run(["sh", "-c", "id -u mpiuser >/dev/null 2>&1 || useradd -m -d /home/mpiuser "
                                                 "-s /bin/sh mpiuser; usermod -p '*' mpiuser"], sudo=True)
    victim.run(["sh", "-c", f"umask 077; printf '{CANARY_TEXT}\\n' > {CANARY}; mkdir -p {CANARY}.d; "
                            f"echo inside > {CANARY}.d/kept; [ {link} = . ] || mkdir -p /home/mpiuser/.ssh; "
                            f"chown -R mpiuser: /home/mpiuser; ln -s {points_to} {planted}; chown -h mpiuser: {planted}"],
               sudo=True)

    def canary() -> str:
        return victim.run(["sh", "-c", f"stat -c '%U %a %s' {CANARY} {CANARY}.d; sha256sum {CANARY}; ls -A {CANARY}.d"],
                          sudo=True).stdout

    before = canary()
    try:
        facts, errors = {}, {}
        for name, target in cluster.of_role("guest").items():
            try:
                facts[name] = mesh.observe(Context(cluster=cluster), target)
            except RemoteCommandError as e:
                errors[name] = str(e)
        assert list(errors) == ["gpu-vm-02"]
        assert f"{planted} is a symbolic link" in errors["gpu-vm-02"]
        plans = {n: mesh.plan(cluster.targets[n], f) for n, f in facts.items()}
        # apply on the victim as if it had been planned (the link planted after the plan): refused too
        forged = [replace(c, target="gpu-vm-02") for c in plans["gpu-vm-01"]]
        with pytest.raises(RemoteCommandError, match=f"{planted} is a symbolic link"):
            mesh.apply(Context(cluster=cluster), cluster.targets["gpu-vm-02"], forged)
        for name, changes in plans.items():  # the other guests are written as ever
            mesh.apply(Context(cluster=cluster), cluster.targets[name], changes)
            assert mesh.plan(cluster.targets[name], mesh.observe(Context(cluster=cluster), cluster.targets[name])) == []
        assert canary() == before and hashlib.sha256(f"{CANARY_TEXT}\n".encode()).hexdigest() in before
        assert CANARY_TEXT not in repr(facts) + repr(errors)
        leaked = victim.run(["sh", "-c", f"grep -rl {CANARY_TEXT} /home/mpiuser; true"], sudo=True).stdout
        assert leaked == ""
        assert victim.run(["readlink", planted], sudo=True).stdout.strip() == points_to  # the user's link kept
    finally:
        for name in cluster.of_role("guest"):
            cluster.executors[name].run(["sh", "-c", f"userdel -r mpiuser 2>/dev/null; rm -rf {CANARY} {CANARY}.d; "
                                                     "true"], sudo=True)
        cluster.close()


def test_a_ssh_dir_owned_by_root_is_named_not_chowned(testbed, tmp_path):
    """The mesh user's ~/.ssh belongs to root: gpuvm (never root in that home) says so and changes nothing."""
    path = write_runbook(testbed, tmp_path / "runbook.yaml")
    path.write_text(path.read_text().replace("ssh_mesh: {}", "ssh_mesh: {user: mpiuser}"))
    cluster = build_cluster(load_runbook(path), state_dir(tmp_path / "state"))
    target, executor = cluster.targets["gpu-vm-03"], cluster.executors["gpu-vm-03"]
    executor.run(["sh", "-c", "id -u mpiuser >/dev/null 2>&1 || useradd -m -d /home/mpiuser -s /bin/sh mpiuser; "
                              "usermod -p '*' mpiuser; mkdir -p /home/mpiuser/.ssh; chmod 755 /home/mpiuser/.ssh"],
                 sudo=True)
    try:
        changes = mesh.plan(target, mesh.observe(Context(cluster=cluster), target))
        assert ("directory", "owner root, mode 755") in [(c.field, c.before) for c in changes]
        with pytest.raises(RemoteCommandError, match="/home/mpiuser/.ssh is owned by root, not mpiuser: gpuvm changes "
                                                     "no ownership as root; chown it to mpiuser"):
            mesh.apply(Context(cluster=cluster), target, changes)
        assert executor.run(["sh", "-c", "stat -c '%U %a' /home/mpiuser/.ssh; ls -A /home/mpiuser/.ssh"],
                            sudo=True).stdout == "root 755\n"
    finally:
        executor.run(["sh", "-c", "userdel -r mpiuser 2>/dev/null; true"], sudo=True)
        cluster.close()
