"""guest.ssh_mesh: the key pair, plans from facts, file merging, apply and verify with fake executors."""

from __future__ import annotations

import getpass
import io
import itertools
import json
import os
import re
import stat
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from gpuvm.steps.base import Context
from gpuvm.errors import ConnectError, InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.steps.guest_ssh_mesh import files as mesh_files
from gpuvm.steps.guest_ssh_mesh import ssh_dir, verify
from gpuvm.steps.guest_ssh_mesh.files import MeshFiles, Peer
from gpuvm.ssh_keys import line_fingerprint as fingerprint
from gpuvm.steps.guest_ssh_mesh.key import COMMENT, cluster_key, key_path, load_cluster_key
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_ssh_mesh as mesh
from gpuvm.steps.guest_ssh_mesh import MeshFact

HOST_KEYS = {f"gpu-vm-0{i}": f"AAAAC3NzaC1lZDI1NTE5AAAAI{i}hostkey" for i in (1, 2, 3)}
ADDRESSES = {f"gpu-vm-0{i}": f"10.0.0.{10 + i}" for i in (1, 2, 3)}


class FakeGuest(FakeExecutor):
    """A fake executor that also knows its host key, like SshExecutor after connecting."""

    def __init__(self, name: str, address: str, responses=None, reachable: bool = True):
        super().__init__(name, responses)
        self.address, self.reachable = address, reachable

    def host_key_line(self) -> str:
        if not self.reachable:
            raise ConnectError(f"{self.name}: cannot connect to {self.address}:22: Connection refused")
        return f"{self.address} ssh-ed25519 {HOST_KEYS[self.name]}"


def make_cluster(tmp_path: Path, mesh_yaml: str = "{}", user: str = "gpuadmin", responses=None, unreachable=()):
    lines = ["hosts: [{name: esx-01}]", "vms:"] + [f"  - {{name: {g}, host: esx-01}}" for g in ADDRESSES]
    lines += ["guests:", f"  ssh_mesh: {mesh_yaml}", "  hosts:"]
    lines += [f"    - {{vm: {g}, slots: 2, ssh: {{address: {a}, user: {user}}}}}" for g, a in ADDRESSES.items()]
    (tmp_path / "runbook.yaml").write_text("\n".join(lines) + "\n")
    fakes = {g: FakeGuest(g, a, (responses or {}).get(g), reachable=g not in unreachable) for g, a in ADDRESSES.items()}
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    cluster = build_cluster(load_runbook(tmp_path / "runbook.yaml"), state,
                            RemoteOptions(executor_factory=lambda name, access: fakes[name]))
    return cluster, fakes


def peers(*names: str) -> tuple[Peer, ...]:
    return tuple(Peer(n, ADDRESSES[n], 22, "ssh-ed25519", HOST_KEYS[n]) for n in names)


ALL = peers("gpu-vm-01", "gpu-vm-02", "gpu-vm-03")

# ------------------------------------------------------------------------------------ keys


def test_key_is_made_once_0600_openssh_and_reused(tmp_path):
    assert load_cluster_key(tmp_path) is None and not key_path(tmp_path).exists()  # reading never makes one
    key = cluster_key(tmp_path)
    path = key_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    loaded = paramiko.Ed25519Key.from_private_key_file(str(path))
    assert key.public_line == f"ssh-ed25519 {loaded.get_base64()} {COMMENT}"
    assert (path.parent / "id_ed25519.pub").read_text() == key.public_line + "\n"
    assert key.fingerprint.startswith("SHA256:") and len(key.fingerprint) == 50
    again = cluster_key(tmp_path)
    assert again == key and path.read_bytes() == key.private_bytes()
    assert "PRIVATE" not in repr(key)  # the dataclass holds a path, not the key


def test_key_file_readable_by_others_is_tightened_and_garbage_refused(tmp_path):
    cluster_key(tmp_path)
    key_path(tmp_path).chmod(0o644)
    load_cluster_key(tmp_path)
    assert stat.S_IMODE(key_path(tmp_path).stat().st_mode) == 0o600
    key_path(tmp_path).write_text("not a key")
    with pytest.raises(InputError, match="not an unencrypted OpenSSH private key"):
        load_cluster_key(tmp_path)


