"""Installers run as root only once their sha256 is the runbook's (issue 21, item 8): the runbook must
give it (checked at load, before anything is touched), and a download with another digest fails its
guest naming both digests, with nothing run."""

from __future__ import annotations

import re

import pytest

from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_rdma
from gpuvm.steps.base import Context

GENUINE = "405089ed2b1a6ec8f26f562c2930fcdd9aff7f881b647f55830c5dd877f96afa"
OTHER = "0" * 63 + "1"
MOFED = ("{stack: mofed, version: 5.8-3.0.7.0, installer: 'https://mirror.example/MLNX_OFED_LINUX-{version}.tgz'"
         "SHA}")
RUNBOOK = """hosts: [{name: esx-01}]
vms: [{name: train-01, host: esx-01}]
guests:
  GUESTS
  hosts:
    - {vm: train-01, ssh: {address: 10.0.0.21, user: ubuntu, sudo: true}}
"""


def runbook(tmp_path, guests: str):
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK.replace("GUESTS", guests))
    return path


@pytest.mark.parametrize("guests, error", [
    ("driver: {version: 535.183.01}", r"rb\.yaml:4: guests\.driver\.sha256: required field is missing"),
    ("driver: {version: 535.183.01, sha256: 'sha256:abc'}", r"rb\.yaml:4: guests\.driver\.sha256: 'sha256:abc' is not a sha256"),
    ("rdma: " + MOFED.replace("SHA", ""), r"rb\.yaml:4: guests\.rdma\.sha256: required field is missing"),
    ("rdma: " + MOFED.replace("SHA", f", sha256: {GENUINE}z"), r"rb\.yaml:4: guests\.rdma\.sha256: .* is not a sha256"),
    ("rdma: {stack: inbox, sha256: " + GENUINE + "}", r"guests\.rdma\.sha256: only stack: mofed fetches an installer"),
])
def test_a_missing_or_malformed_sha256_fails_the_load(tmp_path, guests, error):
    with pytest.raises(InputError, match=error):
        load_runbook(runbook(tmp_path, guests))


def test_a_sha256_in_capitals_is_read_as_sha256sum_prints_it(tmp_path):
    book = load_runbook(runbook(tmp_path, f"driver: {{version: 535.183.01, sha256: {GENUINE.upper()}}}"))
    assert book.guests.driver.sha256 == GENUINE


@pytest.mark.parametrize("printed, shown", [(f"{OTHER}  /tmp/gpuvm-install.Ab12/x.tgz\n", OTHER), ("", "(none printed)")])
def test_a_download_with_another_digest_is_never_unpacked_or_run(tmp_path, printed, shown):
    fake = FakeExecutor("train-01", {re.compile("^mktemp -d"): ok("mktemp", "/tmp/gpuvm-install.Ab12\n"),
                                     re.compile("^sha256sum "): ok("sha256sum", printed),
                                     re.compile(""): ok("anything")})
    book = load_runbook(runbook(tmp_path, "rdma: " + MOFED.replace("SHA", f", sha256: {GENUINE}")))
    cluster = build_cluster(book, tmp_path / "state", RemoteOptions(executor_factory=lambda n, a: fake))
    target = cluster.targets["train-01"]
    changes = guest_rdma.plan(target, None)
    with pytest.raises(RemoteCommandError) as failed:
        guest_rdma.apply(Context(cluster=cluster), target, changes)
    assert str(failed.value) == (
        f"MLNX_OFED 5.8-3.0.7.0 installer: https://mirror.example/MLNX_OFED_LINUX-5.8-3.0.7.0.tgz has sha256 {shown}, "
        f"the runbook's sha256 is {GENUINE}: not run (a changed or tampered download, or a stale sha256 in the runbook)")
    assert [c.line for c in fake.calls] == [
        "mktemp -d /tmp/gpuvm-install.XXXXXX",
        "curl -fsSL --retry 3 -o /tmp/gpuvm-install.Ab12/MLNX_OFED_LINUX-5.8-3.0.7.0.tgz "
        "https://mirror.example/MLNX_OFED_LINUX-5.8-3.0.7.0.tgz",
        "sha256sum /tmp/gpuvm-install.Ab12/MLNX_OFED_LINUX-5.8-3.0.7.0.tgz",
        "sudo -n rm -rf /tmp/gpuvm-install.Ab12",  # the only root command: the download removed
    ]


def test_a_failed_checksum_command_runs_nothing(tmp_path):
    fake = FakeExecutor("train-01", {re.compile("^mktemp -d"): ok("mktemp", "/tmp/gpuvm-install.Ab12\n"),
                                     re.compile("^sha256sum "): CommandResult("sha256sum", 1, "", "sha256sum: No such file"),
                                     re.compile(""): ok("anything")})
    book = load_runbook(runbook(tmp_path, "rdma: " + MOFED.replace("SHA", f", sha256: {GENUINE}")))
    cluster = build_cluster(book, tmp_path / "state", RemoteOptions(executor_factory=lambda n, a: fake))
    target = cluster.targets["train-01"]
    with pytest.raises(RemoteCommandError):
        guest_rdma.apply(Context(cluster=cluster), target, guest_rdma.plan(target, None))
    assert [c.line for c in fake.calls if c.sudo] == ["sudo -n rm -rf /tmp/gpuvm-install.Ab12"]
