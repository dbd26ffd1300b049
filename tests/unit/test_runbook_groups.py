"""VM groups in the runbook (gpuvm.runbook.groups): count + name pattern + hosts, expanded before
validation, errors at the group's lines."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook

HEAD = """\
hosts: [{name: esx-01}, {name: esx-02}, {name: esx-03}]
vms:
"""


def load(tmp_path, vms: str):
    path = tmp_path / "rb.yaml"
    path.write_text(HEAD + textwrap.indent(textwrap.dedent(vms), "  "))
    return load_runbook(path)


def test_one_per_host_by_default_round_robin_and_counted_addresses(tmp_path):
    rb = load(tmp_path, """\
        - name: solo
          host: esx-01
        - name: train-{n:02d}
          count: 5
          hosts: [esx-01, esx-02, esx-03]
          template: ubuntu-gpu
          cpus: 8
          cloud_init: {address: 10.0.0.21/24, ssh_public_key_file: key.pub}
        - name: infer-{index}
          hosts: [esx-02, esx-03]
        """)
    assert [(vm.name, vm.host) for vm in rb.vms] == [
        ("solo", "esx-01"), ("train-01", "esx-01"), ("train-02", "esx-02"), ("train-03", "esx-03"),
        ("train-04", "esx-01"), ("train-05", "esx-02"), ("infer-0", "esx-02"), ("infer-1", "esx-03")]
    assert [vm.cloud_init.address for vm in rb.vms[1:6]] == [f"10.0.0.{a}/24" for a in range(21, 26)]
    assert {vm.cpus for vm in rb.vms[1:6]} == {8} and {vm.template for vm in rb.vms[1:6]} == {"ubuntu-gpu"}


def test_an_error_in_an_expanded_vm_names_the_group_line(tmp_path):
    with pytest.raises(InputError, match=r"rb\.yaml:6: vms\[1\] \(gpu-1\)\.cpus: .*greater than or equal to 1"):
        load(tmp_path, """\
            - {name: solo, host: esx-01}
            - name: gpu-{n}
              count: 2
              cpus: 0
              hosts: [esx-01]
            """)


@pytest.mark.parametrize("group, line, message", [
    ("{name: train, count: 2, hosts: [esx-01]}", 3, r"vms\[0\]\.name: name 'train' gives every VM of the group the same name"),
    ("{name: 't-{m}', count: 2, hosts: [esx-01]}", 3, r"vms\[0\]\.name: name pattern 't-\{m\}' cannot be filled in"),
    ("{name: 't-{n}', count: 0, hosts: [esx-01]}", 3, r"vms\[0\]\.count: count must be a whole number from 1 to 4096"),
    ("{name: 't-{n}', hosts: []}", 3, r"vms\[0\]\.hosts: a VM group needs hosts"),
    ("{name: 't-{n}', count: 2, host: esx-01, hosts: [esx-02]}", 3, r"vms\[0\]\.hosts: give host .* or hosts"),
    ("{name: 't-{n}', count: 2, hosts: [esx-09]}", 3, r"vms\[0\] \(t-1\)\.host: .*esx-09"),
    # bounded before anything is expanded (issue 33): the field, the limit
    ("{name: 'vm{n:0100}', count: 2, hosts: [esx-01]}", 3,
     r"vms\[0\]\.name: name pattern 'vm\{n:0100\}': field \{n\} has a width of 100; at most 80 \(a VM name's length\)"),
    ("{name: 'vm{index:>5000d}', count: 2, hosts: [esx-01]}", 3, r"vms\[0\]\.name: .*field \{index\} has a width of 5,000; at most 80"),
    ("{name: 'vm{n:.200f}', count: 2, hosts: [esx-01]}", 3, r"vms\[0\]\.name: .*field \{n\} has a precision of 200; at most 80"),
    ("{name: 'vm{n:{index}}', count: 2, hosts: [esx-01]}", 3, r"vms\[0\]\.name: .*field \{n\}'s format spec may not hold another field"),
    ("{name: 'vm-%s{n}', count: 2, hosts: [esx-01]}" % ("a" * 300), 3, r"vms\[0\]\.name: name pattern of 306 characters: at most 256"),
    ("{name: 'vm{n[0]}', count: 2, hosts: [esx-01]}", 3, r"vms\[0\]\.name: name pattern 'vm\{n\[0\]\}' cannot be filled in \(TypeError"),
    ("{name: 'vm{n}', hosts: [%s]}" % ", ".join(["esx-01"] * 4097), 3,
     r"vms\[0\]\.hosts: 4,097 hosts, one VM each: at most 4096 VMs in a group \(give count to place fewer\)"),
])
def test_bad_groups_are_refused_at_their_line(tmp_path, group, line, message):
    with pytest.raises(InputError, match=rf"rb\.yaml:{line}: {message}"):
        load(tmp_path, f"- {group}\n")


def test_names_made_twice_are_refused_like_any_duplicate(tmp_path):
    with pytest.raises(InputError, match=r"train-1"):
        load(tmp_path, """\
            - {name: train-1, host: esx-01}
            - {name: 'train-{n}', count: 2, hosts: [esx-01, esx-02]}
            """)


def test_the_groups_together_are_bounded_before_any_is_expanded(tmp_path, monkeypatch):
    """Each group within its count, all of them past the values a runbook may expand to (the limit
    made small here; at 1,000,000, 250 groups of 4,096 VMs would be)."""
    monkeypatch.setattr("gpuvm.runbook.groups.MAX_NODES", 2000)
    expanded = []
    monkeypatch.setattr("gpuvm.runbook.groups._expand", lambda *args: expanded.append(args) or [])
    groups = "".join(f"- {{name: 'g{g}-{{n}}', count: 100, hosts: [esx-01], cpus: 2}}\n" for g in range(7))
    with pytest.raises(InputError, match=r"rb\.yaml:9: vms\[6\]\.count: the VM groups expand to more than 2,000 values "
                                         r"\(this one: 100 VMs of 3 values each\); split the runbook"):
        load(tmp_path, groups)
    assert expanded == []  # refused before the first group was expanded


def test_the_issues_gigabyte_names_are_refused_in_bounded_memory(tmp_path):
    """`vm{n:0999999999}` made names of a gigabyte each (validate used 4.9 GB, then a MemoryError
    traceback); under a 1 GB address-space limit it is now one line, exit 2."""
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(HEAD + "  - {name: 'vm{n:0999999999}', hosts: [esx-01, esx-02]}\n")
    result = subprocess.run(["bash", "-c", 'ulimit -v 1000000 && exec "$0" -m gpuvm.cli.main validate "$1"',
                             sys.executable, str(runbook)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {runbook}:3: vms[0].name: name pattern 'vm{{n:0999999999}}': field {{n}} has a width of "
        "999,999,999; at most 80 (a VM name's length)"], result.stderr