def test_fingerprint_matches_openssh():
    # ssh-keygen -lf of this public key prints this fingerprint
    line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"
    assert fingerprint(line) == "SHA256:" + __import__("base64").b64encode(
        __import__("hashlib").sha256(__import__("base64").b64decode(line.split()[1])).digest()).decode().rstrip("=")


# ------------------------------------------------------------------------------ plan cases


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return cluster_key(tmp_path_factory.mktemp("state"))


def converged(key) -> MeshFiles:
    names = ". id_ed25519_gpuvm id_ed25519_gpuvm.pub authorized_keys known_hosts config".split()
    modes = dict(zip(names, (0o700, 0o600, 0o644, 0o600, 0o644, 0o600)))
    return MeshFiles("gpuadmin", "/home/gpuadmin", {n: ("gpuadmin", m) for n, m in modes.items()}, key.private_digest, {
        "id_ed25519_gpuvm.pub": key.public_line + "\n",
        "authorized_keys": "ssh-rsa AAAAB3other admin@laptop\n" + key.public_line + "\n",
        "known_hosts": "".join(line + "\n" for line in mesh_files.known_host_lines(ALL, None)),
        "config": "Host github.com\n  User git\n\n" + mesh_files.config_block(ALL),
    })


def with_stats(files: MeshFiles, **stats) -> MeshFiles:
    new = dict(files.stats)
    for name, value in stats.items():
        name = {"ssh": ".", "identity": "id_ed25519_gpuvm"}.get(name, name)
        if value is None:
            new.pop(name, None)
        else:
            new[name] = value
    return replace(files, stats=new)


def with_texts(files: MeshFiles, **texts) -> MeshFiles:
    new = dict(files.texts)
    for name, value in texts.items():
        if value is None:
            new.pop(name, None)
        else:
            new[name] = value
    return replace(files, texts=new)


EMPTY = MeshFiles("gpuadmin", "/home/gpuadmin")


def _cases(key):
    c = converged(key)
    fp = key.fingerprint
    stale = c.texts["known_hosts"].replace(HOST_KEYS["gpu-vm-02"], "AAAAC3NzaC1lZDI1NTE5AAAAIold")
    return [
        ("fresh guest", EMPTY, key, [
            ("directory", "missing", "0700, owner gpuadmin"),
            ("identity", "missing", f"mesh key {fp}"),
            ("authorized_keys", "missing mesh key", f"mesh key {fp} authorized"),
            ("known_hosts", "0 of 3 guest host keys", "3 guest host keys"),
            ("config", "no gpuvm block", "gpuvm block for 3 guests")]),
        ("first run: no key yet", EMPTY, None, [
            ("directory", "missing", "0700, owner gpuadmin"),
            ("identity", "missing", "new mesh key (made on apply)"),
            ("authorized_keys", "missing mesh key", "new mesh key (made on apply) authorized"),
            ("known_hosts", "0 of 3 guest host keys", "3 guest host keys"),
            ("config", "no gpuvm block", "gpuvm block for 3 guests")]),
        ("converged", c, key, []),
        ("group-writable .ssh", with_stats(c, ssh=("gpuadmin", 0o775)), key, [
            ("directory", "mode 775", "0700, owner gpuadmin")]),
        ("root owns authorized_keys", with_stats(c, authorized_keys=("root", 0o600)), key, [
            ("authorized_keys", "owner root", f"mesh key {fp} authorized")]),
        ("private key readable by group", with_stats(c, identity=("gpuadmin", 0o640)), key, [
            ("identity", "mode 640", f"mesh key {fp}")]),
        ("another key in place", replace(c, key_digest="0" * 64), key, [
            ("identity", f"another key {fp}", f"mesh key {fp}")]),
        ("key removed from authorized_keys", with_texts(c, authorized_keys="ssh-rsa AAAAB3other admin@laptop\n"), key, [
            ("authorized_keys", "missing mesh key", f"mesh key {fp} authorized")]),
        ("known_hosts lacks one guest", with_texts(c, known_hosts="".join(
            line + "\n" for line in mesh_files.known_host_lines(ALL[:2], None))), key, [
            ("known_hosts", "2 of 3 guest host keys", "3 guest host keys")]),
        ("known_hosts has a stale key", with_texts(c, known_hosts=stale), key, [
            ("known_hosts", "2 of 3 guest host keys, 1 stale", "3 guest host keys")]),
        ("config block edited", with_texts(c, config=c.texts["config"].replace("BatchMode yes", "BatchMode no")), key, [
            ("config", "gpuvm block differs", "gpuvm block for 3 guests")]),
        ("config removed", with_texts(c, config=None), key, [("config", "no gpuvm block", "gpuvm block for 3 guests")]),
    ]


