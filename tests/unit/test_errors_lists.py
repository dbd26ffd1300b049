"""Messages that list hosts, VMs or failed targets stay short whatever their number (issue 11, item 6):
`errors.listed` names five and counts the rest, `TargetFailures` names MAX_LINES targets and counts
the rest, and the real messages built on them stay under 2,000 characters with 10,000 names."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.errors import MAX_LINES, SHOWN, ConnectError, RemoteCommandError, TargetFailures, TaskError, listed
from gpuvm.vsphere.facts import HostFacts, Inventory

SHORT = 2000


@pytest.mark.parametrize(("count", "expected"), [
    (0, ""),
    (1, "h0"),
    (5, "h0, h1, h2, h3, h4"),
    (6, "h0, h1, h2, h3, h4, … (1 more)"),
    (7, "h0, h1, h2, h3, h4, … (2 more)"),
    (1000, "h0, h1, h2, h3, h4, … (995 more)"),
    (10_000, "h0, h1, h2, h3, h4, … (9,995 more)"),
])
def test_listed_names_five_and_counts_the_rest(count, expected):
    assert SHOWN == 5
    assert listed(f"h{i}" for i in range(count)) == expected


@pytest.mark.parametrize("limit", [1, 3, 20])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 19, 20, 21, 10_000])
def test_listed_shown_plus_counted_is_every_name(count, limit):
    names = [f"esx-{i:05d}" for i in range(count)]
    text = listed(names, limit=limit)
    shown = re.findall(r"esx-\d{5}", text)
    more = re.search(r", … \(([\d,]+) more\)$", text)
    assert shown == names[:limit]  # the first ones, in order
    assert (int(more.group(1).replace(",", "")) if more else 0) == count - len(shown)
    assert (more is None) == (count <= limit)  # a count only when something is left out
    assert len(text) < 20 * limit + 40


def test_listed_takes_any_iterable_once():
    assert listed(iter(range(8)), limit=3) == "0, 1, 2, … (5 more)"
    assert listed({"b": 1, "a": 2}) == "b, a"


def _failures(count: int, error=TaskError) -> dict[str, Exception]:
    return {f"host-{i:05d}": error(f"reconfigure of host-{i:05d} failed") for i in range(count)}


@pytest.mark.parametrize("count", [1, MAX_LINES - 1, MAX_LINES, MAX_LINES + 1, 10_000])
def test_target_failures_names_max_lines_and_counts_the_rest(count):
    failures = _failures(count)
    error = TargetFailures(failures)
    lines = str(error).splitlines()
    assert lines[0] == f"{count:,} target(s) failed:"
    named = [line for line in lines[1:] if line.startswith("  host-")]
    assert named == [f"  {t}: {e}" for t, e in list(failures.items())[:MAX_LINES]]
    rest = [line for line in lines[1:] if not line.startswith("  host-")]
    if count > MAX_LINES:
        assert rest == [f"  … and {count - MAX_LINES:,} more (the journal has every one)"]
    else:
        assert rest == []
    assert len(lines) <= MAX_LINES + 2
    assert error.failures is failures and error.exit_code == TaskError.exit_code


def test_ten_thousand_failed_targets_make_a_short_message():
    error = TargetFailures(_failures(10_000), results={"host-ok": "done"})
    message = str(error)
    assert len(message) < SHORT, len(message)
    assert "… and 9,980 more (the journal has every one)" in message
    assert "host-00019:" in message and "host-00020:" not in message
    assert error.results == {"host-ok": "done"}


def test_target_failures_exit_code_is_the_common_one_else_1():
    assert TargetFailures(_failures(3, ConnectError)).exit_code == 3
    mixed = {**_failures(2, TaskError), "guest-1": RemoteCommandError("x"), "other": ValueError("y")}
    assert TargetFailures(mixed).exit_code == 1


def test_targets_not_observed_are_counted_as_not_observed_not_as_failed():
    """Apply's verdict after "0 target(s) failed, ..., 4 not observed" says so too (not "4 target(s) failed")."""
    from gpuvm.engine import Outcome
    from gpuvm.plan import Plan
    from gpuvm.runs import Applied

    down = {f"gpu-vm-0{i}": "cannot connect" for i in range(1, 5)}
    with pytest.raises(TargetFailures) as only_down:
        Applied(Plan(unobserved=down), Outcome()).raise_for_outcome()
    assert str(only_down.value).splitlines()[:2] == ["4 target(s) not observed:", "  gpu-vm-01 (not observed): cannot connect"]
    assert (only_down.value.exit_code, only_down.value.code) == (3, "not-observed")
    with pytest.raises(TargetFailures) as both:
        Applied(Plan(unobserved=down), Outcome(failed={"esx-01 (host.reboot)": TaskError("refused")})).raise_for_outcome()
    assert str(both.value).splitlines()[:2] == ["1 target(s) failed, 4 not observed:", "  esx-01 (host.reboot): refused"]
    assert (both.value.exit_code, both.value.code) == (1, "targets-failed")


RUNBOOK = """\
vcenter:
  user: administrator@vsphere.local
  password_env: GPUVM_VCENTER_PASSWORD
hosts:
  - name: esx-missing
    graphics: shared_direct
"""


def test_plan_naming_an_unknown_host_among_10000_lists_five(tmp_path, monkeypatch):
    """resolve's "host … not found in vCenter (found: …)", through `plan --snapshot`."""
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "secret-long-enough")
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
    snapshot = tmp_path / "big.json"
    Inventory(hosts={f"esx-{i:05d}": HostFacts(name=f"esx-{i:05d}", moid=f"host-{i}")
                     for i in range(10_000)}).save(snapshot)
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(RUNBOOK)
    result = CliRunner().invoke(app, ["plan", str(runbook), "--snapshot", str(snapshot)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output[:SHORT]
    assert len(result.output) < SHORT, result.output[:SHORT]
    assert "host 'esx-missing' not found in vCenter (found: esx-00000, esx-00001, esx-00002, esx-00003, " \
           "esx-00004, … (9,995 more))" in output, output
    assert "esx-00005" not in output


def test_validate_guest_of_an_unknown_vm_among_10000_lists_five(tmp_path, monkeypatch):
    """The runbook model's "VM … is not in vms (declared: …)", through `validate`."""
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "secret-long-enough")
    vms = "".join(f"  - {{name: vm-{i:05d}, host: esx-01}}\n" for i in range(10_000))
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(RUNBOOK.replace("esx-missing", "esx-01") + "vms:\n" + vms + "guests:\n  hosts:\n"
                       "    - {vm: vm-missing, ssh: {address: 10.0.0.11, user: ubuntu, key_file: /dev/null}}\n")
    result = CliRunner().invoke(app, ["validate", str(runbook)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output[:SHORT]
    assert len(result.output) < SHORT, result.output[:SHORT]
    assert "VM 'vm-missing' is not in vms (declared: vm-00000, vm-00001, vm-00002, vm-00003, vm-00004, " \
           "… (9,995 more))" in output, output
