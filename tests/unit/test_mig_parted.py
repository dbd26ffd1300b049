"""NVIDIA mig-parted config files as a guest's MIG layout (issue 22, item 10): read from a
reconstruction of NVIDIA's published examples, expanded per GPU, errors naming file:line: field."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from gpuvm import mig
from gpuvm.errors import InputError
from gpuvm.executors.fake import FakeExecutor
from gpuvm.mig import GpuLayout
from gpuvm.plan import Disruption
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_mig
from gpuvm.steps.guest_mig import GpuMig
from tests.unit.factories import ONE_GUEST_RUNBOOK

CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "mig_parted" / "config.yaml"
A100_80, A100_40, H100 = "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 PCIe"
RUNBOOK = ONE_GUEST_RUNBOOK + """\
      mig:
        config_file: {file}
        config: {config}
"""


def runbook(tmp_path: Path, config: str, file: str = "mig/config.yaml", text: str | None = None):
    (tmp_path / "mig").mkdir(exist_ok=True)
    if text is None:
        shutil.copy(CONFIG, tmp_path / "mig" / "config.yaml")
    else:
        (tmp_path / "mig" / "config.yaml").write_text(textwrap.dedent(text))
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK.format(file=file, config=config))
    return load_runbook(path)


@pytest.mark.parametrize("config, gpus, expected", [
    ("all-disabled", {0: A100_80, 1: A100_80}, {0: GpuLayout(False), 1: GpuLayout(False)}),
    ("all-enabled", {0: A100_80}, {0: GpuLayout(True)}),
    ("all-1g.5gb", {0: A100_40}, {0: GpuLayout(True, ("1g.5gb",) * 7)}),
    # device filters: 7 on an 80GB card (A100 or H100), 4 on a 40GB one, in one guest
    ("all-1g.10gb", {0: A100_80, 1: A100_40, 2: H100},
     {0: GpuLayout(True, ("1g.10gb",) * 7), 1: GpuLayout(True, ("1g.10gb",) * 4), 2: GpuLayout(True, ("1g.10gb",) * 7)}),
    ("all-3g.40gb", {0: A100_80, 1: A100_40}, {0: GpuLayout(True, ("3g.40gb",) * 2)}),  # the 40GB card: no entry
    ("all-balanced", {0: A100_80}, {0: GpuLayout(True, ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))}),
    ("custom-config", {i: A100_80 for i in range(4)},
     {0: GpuLayout(False), 1: GpuLayout(False), 2: GpuLayout(True, ("1g.10gb",) * 7),
      3: GpuLayout(True, ("3g.40gb",) * 2)}),
])
def test_a_config_of_the_file_is_the_guests_layout(tmp_path, config, gpus, expected):
    layout = runbook(tmp_path, config).guests.hosts[0].mig
    assert mig.expand(layout, gpus) == expected


def test_the_step_plans_from_a_file_config(tmp_path):
    book = runbook(tmp_path, "all-1g.10gb")
    cluster = build_cluster(book, tmp_path, RemoteOptions(executor_factory=lambda name, access: FakeExecutor(name)))
    fact = (GpuMig(0, A100_80, "Disabled", "Disabled"), GpuMig(1, A100_40, "Enabled", "Enabled", ("3g.20gb",)))
    rows = [(c.resource, c.field, c.before, c.after, c.disruption)
            for c in guest_mig.plan(cluster.targets["gpu-vm-01"], fact)]
    assert rows == [(f"GPU 0 ({A100_80})", "mig.mode", "Disabled", "Enabled", Disruption.NONE),
                    (f"GPU 0 ({A100_80})", "gpu instances", "none", "1g.10gb x7", Disruption.NONE),
                    (f"GPU 1 ({A100_40})", "gpu instances", "3g.20gb x1", "1g.10gb x4", Disruption.NONE)]


@pytest.mark.parametrize("config, file, text, message", [
    ("all-2g.20gb", "mig/config.yaml", None,
     r"rb\.yaml:9: guests\.hosts\[0\]\.mig\.config: 'all-2g\.20gb' is not a config of .*config\.yaml "
     r"\(its configs: all-disabled, all-enabled, all-1g\.5gb, all-1g\.5gb\.me, all-1g\.10gb, "),
    ("all-disabled", "mig/missing.yaml", None, r"rb\.yaml:8: guests\.hosts\[0\]\.mig\.config_file: "
                                               r"cannot read the mig-parted config file .*missing\.yaml: No such file"),
    ("x", "mig/config.yaml", """\
        version: v2
        mig-configs: {x: [{devices: all, mig-enabled: false}]}
        """, r"config\.yaml:1: version: mig-parted config file with version 'v2'; gpuvm reads `version: v1`"),
    ("x", "mig/config.yaml", """\
        version: v1
        mig-configs:
          x:
            - devices: all
              mig-enabled: false
            - devices: [1]
              mig-enabled: sometimes
        """, r"config\.yaml:7: mig-configs\.x\[1\]\.mig-enabled: Input should be a valid boolean"),
    ("x", "mig/config.yaml", """\
        version: v1
        mig-configs:
          x:
            - device-filter: ["20B5"]
              devices: all
              mig-enabled: true
        """, r"config\.yaml:4: mig-configs\.x\[0\]\.device-filter: '20B5' is not a PCI id like 0x20B510DE"),
    ("x", "mig/config.yaml", """\
        version: v1
        mig-configs:
          x:
            - devices: all
              mig-enabled: true
              mig-strategy: single
        """, r"config\.yaml:6: mig-configs\.x\[0\]\.mig-strategy: unknown field"),
    ("x", "mig/config.yaml", "mig-configs: [1, 2]\n", r"config\.yaml:1: version: mig-parted config file with no version; gpuvm reads `version: v1`"),
    ("x", "mig/config.yaml", "kind: ConfigMap\n", r"config\.yaml:1: \(top level\): not a mig-parted config file"),
    ("x", "/dev/zero", None, r"rb\.yaml:8: guests\.hosts\[0\]\.mig\.config_file: /dev/zero: not a regular file"),
])
def test_errors_name_the_file_line_and_field(tmp_path, config, file, text, message):
    with pytest.raises(InputError, match=message):
        runbook(tmp_path, config, file, text)


def test_an_unknown_key_in_the_reference_names_the_runbook_line(tmp_path):
    path = tmp_path / "rb.yaml"
    shutil.copytree(CONFIG.parent, tmp_path / "mig")
    path.write_text(RUNBOOK.format(file="mig/config.yaml", config="all-disabled") + "        profile: x\n")
    with pytest.raises(InputError, match=r"rb\.yaml:10: guests\.hosts\[0\]\.mig\.profile: unknown field"):
        load_runbook(path)
