"""A guest whose SSH host key is unknown, changed or revoked is an error at plan time (issue 11,
item 11), never a guest "not reachable yet"; but it is that guest's error only, not the end of the
plan of the others (issue 22, item 8)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuvm import engine
from gpuvm.errors import ConnectError, HostKeyError, InputError, TargetFailures
from gpuvm.executors.group import GroupResult


def cluster():
    return SimpleNamespace(targets={"gpu-vm-01": SimpleNamespace(role="guest"), "gpu-vm-02": SimpleNamespace(role="guest")})


def test_a_guest_that_does_not_answer_is_set_aside(mocker):
    mocker.patch.object(engine, "observe_remote", return_value=GroupResult(
        {"gpu-vm-01": {"guest.nic": "fact"}},
        {"gpu-vm-02": ConnectError("gpu-vm-02: cannot connect to 10.0.0.2:22: Connection refused")}))
    facts, down = engine.observe_reachable(cluster())
    assert facts == {("guest.nic", "gpu-vm-01"): "fact"} and list(down) == ["gpu-vm-02"]


def test_a_guest_whose_host_key_changed_is_not_observed_and_never_trusted(mocker):
    """A changed key stays an error for that guest (its own error, code 3), not "not up yet"; the
    other guests are observed."""
    changed = HostKeyError("gpu-vm-02: host key for 10.0.0.2:22 has CHANGED: the server offers ssh-ed25519 "
                           "SHA256:new but the known key is ssh-ed25519 SHA256:old")
    mocker.patch.object(engine, "observe_remote", return_value=GroupResult(
        ok={"gpu-vm-01": {"guest.nic": "fact"}}, failed={"gpu-vm-02": changed}))
    facts, down = engine.observe_reachable(cluster())
    assert facts == {("guest.nic", "gpu-vm-01"): "fact"} and down == {"gpu-vm-02": changed}
    assert isinstance(changed, ConnectError) and changed.exit_code == 3


def test_an_error_no_guest_causes_still_stops_the_plan(mocker):
    """A runbook error (or a bug) is not one guest's doing: it is not set aside."""
    wrong = InputError("rb.yaml:3: guests.hosts[1]: wrong")
    mocker.patch.object(engine, "observe_remote", return_value=GroupResult(failed={"gpu-vm-02": wrong}))
    with pytest.raises(TargetFailures) as e:
        engine.observe_reachable(cluster())
    assert e.value.failures == {"gpu-vm-02": wrong} and e.value.exit_code == 2