@pytest.mark.parametrize("index", range(12))
def test_plan_from_facts(tmp_path, key, index):
    cases = _cases(key)
    assert len(cases) == 12
    name, files, fact_key, expected = cases[index]
    cluster, _ = make_cluster(tmp_path)
    changes = mesh.plan(cluster.targets["gpu-vm-01"], MeshFact(files, fact_key, ALL))
    assert [(c.field, c.before, c.after) for c in changes] == expected, name
    assert all(c.step == mesh.NAME and c.target == "gpu-vm-01" and c.resource.startswith("~gpuadmin/.ssh")
               for c in changes)


def test_container_port_adds_known_hosts_names(tmp_path, key):
    cluster, _ = make_cluster(tmp_path, "{container_port: 12345}")
    changes = mesh.plan(cluster.targets["gpu-vm-01"], MeshFact(converged(key), key, ALL, 12345))
    assert [(c.field, c.before) for c in changes] == [("known_hosts", "3 of 6 guest host keys")]
    assert mesh_files.known_host_lines(ALL[:1], 12345) == [f"10.0.0.11 ssh-ed25519 {HOST_KEYS['gpu-vm-01']}",
                                                          f"[10.0.0.11]:12345 ssh-ed25519 {HOST_KEYS['gpu-vm-01']}"]


def test_no_key_material_in_changes(tmp_path, key):
    cluster, _ = make_cluster(tmp_path)
    changes = mesh.plan(cluster.targets["gpu-vm-01"], MeshFact(EMPTY, key, ALL))
    text = json.dumps([c.to_dict() for c in changes]) + repr(changes) + repr([c.action for c in changes])
    private_body = "".join(key.private_bytes().decode().splitlines()[1:-1])
    for secret in (key.blob, private_body[:40], private_body[-40:], *HOST_KEYS.values()):
        assert secret not in text
    assert key.fingerprint in text


# -------------------------------------------------------------------------- merging files


def test_config_block_goes_first_keeps_the_users_config_and_replaces_in_place():
    block = mesh_files.config_block(ALL)
    assert block.splitlines()[1] == "Host 10.0.0.11 10.0.0.12 10.0.0.13"
    assert block.splitlines()[-2:] == ["Host *", mesh_files.END]
    assert mesh_files.merge_config(None, block) == block
    user = "ServerAliveInterval 30\nHost github.com\n  User git"  # global option first, no final newline
    merged = mesh_files.merge_config(user, block)
    assert merged == block + "\n" + user + "\n"
    assert mesh_files.merge_config(merged, block) == merged  # idempotent
    old = mesh_files.config_block(ALL[:1])
    middle = "Host a\n  User b\n" + old + "Host c\n  User d\n"
    assert mesh_files.merge_config(middle, block) == "Host a\n  User b\n" + block + "Host c\n  User d\n"
    assert mesh_files.split_config(middle) == ("Host a\n  User b\n", old, "Host c\n  User d\n")


def test_authorize_appends_once_and_keeps_other_keys(key):
    assert mesh_files.authorize(None, key.public_line) == key.public_line + "\n"
    other = "ssh-rsa AAAAB3other admin@laptop"
    assert mesh_files.authorize(other, key.public_line) == f"{other}\n{key.public_line}\n"
    done = mesh_files.authorize(other + "\n", key.public_line)
    assert mesh_files.authorize(done, key.public_line) == done
    with_options = f'from="10.0.0.0/8" {key.public_line.replace(COMMENT, "renamed")}\n'
    assert mesh_files.authorize(with_options, key.public_line) == with_options
    commented = f"# {key.public_line}\n"
    assert mesh_files.authorize(commented, key.public_line).count(key.blob) == 2


