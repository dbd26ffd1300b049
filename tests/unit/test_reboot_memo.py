"""The reboot memo (steps/reboot_memo.py) as data: which planned reboots repeat one that did not
activate its changes, what plan and apply say, when the memo is recorded and cleared."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuvm.plan import Change, Disruption
from gpuvm.steps import reboot_memo
from gpuvm.steps.base import Context
from gpuvm.vsphere.facts import HostFacts, Inventory, VmFacts
from gpuvm.vsphere.intent import Intent

BOOTED = "2026-11-25T16:50:17+00:00"
CARD = "ConnectX ca:00.0 (/dev/mst/mt4123_pciconf0)"
SET_ATS = Change("guest.nic_ats", "esx-01-vm1", CARD, "ATS_ENABLED", False, True, Disruption.HOST_REBOOT, object())
ATS_PENDING = Change("guest.nic_ats", "esx-01-vm1", CARD, "ATS_ENABLED (current)", False, True, Disruption.HOST_REBOOT)
MIG_PENDING = Change("esxi.mig", "esx-01", "GPU 0", "mig.mode", "Disabled (pending Enabled)", "Enabled (after reboot)",
                     Disruption.HOST_REBOOT)
REBOOT = Change("host.reboot", "esx-01", "host", "reboot", "1 change(s) waiting", "rebooted (maintenance mode)",
                Disruption.HOST_REBOOT, object())


def inventory(memo: list[Change] | None, booted: str = BOOTED, memo_booted: str = BOOTED) -> Inventory:
    intents = {} if memo is None else {reboot_memo.ACT: Intent(run="abc", since="T", data={
        "booted": memo_booted, "changes": [reboot_memo.identity(c) for c in memo]})}
    return Inventory(hosts={"esx-01": HostFacts(name="esx-01", moid="host-1", booted=booted, intents=intents)},
                     vms={"esx-01-vm1": VmFacts(name="esx-01-vm1", moid="vm-1", host="esx-01")})


@pytest.mark.parametrize("memo, planned, repeated", [
    ([ATS_PENDING], [ATS_PENDING], [ATS_PENDING]),  # the tenant's card: the same pending change
    ([SET_ATS], [ATS_PENDING], [ATS_PENDING]),  # set before the reboot, its running half still not there
    ([replace(MIG_PENDING, before="Disabled", after="Enabled")], [MIG_PENDING], [MIG_PENDING]),  # same field
    ([ATS_PENDING], [MIG_PENDING], []),  # another setting: gpuvm never rebooted for it
    ([ATS_PENDING], [SET_ATS], []),  # to be set now (the runbook changed): a reboot may activate it
    (None, [ATS_PENDING], []),  # never rebooted by gpuvm
])
def test_a_pending_change_gpuvm_rebooted_for_is_a_repeat(memo, planned, repeated):
    found = reboot_memo.repeats([*planned, REBOOT], inventory(memo))
    assert [c for r in found for c in r.changes] == repeated


def test_a_host_rebooted_since_or_not_rebooted_now_is_no_repeat():
    assert reboot_memo.repeats([ATS_PENDING, REBOOT], inventory([ATS_PENDING], memo_booted="earlier")) == []
    assert reboot_memo.repeats([ATS_PENDING], inventory([ATS_PENDING])) == []  # no reboot planned (e.g. --target)


def test_plan_notes_it_and_apply_refuses_with_exit_4_naming_setting_host_and_flag():
    found = reboot_memo.repeats([ATS_PENDING, REBOOT], inventory([ATS_PENDING]))
    [note] = reboot_memo.notes(found)
    assert (note.level, note.target, note.step) == ("error", "esx-01", "host.reboot")
    with pytest.raises(reboot_memo.RepeatedReboot) as refused:
        reboot_memo.refuse(found, allow=False)
    assert refused.value.exit_code == 4
    text = str(refused.value)
    for words in ("host esx-01", "ATS_ENABLED (current)", "esx-01-vm1", "guest.nic_ats", "run abc at T",
                  "--allow-repeat-reboot", "nothing was changed"):
        assert words in text, text
    reboot_memo.refuse(found, allow=True)  # the flag: rebooted again


def test_the_memo_records_what_waited_and_the_new_boot_time(mocker):
    facts = inventory(None)
    store = mocker.MagicMock()
    session = mocker.MagicMock()
    session.ref.return_value.runtime.bootTime.isoformat.return_value = BOOTED
    ctx = Context(session=session, inventory=facts, planned=[SET_ATS, MIG_PENDING, REBOOT], intents=store)
    reboot_memo.remember(ctx, "esx-01")
    store.record.assert_called_once_with(
        session.ref.return_value, "rebooted", "rebooted for 2 change(s): mig.mode of GPU 0 on esx-01; ATS_ENABLED of ConnectX ca:00.0 on esx-01-vm1",
        booted=BOOTED, changes=[reboot_memo.identity(MIG_PENDING), reboot_memo.identity(SET_ATS)])  # the host's first


def test_the_memo_names_each_device_once_grouped_by_setting_and_target(mocker):
    """Two GPUs set to passthrough and a MIG mode on the host, a card's ATS in a guest: one reboot for all,
    the memo (shown by `gpuvm locks`) naming the devices, each setting and target once."""
    from gpuvm.steps.host_passthrough import resource

    gpus = [Change("host.passthrough", "esx-01", resource(address, "GH100 [H100 SXM5 80GB]"), "passthrough", "off",
                   "enabled", Disruption.HOST_REBOOT, object()) for address in ("0000:3b:00.0", "0000:5e:00.0")]
    store, session = mocker.MagicMock(), mocker.MagicMock()
    session.ref.return_value.runtime.bootTime.isoformat.return_value = BOOTED
    ctx = Context(session=session, inventory=inventory(None), planned=[*gpus, MIG_PENDING, SET_ATS, REBOOT], intents=store)
    reboot_memo.remember(ctx, "esx-01")
    assert store.record.call_args.args[2] == (
        "rebooted for 4 change(s): passthrough of pci 0000:3b:00.0, pci 0000:5e:00.0 on esx-01; "
        "mig.mode of GPU 0 on esx-01; ATS_ENABLED of ConnectX ca:00.0 on esx-01-vm1")


def test_the_memo_is_cleared_once_nothing_waits_on_the_host(mocker):
    store, session = mocker.MagicMock(), mocker.MagicMock()
    reboot_memo.settle(store, session, [ATS_PENDING, REBOOT], inventory([ATS_PENDING]), ["esx-01"])
    store.clear.assert_not_called()  # still waiting: the memo stops the next reboot
    reboot_memo.settle(store, session, [], inventory([ATS_PENDING]), [])
    store.clear.assert_not_called()  # not planned whole (--target elsewhere)
    reboot_memo.settle(store, session, [], inventory([ATS_PENDING]), ["esx-01"])
    store.clear.assert_called_once_with(session.ref.return_value, "rebooted")
    session.ref.assert_called_with("HostSystem", "host-1")


def test_a_memo_of_many_changes_leaves_room_for_the_other_acts_on_the_host():
    from gpuvm.vsphere.intent import encode
    from gpuvm.vsphere.records import MAX_CHARS

    many = [Change("host.passthrough", "esx-01", f"pci 0000:{i:02x}:00.0 (GA100 [A100 PCIe 80GB])", "passthrough",
                   "enabled (reboot pending)", "active", Disruption.HOST_REBOOT) for i in range(500)]
    memo = Intent(run="3f2a9c1d0e4b", why="rebooted for 500 change(s): …", since=BOOTED,
                  data={"booted": BOOTED, "changes": [reboot_memo.identity(c) for c in many[:reboot_memo.MAX_REMEMBERED]]})
    assert len(encode({reboot_memo.ACT: memo})) < MAX_CHARS / 2
