"""What esxi.vgpu_manager leaves for host.reboot to do in maintenance mode: the esxcli commands, and
esxcli's error as one line naming the host."""

from __future__ import annotations

import re

import pytest

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps.base import Context
from gpuvm.steps.esxi_vgpu_manager import InstallManager, RemoveManager

BUNDLE = "/vmfs/volumes/ds1/NVD-AIE-800_550.54.16-1OEM.800.1.0.20613240_1.zip"


def context(tmp_path, fake: FakeExecutor) -> Context:
    path = tmp_path / "runbook.yaml"
    path.write_text(f"hosts:\n  - {{name: esx-01, ssh: {{address: 10.0.0.11, user: root}}, nvidia_host_driver: "
                    f"{{bundle: {BUNDLE}, version: 550.54.16, sha256: '{'a' * 64}'}}}}\n")
    return Context(cluster=build_cluster(load_runbook(path), tmp_path,
                                         RemoteOptions(executor_factory=lambda name, access: fake)))


def test_install_replacing_another_component_then_removal(tmp_path):
    fake = FakeExecutor("esx-01", {re.compile(""): CommandResult("", 0, "Reboot Required: true\n", "")})
    ctx = context(tmp_path, fake)
    InstallManager("550.54.16", BUNDLE, BUNDLE, "a" * 64, replaces="NVD-VGPU-800").in_maintenance(ctx, "esx-01")
    RemoveManager("NVD-AIE-800").in_maintenance(ctx, "esx-01")
    assert fake.commands == ["esxcli software component remove -n NVD-VGPU-800",
                             f"esxcli software component apply -d {BUNDLE}",
                             "esxcli software component remove -n NVD-AIE-800"]


def test_an_esxcli_failure_is_one_line_naming_the_host_and_the_command(tmp_path):
    stderr = ("[MetadataDownloadError]\n Could not download from depot at zip:/x.zip?index.xml, skipping\n"
              " url = zip:/x.zip?index.xml\nPlease refer to the log file for more details.\n")
    fake = FakeExecutor("esx-01", {re.compile(""): CommandResult("", 1, "", stderr)})
    with pytest.raises(RemoteCommandError, match=r"^host esx-01: `esxcli software component apply -d \S+` failed "
                                                 r"\(exit 1\): \[MetadataDownloadError\] Could not download from "
                                                 r"depot at zip:/x\.zip\?index\.xml, skipping$"):
        InstallManager("550.54.16", BUNDLE, BUNDLE, "a" * 64).in_maintenance(context(tmp_path, fake), "esx-01")
