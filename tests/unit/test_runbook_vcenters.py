"""Several vCenters in one runbook (`vcenters:`): names, references, and each error at file:line: field."""

from __future__ import annotations

import re

import pytest

from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook

TWO = """\
vcenters:
  - {name: east, url: https://vc-east.example.com/sdk, password_env: EAST_PASSWORD}
  - {name: west, url: https://vc-west.example.com/sdk, password_env: WEST_PASSWORD}
hosts:
  - {name: esx-e1, vcenter: east}
  - {name: esx-w1, vcenter: west}
vms:
  - {name: vm-e1, host: esx-e1}
  - {name: vm-w1, host: esx-w1, vcenter: west}
guests:
  hosts:
    - {vm: vm-e1, ssh: {address: 10.0.0.1}}
    - {vm: vm-w1, ssh: {address: 10.0.0.2}}
"""


def _load(tmp_path, text):
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_runbook(path)


def test_each_host_vm_and_guest_belongs_to_its_vcenter(tmp_path):
    book = _load(tmp_path, TWO)
    assert list(book.all_vcenters) == ["east", "west"]
    assert [book.vcenter_of(n) for n in ("esx-e1", "vm-e1", "esx-w1", "vm-w1")] == ["east", "east", "west", "west"]
    west = book.part("west")
    assert [h.name for h in west.hosts] == ["esx-w1"] and [v.name for v in west.vms] == ["vm-w1"]
    assert [g.vm for g in west.guests.hosts] == ["vm-w1"]
    assert west.where(("vcenters", 1, "url")).startswith(f"{tmp_path / 'fleet.yaml'}:3:")  # errors still point into the file


def test_one_vcenter_is_the_short_form_named_default(tmp_path):
    book = _load(tmp_path, "vcenter: {url: https://vc.example.com/sdk}\nhosts:\n  - {name: esx-01, vcenter: default}\n")
    assert list(book.all_vcenters) == ["default"] and book.vcenter_of("esx-01") == "default"


CASES = [
    ("{name: esx-w1, vcenter: west}", "{name: esx-w1, vcenter: north}",
     r":6: hosts\[1\]\.vcenter: vCenter 'north' is not in vcenters \(declared: east, west\)"),
    ("{name: esx-w1, vcenter: west}", "{name: esx-w1}", r":6: hosts\[1\]\.vcenter: host 'esx-w1' names no vCenter \(one of: east, west\)"),
    ("host: esx-w1, vcenter: west}", "host: esx-w1, vcenter: east}",
     r":9: vms\[1\]\.vcenter: VM 'vm-w1' is in vCenter 'east' but its host 'esx-w1' is in 'west'"),
    ("host: esx-w1, vcenter: west}", "host: esx-w1, vcenter: south}", r":9: vms\[1\]\.vcenter: vCenter 'south' is not in vcenters"),
    ("  - {name: west,", "  - {name: east,", r":3: vcenters\[1\]\.name: vCenter 'east' is declared twice \(also vcenters\[0\]\)"),
    ("vcenters:\n", "vcenter: {url: https://vc.example.com/sdk}\nvcenters:\n", r":1: vcenter: give vcenter \(one\) or vcenters"),
    ("{name: esx-w1, vcenter: west}", "{name: esx-e1, vcenter: east}",
     r":6: hosts\[1\]\.name: host 'esx-e1' is declared twice in vCenter 'east' \(also hosts\[0\]\)"),
    ("  - {name: west,", "  - {name: 'we st',", r":3: vcenters\[1\]\.name: 'we st' is not a valid name"),
    ("  - {name: west, ", "  - {", r":3: vcenters\[1\]\.name: required field is missing"),
    ("https://vc-west.example.com/sdk", "'https://VC-East.example.com:443/SDK/'",
     r":3: vcenters\[1\]\.url: vCenter 'west' is vCenter 'east' again \(vcenters\[0\]: https://vc-east\.example\.com:443/sdk\)"),
    ("https://vc-west.example.com/sdk", "vc-east.example.com",
     r":3: vcenters\[1\]\.url: vCenter 'west' is vCenter 'east' again \(vcenters\[0\]: https://vc-east\.example\.com:443/sdk\)"),
]


@pytest.mark.parametrize("old,new,expected", CASES, ids=[c[2][:50] for c in CASES])
def test_a_wrong_vcenter_reference_names_file_line_field(tmp_path, old, new, expected):
    assert old in TWO
    with pytest.raises(InputError) as caught:
        _load(tmp_path, TWO.replace(old, new, 1))
    assert caught.value.exit_code == 2
    assert re.search(expected, str(caught.value)), str(caught.value)


def test_two_vcenters_without_a_url_are_refused_as_govc_urls_one_vcenter_twice(tmp_path):
    text = TWO.replace("url: https://vc-east.example.com/sdk, ", "").replace("url: https://vc-west.example.com/sdk, ", "")
    with pytest.raises(InputError, match=r":3: vcenters\[1\]\.url: vCenter 'west' is vCenter 'east' again "
                                         r"\(vcenters\[0\]: GOVC_URL\)"):
        _load(tmp_path, text)