def test_known_hosts_merge_keeps_others_drops_stale_never_duplicates():
    want = mesh_files.known_host_lines(ALL, None)
    other = "github.com ssh-ed25519 AAAAgithub"
    hashed = "|1|abc=|def= ssh-ed25519 AAAAhashed"
    stale = "10.0.0.12,gpu-vm-02 ssh-ed25519 AAAAold"
    rsa = "10.0.0.12 ssh-rsa AAAArsa"  # another key type for the same host is not stale
    text, present, dropped = mesh_files.merge_known_hosts("\n".join([other, hashed, stale, rsa, want[0]]) + "\n", want)
    assert (present, dropped) == (1, 1)
    assert text.splitlines() == [other, hashed, rsa, want[0], want[1], want[2]]
    assert mesh_files.merge_known_hosts(text, want) == (text, 3, 0)


# -------------------------------------------------------------------------- remote parsing


READ_OUTPUT = """@@gpuvm home /home/gpu admin
@@gpuvm stat . gpuadmin 700
@@gpuvm stat authorized_keys root 644
@@gpuvm digest {digest}
@@gpuvm file authorized_keys c3NoLXJzYSBBQUFBIHgKbm8tbmV3bGluZQ==
noise from a login script
"""


def test_parse_mesh_files():
    files = ssh_dir.parse_mesh_files("gpuadmin", READ_OUTPUT.format(digest="ab" * 32))
    assert files.home == "/home/gpu admin"
    assert files.stats == {".": ("gpuadmin", 0o700), "authorized_keys": ("root", 0o644)}
    assert files.key_digest == "ab" * 32
    assert files.texts == {"authorized_keys": "ssh-rsa AAAA x\nno-newline"}
    assert ssh_dir.parse_mesh_files("u", "@@gpuvm home /h\n@@gpuvm digest \n").key_digest is None


def test_parse_verify_and_error_table():
    out = "OK 10.0.0.12:22\nFAIL 10.0.0.13:22 gpuadmin@10.0.0.13: Permission denied (publickey).\n"
    assert verify.parse_verify("gpu-vm-01", list(ALL[1:]), out) == [
        verify.FailedPair("gpu-vm-01", "gpu-vm-03", "gpuadmin@10.0.0.13: Permission denied (publickey).")]
    assert verify.parse_verify("gpu-vm-01", list(ALL[1:]), "") == [
        verify.FailedPair("gpu-vm-01", p.name, "no answer from the check") for p in ALL[1:]]
    error = verify.mesh_error([verify.FailedPair("gpu-vm-01", "gpu-vm-03", "Host key verification failed."),
                             verify.FailedPair("gpu-vm-02", "gpu-vm-03", "Permission denied (publickey).")], 6)
    assert isinstance(error, RemoteCommandError)
    assert str(error).splitlines() == [
        "guest.ssh_mesh: 2 of 6 guest pair(s) cannot log in with the mesh key:",
        "  from       to         reason",
        "  gpu-vm-01  gpu-vm-03  Host key verification failed.",
        "  gpu-vm-02  gpu-vm-03  Permission denied (publickey).",
    ]


# ------------------------------------------------------------------ observe / apply / verify

READ = re.compile(r'echo "@@gpuvm home')
WRITE = re.compile(r"set -e\numask 077")  # first in the script, or first within `sudo -u … sh -c '…'`
VERIFY = re.compile(r"^probe\(\) \{", re.M)


def read_response(files: MeshFiles):
    lines = [f"@@gpuvm home {files.home}"] + [f"@@gpuvm stat {n} {o} {m:o}" for n, (o, m) in files.stats.items()]
    if files.key_digest:
        lines.append(f"@@gpuvm digest {files.key_digest}")
    import base64

    lines += [f"@@gpuvm file {n} {base64.b64encode(t.encode()).decode()}" for n, t in files.texts.items()]
    return ok("read", "\n".join(lines) + "\n")


