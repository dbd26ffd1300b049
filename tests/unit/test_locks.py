"""`gpuvm locks` (issue 34): the rows read from the root folder's leases and locks and the objects'
intents (states, foreign values, only the runbook's hosts), their table and JSON, and the refusal of
a run that holds nothing; a break removes that run's lease and locks by key, never another's."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.documents import schema
from gpuvm.errors import InputError
from gpuvm.vsphere import lock_report, records
from gpuvm.vsphere.facts import HostFacts, Inventory, VmFacts
from gpuvm.vsphere.intent import Intent
from gpuvm.vsphere.lock import Seen
from gpuvm.vsphere.lock_report import Objects
from gpuvm.vsphere.records import Holder, Lease
from tests.schema_check import check

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
LIVE, DEAD, TAKER, UNWRITTEN = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "eeeeeeeeeeee"
RUNBOOK = """\
vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}
hosts: [{name: esx-01}, {name: esx-02}, {name: esx-03}, {name: esx-04}, {name: esx-05}]
vms: [{name: vm1, host: esx-01}]
"""


def stamp(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).isoformat()


def lease(run: str, expires_in: float, taking: bool = False) -> str:
    return records.encode(Lease(run=run, who=f"op@{run[:1]} pid 1", since=stamp(-60), expires=stamp(expires_in),
                                taking=taking, hosts=1))


def holder(run: str) -> str:
    return records.encode(Holder(run=run, who=f"op@{run[:1]} pid 1", since=stamp(-60)))


def seen(taking: bool = False) -> Seen:
    """A live run on esx-01, a dead one on esx-02, a lock being taken on esx-03, a foreign lock on
    esx-04, a foreign lease, a lease its run never wrote, and a lock of a host the runbook does not name."""
    values = {1: lease(LIVE, 300), 2: holder(LIVE), 3: lease(DEAD, -1), 4: holder(DEAD), 5: "", 6: "{not json",
              7: "hello", 8: holder(LIVE)}
    if taking:
        values[9] = lease(TAKER, 300, taking=True)
    fields = {f"gpuvm.lease.{LIVE}": 1, "gpuvm.lock.esx-01": 2, f"gpuvm.lease.{DEAD}": 3, "gpuvm.lock.esx-02": 4,
              "gpuvm.lock.esx-03": 5, "gpuvm.lock.esx-04": 6, f"gpuvm.lease.{'d' * 12}": 7, "gpuvm.lock.other": 8,
              f"gpuvm.lease.{UNWRITTEN}": 10,
              **({f"gpuvm.lease.{TAKER}": 9} if taking else {})}
    return Seen(NOW, fields, values)


HOSTS = {"esx-01", "esx-02", "esx-03", "esx-04", "esx-05"}


def by_object(rows):
    return {(row.kind, row.object): row for row in rows}


def test_leases_and_the_runbooks_host_locks_with_their_state():
    rows = by_object(lock_report.root_rows("default", seen(), HOSTS))
    assert rows[("lease", LIVE)].state == "live" and rows[("lease", LIVE)].expires == stamp(300)
    assert rows[("lease", DEAD)].state == "expired"
    assert (rows[("lock", "esx-01")].run, rows[("lock", "esx-01")].state) == (LIVE, "live")
    assert rows[("lock", "esx-01")].expires == stamp(300)  # its run's lease's
    assert (rows[("lock", "esx-02")].run, rows[("lock", "esx-02")].state) == (DEAD, "expired")
    assert rows[("lock", "esx-03")].state == "stale"  # no run is taking locks: its taker was killed
    assert "gpuvm.lock.esx-04" in rows[("foreign", "esx-04")].why and "did not write" in rows[("foreign", "esx-04")].why
    assert rows[("foreign", "d" * 12)].act == f"gpuvm.lease.{'d' * 12}"
    assert rows[("lease", UNWRITTEN)].state == "stale" and "holds nothing" in rows[("lease", UNWRITTEN)].why
    assert ("lock", "other") not in rows  # not the runbook's host


def test_a_lock_with_no_holder_while_a_run_takes_its_locks_is_being_taken():
    rows = by_object(lock_report.root_rows("default", seen(taking=True), HOSTS))
    assert rows[("lock", "esx-03")].state == "being taken"
    assert rows[("lease", TAKER)].state == "being taken"


def test_intents_on_the_runbooks_hosts_their_vms_and_templates_only():
    def intent(run):
        return Intent(run=run, why="reboot", since=stamp(-30), data={})

    inventory = Inventory(hosts={"esx-01": HostFacts(name="esx-01", moid="host-1", intents={"maintenance": intent(LIVE)}),
                                 "esx-09": HostFacts(name="esx-09", moid="host-9", intents={"maintenance": intent(DEAD)})},
                          vms={"vm1": VmFacts(name="vm1", moid="vm-1", host="esx-01", intents={"power-off": intent(DEAD)}),
                               "vm2": VmFacts(name="vm2", moid="vm-2", host="esx-01"),
                               "vm9": VmFacts(name="vm9", moid="vm-9", host="esx-09", intents={"power-off": intent(DEAD)})},
                          templates={"tpl": VmFacts(name="tpl", moid="vm-3", intents={"clone vm3": intent(LIVE)})})
    rows = lock_report.object_rows("default", inventory, Objects({"esx-01"}, set(), {"tpl"}), seen())
    assert {(row.object, row.act, row.run, row.state) for row in rows} == {
        ("esx-01", "maintenance", LIVE, "under way"), ("vm1", "power-off", DEAD, "waiting for the next apply"),
        ("tpl", "clone vm3", LIVE, "under way")}


def test_a_hosts_reboot_memo_is_a_memo_not_an_act_waiting_for_the_next_apply():
    memo = Intent(run=DEAD, why="rebooted for 1 change(s): passthrough on esx-01", since=stamp(-30),
                  data={"changes": [], "boot_time": stamp(-20)})
    inventory = Inventory(hosts={"esx-01": HostFacts(name="esx-01", moid="host-1", intents={"rebooted": memo})})
    [row] = lock_report.object_rows("default", inventory, Objects({"esx-01"}, set(), set()), seen())
    assert (row.kind, row.act, row.state) == ("intent", "rebooted", "memo")
    assert check({"schema": "gpuvm.locks/1", "rows": [row.to_dict()], "not_reached": {}}) == "locks"


def test_a_run_is_broken_by_its_lease_and_the_locks_naming_it_only():
    assert lock_report.held_by(LIVE, seen()) == {f"lease gpuvm.lease.{LIVE}": 1, "the lock of host esx-01": 2,
                                                 "the lock of host other": 8}
    assert lock_report.held_by(UNWRITTEN, seen()) == {f"lease gpuvm.lease.{UNWRITTEN}": 10}  # by its name


def test_a_run_holding_nothing_is_refused_naming_the_runs_that_hold():
    with pytest.raises(InputError) as refused:
        lock_report.check_run("0123456789ab", {"default": seen()})
    assert refused.value.exit_code == 2
    assert LIVE in str(refused.value) and DEAD in str(refused.value)
    lock_report.check_run(DEAD, {"default": seen()})  # a dead run's lease and locks can be broken too


@pytest.fixture
def command(tmp_path, mocker):
    """`gpuvm locks` over a vCenter holding `seen()`, its inventory with no intents; the calls that remove."""
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)

    @contextmanager
    def connected(book, access):
        yield {"default": object()}, {}

    mocker.patch("gpuvm.connecting.connect_all", connected)
    mocker.patch("gpuvm.vsphere.lock_report.read_all", return_value=({"default": Inventory()}, {}))
    mocker.patch("gpuvm.vsphere.lock.look", return_value=seen())
    removed = mocker.patch("gpuvm.vsphere.lock.remove")

    def run(*args):
        return CliRunner().invoke(app, ["locks", str(path), "--state-dir", str(tmp_path / "state"), *args])
    return run, removed


def test_the_table_and_the_json_list_every_row(command):
    run, removed = command
    shown = run("--json")
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.stdout)
    assert check(document) == "locks"
    assert {(row["kind"], row["object"], row["state"]) for row in document["rows"]} >= {
        ("lease", LIVE, "live"), ("lock", "esx-01", "live"), ("lock", "esx-02", "expired")}
    table = run()
    assert table.exit_code == 0, table.output
    line = next(line for line in table.stdout.splitlines() if "esx-02" in line)
    assert "lock" in line and DEAD in line and "expired" in line
    assert "vcenter" not in table.stdout  # one vCenter: no column for it
    removed.assert_not_called()


def test_an_unknown_run_is_refused_and_nothing_removed(command):
    run, removed = command
    refused = run("--break", "0123456789ab", "--yes")
    assert refused.exit_code == 2 and LIVE in refused.output, refused.output
    removed.assert_not_called()


def test_a_break_without_yes_and_no_terminal_is_refused_with_a_hint(command):
    run, removed = command
    refused = run("--break", LIVE)
    assert refused.exit_code == 2 and "--yes" in refused.output, refused.output
    removed.assert_not_called()


def test_a_break_removes_by_key_says_intents_stay_and_journals_who(command, tmp_path):
    run, removed = command
    broken = run("--break", LIVE, "--yes")
    assert broken.exit_code == 0, broken.output
    assert [call.args[1] for call in removed.call_args_list] == [1, 2, 8]  # the lease first: the fence
    assert "intents stay" in broken.output
    entry = json.loads((tmp_path / "state" / "journal.jsonl").read_text().splitlines()[-1])
    assert entry["status"] == "locks-broken" and entry["broken_run"] == LIVE and "pid" in entry["who"]


def test_a_break_with_json_prints_one_document_of_what_was_broken(command):
    run, removed = command
    broken = run("--break", LIVE, "--yes", "--json")
    assert broken.exit_code == 0, broken.output
    document = json.loads(broken.stdout)  # the whole of stdout: one document, no text
    assert check(document) == "locks"
    assert document["broken"]["run"] == LIVE
    assert document["broken"]["removed"] == {"default": [f"lease gpuvm.lease.{LIVE}", "the lock of host esx-01",
                                                         "the lock of host other"]}
    assert len(removed.call_args_list) == 3
    assert (("lease", LIVE) in {(row["kind"], row["object"]) for row in document["rows"]})  # as read before


def test_the_schema_names_every_kind_of_row():
    kinds = schema("locks")["properties"]["rows"]["items"]["properties"]["kind"]["enum"]
    assert sorted(kinds) == sorted(lock_report.KINDS)


def test_a_vcenter_not_reached_is_warned_of_and_exits_3_after_the_others_rows(command, mocker):
    from gpuvm.errors import ConnectError

    run, _ = command

    @contextmanager
    def one_down(book, access):
        yield {"default": object()}, {"west": ConnectError("connection refused")}

    mocker.patch("gpuvm.connecting.connect_all", one_down)
    shown = run()
    assert shown.exit_code == 3, shown.output
    assert "vCenter west not reached" in shown.output and "connection refused" in shown.output
    assert LIVE in shown.stdout  # the vCenter reached is listed
