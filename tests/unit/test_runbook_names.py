"""Names unique per vCenter: two vCenters may both hold `esx-01` and `gpu-vm-01`. A name used in
more than one vCenter becomes `<vcenter>/<name>` (gpuvm/names.py); references resolve within the
VM's vCenter or take the qualified form; an ambiguous one is refused at file:line: field."""

from __future__ import annotations

import re

import pytest

from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook
from gpuvm.targeting import select

TWINS = """\
vcenters:
  - {name: east, url: https://vc-east.example.com/sdk, password_env: EAST_PASSWORD}
  - {name: west, url: https://vc-west.example.com/sdk, password_env: WEST_PASSWORD}
hosts:
  - {name: esx-01, vcenter: east}
  - {name: esx-01, vcenter: west}
  - {name: esx-02, vcenter: west}
vms:
  - {name: gpu-vm-01, host: esx-01, vcenter: east}
  - {name: gpu-vm-01, host: esx-01, vcenter: west}
  - {name: gpu-vm-02, host: west/esx-01}
  - {name: gpu-vm-03, host: esx-02}
guests:
  hosts:
    - {vm: east/gpu-vm-01, ssh: {address: 10.0.0.1}}
    - {vm: west/gpu-vm-01, ssh: {address: 10.0.0.2}}
    - {vm: gpu-vm-02, ssh: {address: 10.0.0.3}}
  image: {builder: west/gpu-vm-01}
"""


def _load(tmp_path, text):
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_runbook(path)


def test_a_name_in_two_vcenters_is_qualified_and_a_unique_one_is_not(tmp_path):
    book = _load(tmp_path, TWINS)
    assert [h.name for h in book.hosts] == ["east/esx-01", "west/esx-01", "esx-02"]
    assert [(v.name, v.host) for v in book.vms] == [("east/gpu-vm-01", "east/esx-01"), ("west/gpu-vm-01", "west/esx-01"),
                                                   ("gpu-vm-02", "west/esx-01"), ("gpu-vm-03", "esx-02")]
    assert [g.vm for g in book.guests.hosts] == ["east/gpu-vm-01", "west/gpu-vm-01", "gpu-vm-02"]
    assert book.guests.image.builder == "west/gpu-vm-01"
    assert [book.vcenter_of(n) for n in ("east/esx-01", "east/gpu-vm-01", "west/gpu-vm-01", "gpu-vm-02")] == \
        ["east", "east", "west", "west"]
    west = book.part("west")
    assert [h.name for h in west.hosts] == ["west/esx-01", "esx-02"]
    assert [g.vm for g in west.guests.hosts] == ["west/gpu-vm-01", "gpu-vm-02"]


def test_a_vms_unqualified_host_resolves_within_its_own_vcenter(tmp_path):
    book = _load(tmp_path, TWINS.replace("{name: gpu-vm-02, host: west/esx-01}", "{name: gpu-vm-02, host: esx-01, vcenter: east}"))
    assert book.vms[2].host == "east/esx-01" and book.vcenter_of("gpu-vm-02") == "east"


def test_a_runbook_without_shared_names_keeps_every_name_as_written(tmp_path):
    book = _load(tmp_path, TWINS.replace("{name: esx-01, vcenter: west}", "{name: esx-03, vcenter: west}")
                 .replace("host: esx-01, vcenter: west}", "host: esx-03, vcenter: west}")
                 .replace("{name: gpu-vm-01, host: esx-03", "{name: gpu-vm-04, host: esx-03")
                 .replace("host: west/esx-01", "host: west/esx-03").replace("west/gpu-vm-01", "gpu-vm-04")
                 .replace("east/gpu-vm-01", "gpu-vm-01"))
    assert [h.name for h in book.hosts] == ["esx-01", "esx-03", "esx-02"]
    assert [v.name for v in book.vms] == ["gpu-vm-01", "gpu-vm-04", "gpu-vm-02", "gpu-vm-03"]