def test_observe_reads_once_and_takes_host_keys_from_the_connections(tmp_path):
    cluster, fakes = make_cluster(tmp_path, "{container_port: 12345}",
                                  responses={g: {READ: read_response(EMPTY)} for g in ADDRESSES})
    fact = mesh.observe(Context(cluster=cluster), cluster.targets["gpu-vm-02"])
    assert fact.files == EMPTY and fact.key is None and fact.container_port == 12345
    assert fact.peers == ALL
    assert len(fakes["gpu-vm-02"].calls) == 1 and not fakes["gpu-vm-02"].calls[0].sudo
    assert not key_path(cluster.state_dir).exists()


def test_observe_skips_an_unreachable_peer_and_names_a_missing_user(tmp_path):
    cluster, fakes = make_cluster(tmp_path, responses={g: {READ: read_response(EMPTY)} for g in ADDRESSES},
                                  unreachable=("gpu-vm-03",))
    assert mesh.observe(Context(cluster=cluster), cluster.targets["gpu-vm-01"]).peers == ALL[:2]
    fakes["gpu-vm-01"].responses[READ] = CommandResult("x", 3, "", "user mpi not found (getent passwd)\n")
    with pytest.raises(RemoteCommandError, match=r"^gpu-vm-01: guest.ssh_mesh: reading ~gpuadmin/.ssh failed \(exit 3\): "
                                                 r"user mpi not found \(getent passwd\)$"):
        mesh.observe(Context(cluster=cluster), cluster.targets["gpu-vm-01"])


def test_a_peer_briefly_away_stays_in_the_peer_sets_with_the_key_gpuvm_last_verified(tmp_path):
    """Issue 22: one guest down must not rewrite every other guest's mesh to the peers that answer.
    A guest gpuvm never verified has no key to give the others: it is left out until it answers."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    public = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    cluster, _ = make_cluster(tmp_path, responses={g: {READ: read_response(EMPTY)} for g in ADDRESSES},
                              unreachable=("gpu-vm-03",))
    context, target = Context(cluster=cluster), cluster.targets["gpu-vm-01"]
    assert mesh.observe(context, target).peers == ALL[:2]  # never verified: nothing to trust yet
    (cluster.state_dir / "known_hosts").write_text(f"{ADDRESSES['gpu-vm-03']} {public}\n")
    key_type, blob = public.split()
    assert mesh.observe(context, target).peers == (*ALL[:2], Peer("gpu-vm-03", "10.0.0.13", 22, key_type, blob))


def test_a_guest_whose_vm_was_not_observed_keeps_its_last_verified_place_unasked(tmp_path):
    """Issue 33: a guest of a vCenter not reached is no target (`Cluster.all_guests` only): not asked,
    not "not answering", yet in its peers' sets, in the runbook's order, with the key gpuvm last verified."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from gpuvm.steps.guest_ssh_mesh.guests import peer_host_keys

    public = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    cluster, fakes = make_cluster(tmp_path, responses={g: {READ: read_response(EMPTY)} for g in ADDRESSES})
    cluster.all_guests = dict(cluster.targets)
    del cluster.targets["gpu-vm-02"], cluster.executors["gpu-vm-02"]  # its vCenter not reached
    assert peer_host_keys(cluster) == (ALL[::2], {})  # never verified: nothing to trust yet
    (cluster.state_dir / "known_hosts").write_text(f"{ADDRESSES['gpu-vm-02']} {public}\n")
    key_type, blob = public.split()
    assert mesh.observe(Context(cluster=cluster), cluster.targets["gpu-vm-01"]).peers == \
        (ALL[0], Peer("gpu-vm-02", "10.0.0.12", 22, key_type, blob), ALL[2])
    assert not fakes["gpu-vm-02"].calls


def _written(call) -> dict[str, tuple[bytes, int]]:
    with tarfile.open(fileobj=io.BytesIO(call.stdin)) as tar:
        return {m.name: (tar.extractfile(m).read(), m.mode) for m in tar.getmembers()}