@pytest.mark.parametrize("url", ["vc1", "https://VC1:443/sdk", "https://user:pw@vc1/SDK/", "Vc1:443"])
def test_one_vcenter_address_however_its_url_is_written(url):
    from gpuvm.runbook.vcenters import vcenter_address

    assert vcenter_address(url) == "https://vc1:443/sdk"
    assert vcenter_address("https://[FE80::1]/sdk") == vcenter_address("[fe80::1]:443") == "https://[fe80::1]:443/sdk"


def test_another_port_or_path_is_another_vcenter(tmp_path):
    for url in ("https://vc-east.example.com:8443/sdk", "https://vc-east.example.com/other"):
        assert list(_load(tmp_path, TWO.replace("https://vc-west.example.com/sdk", url)).all_vcenters) == ["east", "west"]


def test_a_named_vcenter_in_a_one_vcenter_runbook_is_refused(tmp_path):
    with pytest.raises(InputError, match=r":3: hosts\[0\]\.vcenter: vCenter 'east' is not declared"):
        _load(tmp_path, "vcenter: {url: https://vc.example.com/sdk}\nhosts:\n  - {name: esx-01, vcenter: east}\n")


def test_a_vcenters_missing_password_is_named_at_its_own_entry_before_any_login(tmp_path, monkeypatch, mocker):
    from gpuvm import connecting, runs

    for key in ("GOVC_URL", "GOVC_USERNAME", "GOVC_PASSWORD", "GOVC_TLS_CA_CERTS", "GOVC_INSECURE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("EAST_PASSWORD", "east-secret")
    monkeypatch.delenv("WEST_PASSWORD", raising=False)
    book = _load(tmp_path, TWO.replace("password_env: EAST_PASSWORD}", "password_env: EAST_PASSWORD, user: u}")
                 .replace("password_env: WEST_PASSWORD}", "password_env: WEST_PASSWORD, user: u}"))
    session = mocker.patch.object(connecting, "Session")
    with pytest.raises(InputError, match=r"fleet\.yaml:3: vcenters\[1\]\.password_env: .*WEST_PASSWORD"):
        with runs.connect_all(book, runs.Access()):
            pass
    session.assert_not_called()  # settings are checked for every vCenter before anyone is contacted


def test_validate_leaves_govc_url_alone_when_every_vcenter_names_its_url(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gpuvm.cli.main import app

    monkeypatch.setenv("GOVC_URL", "ftp://nowhere")
    path = tmp_path / "fleet.yaml"
    path.write_text(TWO)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0 and "valid (2 host(s), 2 VM(s))" in result.output, result.output


def _logged_in(tmp_path, monkeypatch, mocker, uuids):
    """connect_all over TWO with each vCenter's session answering its instance UUID (`uuids`, by host)."""
    from gpuvm import connecting, runs

    monkeypatch.setenv("EAST_PASSWORD", "east-secret")
    monkeypatch.setenv("WEST_PASSWORD", "west-secret")
    book = _load(tmp_path, TWO.replace("password_env: EAST_PASSWORD}", "password_env: EAST_PASSWORD, user: u}")
                 .replace("password_env: WEST_PASSWORD}", "password_env: WEST_PASSWORD, user: u}"))
    logged_out = []

    def session(target):
        made = mocker.MagicMock()
        made.__enter__.return_value.content.about.instanceUuid = uuids[target.host]
        made.__exit__.side_effect = lambda *exc: logged_out.append(target.host)
        return made

    mocker.patch.object(connecting, "Session", side_effect=session)
    return runs.connect_all(book, runs.Access()), logged_out


def test_two_entries_reaching_one_vcenter_are_refused_on_connect_naming_both(tmp_path, monkeypatch, mocker):
    """Two names (and URLs) for one vCenter: its instance UUID is seen twice, right after logging in;
    refused there (exit 2), before the caller can lock or write anything, every session logged out."""
    connecting, logged_out = _logged_in(tmp_path, monkeypatch, mocker,
                                        {"vc-east.example.com": "uuid-1", "vc-west.example.com": "uuid-1"})
    with pytest.raises(InputError) as caught:
        with connecting:
            pytest.fail("the run went on with one vCenter logged in to twice")
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert re.search(r"fleet\.yaml:3: vcenters\[1\]: vCenter 'west' \(https://vc-west\.example\.com:443/sdk\) is "
                     r"vCenter 'east' \(\S*fleet\.yaml:2: vcenters\[0\], https://vc-east\.example\.com:443/sdk\) again: "
                     r"the same instance \(uuid-1\)", message), message
    assert sorted(logged_out) == ["vc-east.example.com", "vc-west.example.com"]


def test_two_vcenters_with_their_own_instances_connect(tmp_path, monkeypatch, mocker):
    connecting, _ = _logged_in(tmp_path, monkeypatch, mocker,
                               {"vc-east.example.com": "uuid-1", "vc-west.example.com": "uuid-2"})
    with connecting as (sessions, down):
        assert sorted(sessions) == ["east", "west"] and not down