CASES = [
    ("{name: esx-01, vcenter: west}", "{name: esx-01, vcenter: east}",
     r":6: hosts\[1\]\.name: host 'esx-01' is declared twice in vCenter 'east' \(also hosts\[0\]\)"),
    ("{name: gpu-vm-01, host: esx-01, vcenter: west}", "{name: gpu-vm-01, host: esx-01, vcenter: east}",
     r":10: vms\[1\]\.name: VM 'gpu-vm-01' is declared twice in vCenter 'east' \(also vms\[0\]\)"),
    ("{name: gpu-vm-02, host: west/esx-01}", "{name: gpu-vm-02, host: esx-01}",
     r":11: vms\[2\]\.host: host 'esx-01' is in several vCenters: give vcenter, or write east/esx-01 or west/esx-01"),
    ("{name: gpu-vm-02, host: west/esx-01}", "{name: gpu-vm-02, host: north/esx-01}",
     r":11: vms\[2\]\.host: host 'north/esx-01' is not in hosts \(vCenter 'north' is not declared"),
    ("{name: gpu-vm-02, host: west/esx-01}", "{name: gpu-vm-02, host: west/esx-01, vcenter: east}",
     r":11: vms\[2\]\.vcenter: VM 'gpu-vm-02' is in vCenter 'east' but its host 'west/esx-01' is in 'west'"),
    ("{name: gpu-vm-03, host: esx-02}", "{name: gpu-vm-03, host: esx-02, vcenter: east}",
     r":12: vms\[3\]\.vcenter: VM 'gpu-vm-03' is in vCenter 'east' but its host 'esx-02' is in 'west'"),
    ("{vm: east/gpu-vm-01,", "{vm: gpu-vm-01,",
     r":15: guests\.hosts\[0\]\.vm: VM 'gpu-vm-01' is in several vCenters: write east/gpu-vm-01 or west/gpu-vm-01"),
    ("{vm: west/gpu-vm-01,", "{vm: east/gpu-vm-03,",
     r":16: guests\.hosts\[1\]\.vm: VM 'east/gpu-vm-03' is not in vms \(east's: gpu-vm-01\)"),
    ("{builder: west/gpu-vm-01}", "{builder: gpu-vm-01}",
     r":18: guests\.image\.builder: VM 'gpu-vm-01' is in several vCenters: write east/gpu-vm-01 or west/gpu-vm-01"),
    ("{name: esx-02, vcenter: west}", "{name: west/esx-02, vcenter: west}",
     r":7: hosts\[2\]\.name: 'west/esx-02' is not a valid name"),
]


@pytest.mark.parametrize("old,new,expected", CASES, ids=[c[2][:60] for c in CASES])
def test_a_duplicate_or_ambiguous_name_is_refused_at_file_line_field(tmp_path, old, new, expected):
    assert old in TWINS
    with pytest.raises(InputError) as caught:
        _load(tmp_path, TWINS.replace(old, new, 1))
    assert caught.value.exit_code == 2
    assert re.search(expected, str(caught.value)), str(caught.value)


def test_target_takes_the_qualified_name_a_vcenter_or_a_unique_name(tmp_path):
    book = _load(tmp_path, TWINS)
    assert select(book, ["west/esx-01"]).names == {"west/esx-01"}
    assert select(book, ["east/gpu-vm-01", "gpu-vm-03"]).names == {"east/gpu-vm-01", "gpu-vm-03"}
    assert select(book, ["east"]).names == {"east/esx-01"}
    assert select(book, ["west"]).names == {"west/esx-01", "esx-02"}
    assert select(book, ["west/esx-02"]).names == {"esx-02"}  # qualified though unique: the same host


def test_target_an_ambiguous_name_is_refused_listing_the_qualified_choices(tmp_path):
    book = _load(tmp_path, TWINS)
    with pytest.raises(InputError) as refused:
        select(book, ["esx-01"])
    assert refused.value.exit_code == 2
    assert str(refused.value) == ("--target esx-01: a name in several vCenters; give one of east/esx-01, "
                                  "west/esx-01 (or a vCenter: east, west)")
    with pytest.raises(InputError, match="--target gpu-vm-01: a name in several vCenters; give one of "
                                         "east/gpu-vm-01, west/gpu-vm-01"):
        select(book, ["gpu-vm-01"])