@pytest.mark.parametrize("user, other", [("gpuadmin", False), ("mpiuser", True)])
def test_apply_writes_only_the_changed_files_in_one_command(tmp_path, user, other):
    existing = with_texts(EMPTY, authorized_keys="ssh-rsa AAAAB3other admin@laptop\n",
                          config="Host github.com\n  User git\n")
    existing = replace(existing, user=user, home=f"/home/{user}")
    cluster, fakes = make_cluster(tmp_path, f"{{user: {user}}}",
                                  responses={g: {READ: read_response(existing), WRITE: ok("write")} for g in ADDRESSES})
    target = cluster.targets["gpu-vm-01"]
    changes = mesh.plan(target, mesh.observe(Context(cluster=cluster), target))
    fakes["gpu-vm-01"].calls.clear()
    mesh.apply(Context(cluster=cluster), target, changes)
    key = load_cluster_key(cluster.state_dir)
    read, write = fakes["gpu-vm-01"].calls
    # as the mesh user, never as root: another user's files through `sudo -u`, no chown anywhere
    assert [c.line.startswith(f"sudo -n -u {user} -H sh -c ") for c in (read, write)] == [other, other]
    assert not any(c.line.startswith("sudo -n sh ") for c in (read, write))
    assert not re.search(r"^\s*chown ", write.command, re.M)
    files = _written(write)
    assert sorted(files) == ["authorized_keys", "config", "id_ed25519_gpuvm", "id_ed25519_gpuvm.pub", "known_hosts"]
    assert files["id_ed25519_gpuvm"] == (key.private_bytes(), 0o600)
    assert files["authorized_keys"] == (f"ssh-rsa AAAAB3other admin@laptop\n{key.public_line}\n".encode(), 0o600)
    assert files["config"][0].decode().endswith("\nHost github.com\n  User git\n")
    assert files["known_hosts"][0].decode().count("ssh-ed25519") == 3
    # the key travels only on stdin: never in a command line
    assert all(key.blob not in c.command and b"PRIVATE" not in (c.command.encode()) for c in fakes["gpu-vm-01"].calls)

    fakes["gpu-vm-01"].calls.clear()
    mesh.apply(Context(cluster=cluster), target, [c for c in changes if c.field == "config"])
    assert list(_written(fakes["gpu-vm-01"].calls[-1])) == ["config"]


def test_apply_failure_names_target_and_step(tmp_path):
    cluster, fakes = make_cluster(tmp_path, responses={g: {READ: read_response(EMPTY)} for g in ADDRESSES})
    fakes["gpu-vm-01"].responses[WRITE] = CommandResult("w", 2, "", "tar: short read\n")
    target = cluster.targets["gpu-vm-01"]
    changes = mesh.plan(target, mesh.observe(Context(cluster=cluster), target))
    with pytest.raises(RemoteCommandError, match=r"^gpu-vm-01: guest.ssh_mesh: writing ~gpuadmin/.ssh failed \(exit 2\): tar: short read$"):
        mesh.apply(Context(cluster=cluster), target, changes)


def verify_answer(failing: dict[str, str]):
    def answer(call):
        addresses = re.findall(r"^probe (\S+) (\d+) & batch$", call.command, re.M)
        return ok("verify", "".join(f"FAIL {a}:{p} {failing[a]}\n" if a in failing else f"OK {a}:{p}\n"
                                    for a, p in addresses))
    return answer


def test_verify_one_command_per_guest_all_peers(tmp_path):
    denied = {"10.0.0.13": "Permission denied (publickey)."}
    cluster, fakes = make_cluster(tmp_path, responses={g: {VERIFY: verify_answer(denied)} for g in ADDRESSES})
    pairs = verify.verify_mesh(cluster)
    assert [(p.origin, p.peer, p.reason) for p in pairs] == [
        ("gpu-vm-01", "gpu-vm-03", "Permission denied (publickey)."),
        ("gpu-vm-02", "gpu-vm-03", "Permission denied (publickey).")]
    for name, fake in fakes.items():
        assert len(fake.calls) == 1
        probes = re.findall(r"^probe (\S+) 22 & batch$", fake.calls[0].command, re.M)
        assert sorted(probes) == sorted(a for g, a in ADDRESSES.items() if g != name)
        assert "-o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=5" in fake.calls[0].command


def test_verify_counts_a_guest_that_cannot_run_the_check(tmp_path):
    cluster, fakes = make_cluster(tmp_path, responses={g: {VERIFY: verify_answer({})} for g in ADDRESSES})
    fakes["gpu-vm-02"].responses.clear()  # every command exits 127
    pairs = verify.verify_mesh(cluster)
    assert [(p.origin, p.peer) for p in pairs] == [("gpu-vm-02", "gpu-vm-01"), ("gpu-vm-02", "gpu-vm-03")]
    assert "could not run the check" in pairs[0].reason
    with pytest.raises(RemoteCommandError, match=r"2 of 6 guest pair\(s\)"):
        verify.check_mesh(cluster)


