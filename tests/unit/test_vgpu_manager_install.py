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


def host(answers: dict[str, str | CommandResult]) -> FakeExecutor:
    """An ESXi shell whose commands answer `answers[first word]` (a string: what it prints, exit 0)."""
    return FakeExecutor("esx-01", {
        re.compile(f"^{word} "): CommandResult(word, 0, out, "") if isinstance(out, str) else out
        for word, out in answers.items()} | {re.compile(""): CommandResult("", 0, "", "")})


COPY = "/vmfs/volumes/ds1/gpuvm-install.Ab12"  # where mktemp -d makes the private copy's directory
GENUINE = {"mktemp": COPY + "\n", "sha256sum": f"{'a' * 64}  {COPY}/x.zip\n", "esxcli": "Reboot Required: true\n"}


def test_install_replacing_another_component_then_removal(tmp_path):
    fake = host(GENUINE)
    ctx = context(tmp_path, fake)
    InstallManager("550.54.16", BUNDLE, BUNDLE, "a" * 64, replaces="NVD-VGPU-800").in_maintenance(ctx, "esx-01")
    RemoveManager("NVD-AIE-800").in_maintenance(ctx, "esx-01")
    copy = f"{COPY}/{BUNDLE.rsplit('/', 1)[1]}"
    assert fake.commands == ["mktemp -d /vmfs/volumes/ds1/gpuvm-install.XXXXXX",
                             f"cp {BUNDLE} {copy}",
                             f"sha256sum {copy}",  # the file installed, checked just before
                             "esxcli software component remove -n NVD-VGPU-800",
                             f"esxcli software component apply -d {copy}",
                             f"rm -rf {COPY}",
                             "esxcli software component remove -n NVD-AIE-800"]


@pytest.mark.parametrize("printed, found", [(f"{'b' * 64}  {COPY}/x.zip\n", "b" * 64), ("", "(none printed)")])
def test_a_bundle_changed_since_its_check_is_refused_and_nothing_removed_or_installed(tmp_path, printed, found):
    """Issue 33, point 6: esxi.vgpu_manager checked the bundle, host.reboot installs it later; the
    install checks the copy it installs from, and a changed bundle is refused naming host, file and
    both digests, the installed component left as it is."""
    fake = host(GENUINE | {"sha256sum": printed})
    with pytest.raises(RemoteCommandError) as refused:
        InstallManager("550.54.16", BUNDLE, BUNDLE, "a" * 64, replaces="NVD-VGPU-800").in_maintenance(
            context(tmp_path, fake), "esx-01")
    assert str(refused.value) == (f"host esx-01: NVIDIA host driver bundle {BUNDLE} has sha256 {found}, the runbook's "
                                  f"nvidia_host_driver.sha256 is {'a' * 64}: not installed (a changed or tampered "
                                  "bundle, or a stale sha256 in the runbook)")
    assert not [c for c in fake.commands if c.startswith("esxcli")]
    assert fake.commands[-1] == f"rm -rf {COPY}"


def test_an_esxcli_failure_is_one_line_naming_the_host_and_the_command(tmp_path):
    stderr = ("[MetadataDownloadError]\n Could not download from depot at zip:/x.zip?index.xml, skipping\n"
              " url = zip:/x.zip?index.xml\nPlease refer to the log file for more details.\n")
    fake = host(GENUINE | {"esxcli": CommandResult("esxcli", 1, "", stderr)})
    with pytest.raises(RemoteCommandError, match=r"^host esx-01: `esxcli software component apply -d \S+` failed "
                                                 r"\(exit 1\): \[MetadataDownloadError\] Could not download from "
                                                 r"depot at zip:/x\.zip\?index\.xml, skipping$"):
        InstallManager("550.54.16", BUNDLE, BUNDLE, "a" * 64).in_maintenance(context(tmp_path, fake), "esx-01")
