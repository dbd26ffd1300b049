"""Runbook validation: every error names file, line and field, and says what is allowed."""

from __future__ import annotations

import textwrap

import pytest

from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook

BASE = """\
vcenter:
  url: https://vc.example.com/sdk
  user: administrator@vsphere.local
  password_env: VC_PASSWORD
hosts:
  - name: esx-01
    passthrough: [{model: A100}]
vms:
  - name: vm1
    host: esx-01
    gpus: {mode: passthrough, count: 2}
"""

CASES = [
    # (replace this, with that, expected message regex)
    ("count: 2", "count: 0", r":11: vms\[0\]\.gpus\.count: Input should be greater than or equal to 1"),
    ("count: 2", "count: two", r":11: vms\[0\]\.gpus\.count: Input should be a valid integer"),
    ("mode: passthrough", "mode: magic", r":11: vms\[0\]\.gpus: Input tag 'magic' .* expected tags: 'passthrough', 'dynamic', 'vgpu'"),
    ("count: 2}", "count: 2, adresses: []}", r":11: vms\[0\]\.gpus\.adresses: unknown field"),
    ("    host: esx-01", "    host: esx-09", r":10: vms\[0\]\.host: host 'esx-09' is not in hosts \(declared: esx-01\)"),
    ("[{model: A100}]", "[{model: A100, id: '10de:20b5'}]", r":7: hosts\[0\]\.passthrough\[0\]: give exactly one of model, id or address"),
    ("[{model: A100}]", "[{address: 17:00}]", r":7: hosts\[0\]\.passthrough\[0\]\.address: '17:00' is not a PCI address"),
    ("[{model: A100}]", "[{id: nvidia}]", r":7: hosts\[0\]\.passthrough\[0\]\.id: 'nvidia' is not a vendor:device id"),
    ("url: https://vc.example.com/sdk", "url: vc example", r":2: vcenter\.url: 'vc example' is not a URL"),
    ("  - name: vm1", "  - name: 'vm1; rm -rf /'", r":9: vms\[0\]\.name: 'vm1; rm -rf /' is not a valid name"),
    ("count: 2}", "count: 2, addresses: ['0000:17:00.0']}", r":11: vms\[0\]\.gpus: count is 2 but 1 address\(es\) are given"),
    ("vms:", "vms:\n  - {name: vm1, host: esx-01, mmio: 300}", r":9: vms\[0\]\.mmio: 64-bit MMIO size 300 GB is not a power of two"),
    ("vms:", "vms:\n  - {name: vm1, host: esx-01, power: maybe}", r":9: vms\[0\]\.power: Input should be 'on' or 'off'"),
    ("hosts:", "colour: blue\nhosts:", r":5: colour: unknown field"),
    ("  - name: vm1", "  - name: vm1\n    firmware: uefi", r":10: vms\[0\]\.firmware: Input should be 'efi' or 'bios'"),
    ("  - name: esx-01\n", "  - name: esx-01\n    graphics: direct\n", r":7: hosts\[0\]\.graphics: Input should be 'shared' or 'shared_direct'"),
    ("vms:\n", "vms:\n  - {host: esx-01}\n", r":9: vms\[0\]\.name: required field is missing"),
    ("vms:\n", "vms:\n  - {name: vm1, host: esx-01}\n", r":10: vms\[1\]\.name: VM 'vm1' is declared twice"),
    # a misspelt field: the runbook's field of that place spelt closest, when one is close
    ("    host: esx-01\n", "    host: esx-01\n    cpu: 8\n", r":11: vms\[0\]\.cpu: unknown field \(did you mean cpus\?"),
    ("count: 2", "count: 2, adresses: []", r"vms\[0\]\.gpus\.adresses: unknown field \(did you mean addresses\?"),
    ("  password_env", "  pasword_env", r":4: vcenter\.pasword_env: unknown field \(did you mean password_env\?"),
    ("    host: esx-01\n", "    host: esx-01\n    zzz: 8\n", r":11: vms\[0\]\.zzz: unknown field \(check the spelling"),
]


@pytest.mark.parametrize("old,new,expected", CASES, ids=[c[2][:40] for c in CASES])
def test_error_names_file_line_field(tmp_path, old, new, expected):
    assert old in BASE
    path = tmp_path / "runbook.yaml"
    path.write_text(BASE.replace(old, new, 1))
    with pytest.raises(InputError) as caught:
        load_runbook(path)
    message = str(caught.value)
    assert message.startswith(str(path) + ":"), message
    assert caught.value.exit_code == 2
    import re

    assert re.search(expected, message), message


@pytest.mark.parametrize("text, expected", [
    ("hosts:\n  - name: esx-01\n   bad: [\n", r"bad\.yaml:\d+: YAML syntax error"),
    ("- a\n- b\n", r"bad\.yaml:1: \(top level\): a runbook is a mapping"),
])
def test_unreadable_yaml_names_the_line(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=expected):
        load_runbook(path)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"nope\.yaml: cannot read runbook"):
        load_runbook(tmp_path / "nope.yaml")


def test_all_errors_are_listed(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(BASE.replace("count: 2", "count: 0").replace("[{model: A100}]", "[{id: x}]"))
    with pytest.raises(InputError) as caught:
        load_runbook(path)
    assert len(str(caught.value).splitlines()) == 2


def test_valid_runbook_loads_with_defaults(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(BASE)
    book = load_runbook(path)
    assert book.vms[0].firmware == "efi" and book.vms[0].power == "on" and book.vms[0].mmio == "auto"
    assert len(book.digest) == 64
    assert textwrap  # keep import used


@pytest.mark.parametrize("driver, expected", [
    ('{version: "535.183.01", sha256: nothex}', ["guests.driver.sha256: 'nothex' is not a sha256 digest"]),
    ('{version: "535.183.01", sha256: "' + "a" * 64 + '", kidn: vgpu}', ["guests.driver.kidn: unknown field"]),
    ("5", ["guests.driver: Input should be a valid dictionary", "guests.driver: Input should be a valid list"]),
])
def test_a_field_of_several_shapes_reports_the_problems_of_the_shape_written_only(tmp_path, driver, expected):
    path = tmp_path / "driver.yaml"
    path.write_text(BASE + f"guests:\n  driver: {driver}\n  hosts: []\n")
    with pytest.raises(InputError) as caught:
        load_runbook(path)
    lines = str(caught.value).splitlines()
    assert len(lines) == len(expected) and all(want in line for want, line in zip(expected, lines)), lines


@pytest.mark.parametrize("schema, hint", [("gpuvm.saved-plan/1", "a saved plan: gpuvm show it, gpuvm apply it"),
                                          ("gpuvm.plan/1", "not a runbook")])
def test_a_gpuvm_document_given_as_a_runbook_says_what_it_is(tmp_path, schema, hint):
    path = tmp_path / "lab.plan"
    path.write_text(f'{{"schema": "{schema}", "changes": []}}\n')
    with pytest.raises(InputError, match=rf"^{path}:1: a {schema} document, not a runbook.*") as caught:
        load_runbook(path)
    assert hint in str(caught.value) and "unknown field" not in str(caught.value)