@pytest.mark.parametrize("parallel, in_flight, batch", [(8, 3, 1), (1, 3, 3), (8, 64, 16)])
def test_verify_bounds_the_logins_in_flight_and_derives_each_timeout_from_the_peers(tmp_path, mocker, parallel,
                                                                                   in_flight, batch):
    # the whole check's logins at once are bounded, split between the guests checked at once (here 3)
    mocker.patch.object(verify, "LOGINS_IN_FLIGHT", in_flight)
    cluster, fakes = make_cluster(tmp_path, responses={g: {VERIFY: verify_answer({})} for g in ADDRESSES})
    assert verify.verify_mesh(cluster, parallel=parallel) == []
    for fake in fakes.values():
        (call,) = fake.calls
        assert f"[ $((n % {batch})) -ne 0 ] || wait" in call.command
        # 2 peers in rounds of `batch`, each login at most LOGIN_LIMIT_S, twice (the retry), and slack;
        # not the runbook's command timeout
        assert call.timeout == 2 * -(-2 // batch) * verify.LOGIN_LIMIT_S + verify.CHECK_SLACK_S
        assert f"timeout -k 2 {verify.LOGIN_LIMIT_S} " in call.command


def test_verify_batch_shares_at_64_guests_and_beyond():
    assert [verify.batch_size(n) for n in (1, 8, 16, 64, 200)] == [16, 16, 8, 2, 1]
    assert verify.check_timeout(63, 2) == 2 * 32 * verify.LOGIN_LIMIT_S + verify.CHECK_SLACK_S


def test_a_check_past_its_time_names_the_check_not_its_script(tmp_path, mocker):
    def too_slow(call):
        raise RemoteCommandError(f"gpu-vm-02: `{call.command}` timed out after {call.timeout:g}s; the command was stopped")

    mocker.patch.object(verify, "monotonic", side_effect=itertools.count(0, 1000))  # every check looks slow
    cluster, fakes = make_cluster(tmp_path, responses={g: {VERIFY: too_slow if g == "gpu-vm-02" else verify_answer({})}
                                                       for g in ADDRESSES})
    pairs = verify.verify_mesh(cluster)
    assert [(p.origin, p.peer) for p in pairs] == [("gpu-vm-02", "gpu-vm-01"), ("gpu-vm-02", "gpu-vm-03")]
    assert pairs[0].reason == "could not run the check: guest.ssh_mesh: the mesh check of 2 peers did not finish in 60 s"


STUB_SSH = """#!/bin/sh
eval host=\\${$(($# - 1))}
mkdir "$LOG/run.$$"; ls "$LOG" | grep -c '^run\\.' >> "$LOG/in-flight"; echo "$host" >> "$LOG/tried"
case "$host" in
  10.9.0.1) trap 'kill $!; rmdir "$LOG/run.$$"; exit 143' TERM; sleep 30 & wait ;;  # hangs: only the login's limit ends it
  10.9.0.2) rmdir "$LOG/run.$$"; echo 'Permission denied (publickey).' >&2; exit 255 ;;
  *) sleep 0.2; rmdir "$LOG/run.$$" ;;
esac
"""


def test_the_verify_script_cuts_a_hung_login_tries_it_again_and_keeps_its_batch(tmp_path, mocker):
    # the real script in a real shell, `ssh` a stub: a login that hangs is cut off at LOGIN_LIMIT_S and
    # reported as timed out; a failed login is tried once more; never more than `batch` logins at once
    mocker.patch.object(verify, "LOGIN_LIMIT_S", 1)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ssh").write_text(STUB_SSH)
    (tmp_path / "bin" / "ssh").chmod(0o755)
    (tmp_path / "log").mkdir()
    addresses = [f"10.9.0.{i}" for i in range(1, 8)]
    targets = [Peer(f"g{i}", a, 22, "", "") for i, a in enumerate(addresses)]
    script = verify._verify_script(getpass.getuser(), targets, batch=2)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "LOG": str(tmp_path / "log")}
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    failed = verify.parse_verify("g0", targets, done.stdout)
    assert [(p.peer, p.reason) for p in failed] == [("g0", "login timed out: not done after 1 s"),
                                                    ("g1", "Permission denied (publickey).")]
    tried = (tmp_path / "log" / "tried").read_text().split()
    assert sorted(tried) == sorted(addresses + ["10.9.0.1", "10.9.0.2"])
    assert max(int(n) for n in (tmp_path / "log" / "in-flight").read_text().split()) <= 2