CAMPAIGN = TWINS.replace("  image: {builder: west/gpu-vm-01}\n", "") + """\
benchmarks:
  launcher: west/gpu-vm-01
  runs:
    - {name: each, kind: nccl_allreduce, scenario: concurrent, groups: [[east/gpu-vm-01, west/gpu-vm-01]]}
  setups:
    - name: twins
      vms: [{name: east/gpu-vm-01, cpus: 4}, {name: west/gpu-vm-01}]
      guests: [{vm: east/gpu-vm-01, slots: 1}]
"""


def test_a_campaign_names_shared_vms_qualified_in_launcher_groups_and_setups(tmp_path):
    from gpuvm.runbook.setups import select_setup

    book = _load(tmp_path, CAMPAIGN)
    spec = book.benchmarks
    assert spec.launcher == "west/gpu-vm-01" and spec.runs[0].groups == [["east/gpu-vm-01", "west/gpu-vm-01"]]
    twins = select_setup(book, "twins")
    assert [(v.name, v.power, v.cpus) for v in twins.vms] == [("east/gpu-vm-01", "on", 4), ("west/gpu-vm-01", "on", None),
                                                             ("gpu-vm-02", "off", None), ("gpu-vm-03", "off", None)]
    assert [(g.vm, twins.slots_of(g)) for g in twins.guests.hosts] == [("east/gpu-vm-01", 1), ("west/gpu-vm-01", 1)]
    with pytest.raises(InputError, match=r":19: benchmarks\.launcher: VM 'gpu-vm-01' is in several vCenters"):
        _load(tmp_path, CAMPAIGN.replace("launcher: west/gpu-vm-01", "launcher: gpu-vm-01"))
    with pytest.raises(InputError, match=r":24: benchmarks\.setups\[0\]\.vms\[0\]\.name: VM 'gpu-vm-01' is in several"):
        _load(tmp_path, CAMPAIGN.replace("vms: [{name: east/gpu-vm-01", "vms: [{name: gpu-vm-01"))


def test_a_vcenters_inventory_takes_the_runbooks_qualified_names_and_vcenter_keeps_its_own():
    from gpuvm.plan import Change
    from gpuvm.steps.reboot_memo import identity
    from gpuvm.steps.vm_lifecycle import clone_act
    from gpuvm.vsphere.named import renamed
    from tests.unit.factories import inventory, r750xa, vm

    read = inventory([r750xa("esx-01"), r750xa("esx-02")],
                     [vm("gpu-vm-01", "esx-01"), vm("other", "esx-01"), vm("gpu-vm-03", "esx-02")])
    read.templates = {"ubuntu": vm("ubuntu", "esx-01")}
    named = renamed(read, ["east/esx-01", "esx-02"], ["east/gpu-vm-01", "gpu-vm-03"])
    assert list(named.hosts) == ["east/esx-01", "esx-02"] and named.hosts["east/esx-01"].name == "east/esx-01"
    assert {n: (v.name, v.host, v.moid) for n, v in named.vms.items()} == {
        "east/gpu-vm-01": ("east/gpu-vm-01", "east/esx-01", "vm-gpu-vm-01"), "other": ("other", "east/esx-01", "vm-other"),
        "gpu-vm-03": ("gpu-vm-03", "esx-02", "vm-gpu-vm-03")}
    assert sorted(v.name for v in named.vms_on("east/esx-01")) == ["east/gpu-vm-01", "other"]
    assert named.templates["ubuntu"].host == "east/esx-01"
    assert renamed(read, ["esx-01"], ["gpu-vm-01"]) is read  # nothing qualified: the inventory as read
    # what gpuvm records in vCenter names objects as vCenter does, whichever runbook names them
    assert clone_act("east/gpu-vm-01") == clone_act("gpu-vm-01") == "clone gpu-vm-01"
    reboot = Change("host.passthrough", "east/esx-01", "pci 0000:17:00.0", "enabled", False, True)
    assert identity(reboot) == identity(Change("host.passthrough", "esx-01", "pci 0000:17:00.0", "enabled", False, True))
