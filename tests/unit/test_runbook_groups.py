"""VM groups in the runbook (gpuvm.runbook.groups): count + name pattern + hosts, expanded before
validation, errors at the group's lines."""

from __future__ import annotations

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