@pytest.mark.parametrize("cap, workers", [(64, 3), (2, 2)])
def test_guests_are_observed_all_at_once_up_to_a_cap(tmp_path, mocker, cap, workers):
    # observing only reads: every guest in one round (64 guests: one round, not eight of eight)
    from gpuvm import engine
    from gpuvm.executors import group

    mocker.patch.object(group, "MOST_AT_ONCE", cap)
    pool = mocker.spy(engine, "run_group")
    cluster, _ = make_cluster(tmp_path, responses={g: {READ: read_response(EMPTY)} for g in ADDRESSES})
    assert sorted(engine.observe_remote(cluster, "guest").raise_failures()) == sorted(ADDRESSES)
    assert pool.call_args.args[2] == workers
    engine.observe_remote(cluster, "guest", parallel=1)
    assert pool.call_args.args[2] == 1


def test_apply_all_writes_in_parallel_then_verifies_once_failures_by_target(tmp_path):
    denied = {"10.0.0.11": "Host key verification failed."}
    responses = {g: {READ: read_response(EMPTY), WRITE: ok("write"), VERIFY: verify_answer(denied)} for g in ADDRESSES}
    responses["gpu-vm-03"][WRITE] = CommandResult("w", 1, "", "disk full")
    cluster, fakes = make_cluster(tmp_path, responses=responses)
    plans = {n: mesh.plan(t, mesh.observe(Context(cluster=cluster), t)) for n, t in cluster.targets.items()}
    for fake in fakes.values():
        fake.calls.clear()
    failures = mesh.apply_all(Context(cluster=cluster), plans)
    assert sorted(failures) == ["gpu-vm-02", "gpu-vm-03"]
    assert "disk full" in str(failures["gpu-vm-03"])
    assert "gpu-vm-02  gpu-vm-01  Host key verification failed." in str(failures["gpu-vm-02"])
    # gpu-vm-03 failed to write: it is left out of the verification, on both sides
    assert [c.command.split("\n")[0] for c in fakes["gpu-vm-03"].calls].count("set -e") == 1
    assert not any(VERIFY.search(c.command) for c in fakes["gpu-vm-03"].calls)
    assert "10.0.0.13" not in next(c.command for c in fakes["gpu-vm-01"].calls if VERIFY.search(c.command))


def test_apply_all_does_not_blame_the_others_for_a_guest_that_does_not_answer(tmp_path):
    """Issue 22: one guest away (here, gpuvm cannot log in to it) failed the mesh of three others."""
    away = verify_answer({"10.0.0.13": "timed out"})
    responses = {g: {READ: read_response(EMPTY), WRITE: ok("write"), VERIFY: away} for g in ADDRESSES}
    cluster, fakes = make_cluster(tmp_path, responses=responses)
    plans = {n: mesh.plan(t, mesh.observe(Context(cluster=cluster), t)) for n, t in cluster.targets.items()}
    del plans["gpu-vm-03"]
    fakes["gpu-vm-03"].reachable = False
    assert mesh.apply_all(Context(cluster=cluster), plans) == {}
    assert "10.0.0.13" not in next(c.command for c in fakes["gpu-vm-01"].calls if VERIFY.search(c.command))


def test_step_shape(tmp_path):
    step = mesh.STEP
    assert (step.name, step.role) == ("guest.ssh_mesh", "guest")
    cluster, _ = make_cluster(tmp_path)
    assert step.wanted(cluster.targets["gpu-vm-01"])
    cluster, _ = make_cluster(tmp_path, "{enabled: false}")
    assert not step.wanted(cluster.targets["gpu-vm-01"])
