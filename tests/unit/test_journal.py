"""The journal as an audit log that scales and never loses records (issue 21, item 6): it rotates,
a torn line never hides the next record, short writes are retried, the state directory holds
regular files only, readers are bounded, and a full disk stops the run with one line."""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import signal
from contextlib import contextmanager

import pytest

from gpuvm import engine, journal as journal_module, runs
from gpuvm.errors import InputError
from gpuvm.journal import Journal, JournalError, past_entries, read_entries
from gpuvm.plan import Change, Plan
from gpuvm.desired import Desired, DesiredHost
from gpuvm.steps.base import Context, Step
from tests.unit.test_runs import CHANGE, RUNBOOK, world  # noqa: F401  (the fixture)


@contextmanager
def no_hang(seconds: int = 5):
    """Fails the test instead of hanging it (a FIFO opened for writing blocks without a reader)."""
    def hung(*_):
        raise AssertionError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_torn_last_line_is_skipped_with_a_warning_and_never_hides_the_next_record(tmp_path, caplog):
    (tmp_path / "journal.jsonl").write_text(json.dumps({"status": "run-start"}) + '\n{"status": "do')  # killed mid-write
    Journal(tmp_path).record("run-end", failed=0)
    with caplog.at_level(logging.WARNING):
        entries = past_entries(tmp_path)
    assert [e["status"] for e in entries] == ["run-start", "run-end"]
    assert "journal.jsonl:2: skipped a line that is not a whole JSON record" in caplog.text


def test_short_writes_are_retried(tmp_path, mocker):
    real = os.write
    mocker.patch.object(journal_module.os, "write", side_effect=lambda fd, data: real(fd, bytes(data[:7])))
    j = Journal(tmp_path)
    j.record_all("started", [Change("vm.hardware", f"vm{i}", "vm", "cpus", 1, 2) for i in range(20)])
    assert [e["target"] for e in past_entries(tmp_path)] == [f"vm{i}" for i in range(20)]


def test_the_journal_rotates_and_keeps_a_few(tmp_path):
    j = Journal(tmp_path, max_bytes=2_000, keep=3)
    for i in range(100):
        j.record("run-start", changes=i)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["journal.jsonl", "journal.jsonl.1", "journal.jsonl.2", "journal.jsonl.3", "journal.lock"]
    assert all(p.stat().st_size < 2_000 + 200 for p in tmp_path.iterdir())
    kept = [e["changes"] for n in (3, 2, 1) for e in read_entries(tmp_path / f"journal.jsonl.{n}")]
    kept += [e["changes"] for e in past_entries(tmp_path)]
    assert kept == list(range(100 - len(kept), 100))  # the newest, in order, none lost between files


def test_a_symlinked_journal_is_refused_not_followed(tmp_path):
    elsewhere = tmp_path / "precious"
    elsewhere.write_text("keep me\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.jsonl").symlink_to(elsewhere)
    with pytest.raises(InputError, match=r"state/journal.jsonl: a symbolic link; the state directory holds regular"):
        Journal(state)
    with pytest.raises(InputError, match="a symbolic link"):
        past_entries(state)
    assert elsewhere.read_text() == "keep me\n"


def test_a_symlinked_lock_is_refused_not_followed(tmp_path):
    elsewhere = tmp_path / "precious"
    elsewhere.write_text("keep me\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.lock").symlink_to(elsewhere)
    with pytest.raises(InputError, match=r"state/journal.lock: a symbolic link; the state directory holds regular"):
        Journal(state).record("run-start")
    assert elsewhere.read_text() == "keep me\n"


def test_a_fifo_journal_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "journal.jsonl")
    with no_hang():
        with pytest.raises(InputError, match=r"journal.jsonl: not a regular file"):
            Journal(tmp_path)
        with pytest.raises(InputError, match=r"not a regular file"):
            past_entries(tmp_path)
    (tmp_path / "journal.jsonl").unlink()
    j = Journal(tmp_path)
    os.mkfifo(tmp_path / "journal.jsonl")  # swapped in during the run
    with no_hang(), pytest.raises(InputError, match=r"not a regular file"):
        j.record("run-start")


def test_readers_skip_deep_and_oversized_lines(tmp_path, caplog):
    path = tmp_path / "journal.jsonl"
    path.write_text("[" * 200_000 + "\n" + json.dumps({"status": "a"}) + "\n" + '"' + "x" * 5_000 + '"\n'
                    + json.dumps({"status": "b"}) + "\n")
    with caplog.at_level(logging.WARNING):
        assert [e["status"] for e in read_entries(path, max_line=4_096)] == ["a", "b"]
    assert "skipped a line longer than 4096 bytes" in caplog.text


def test_a_full_disk_stops_the_run_with_one_line_and_its_locks_released(world, mocker, tmp_path):  # noqa: F811
    released = []

    @contextmanager
    def locks(session, hosts, run, journal=None):
        try:
            yield mocker.Mock(name="HostLocks")  # its lease holds: check() returns
        finally:  # HostLocks.__exit__: the lock values removed
            released.append(sorted(hosts))

    mocker.patch.object(runs, "HostLocks", side_effect=locks)
    mocker.patch.object(runs, "make_plan", return_value=(Plan(changes=[CHANGE]), Desired()))
    mocker.patch.object(runs, "check_allowed")
    mocker.patch.object(journal_module.os, "write", side_effect=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    with pytest.raises(JournalError) as caught:
        runs.apply_runbook(RUNBOOK, runs.Access(state_dir=tmp_path))
    assert "\n" not in str(caught.value) and "No space left on device" in str(caught.value)
    assert str(tmp_path / "journal.jsonl") in str(caught.value)
    assert released == [["esx-01", "esx-02"]]


def test_a_journal_failing_mid_run_stops_it_before_the_next_act(tmp_path, mocker):
    """Quota reached while a step runs: the targets whose start was not recorded are not touched,
    and no later step runs."""
    applied = []
    first = Step("first", "host", lambda ctx, t: None, lambda t, f: [], lambda ctx, t, changes: applied.append(t.name))
    later = Step("later", "host", lambda ctx, t: None, lambda t, f: [], lambda ctx, t, changes: applied.append("later"))
    mocker.patch.object(engine, "_run_order", return_value=[first, later])
    desired = Desired(hosts={h: DesiredHost(h, [], None, False) for h in ("esx-01", "esx-02")})
    plan = Plan(changes=[Change(s, h, "x", "f", 1, 2) for s in ("first", "later") for h in desired.hosts])
    real, writes = os.write, []

    def write(fd, data):
        writes.append(data)
        if len(writes) > 1:  # run-start written, then the quota
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real(fd, data)

    mocker.patch.object(journal_module.os, "write", side_effect=write)
    with pytest.raises(JournalError, match="Disk quota exceeded"):
        engine.apply_plan(plan, desired, Context(), Journal(tmp_path), parallel=2)
    assert applied == []


def _hammer(directory, start, records: int, errors) -> None:
    """One run of many sharing `directory`: its records written as fast as it can, past many rotations."""
    journal = Journal(directory, max_bytes=4_000, keep=200)
    start.wait()
    try:
        for i in range(records):
            journal.record("started", step="hammer", n=i)
    except JournalError as e:
        errors.put(str(e))


def test_runs_sharing_a_state_directory_rotate_its_journal_one_at_a_time(tmp_path):
    """Issue 33, point 7: two runs rotating at once made one of them stop (JournalError: No such file
    or directory). Real processes, a rotation every ~35 records: none fails, no record is lost, and no
    line is empty (another run's write in progress taken for a torn line)."""
    context = multiprocessing.get_context("fork")
    processes, records = 4, 400
    start, errors = context.Barrier(processes), context.Queue()
    runs_ = [context.Process(target=_hammer, args=(tmp_path, start, records, errors)) for _ in range(processes)]
    for process in runs_:
        process.start()
    for process in runs_:
        process.join(60)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == [] and [p.exitcode for p in runs_] == [0] * processes
    files = [p for p in tmp_path.iterdir() if p.name.startswith("journal.jsonl")]
    assert len(files) > 10  # it did rotate, many times
    lines = [line for path in files for line in path.read_bytes().splitlines()]
    entries = [json.loads(line) for line in lines]  # every line a whole record
    written = sorted((e["run"], e["n"]) for e in entries)
    assert len({run for run, _ in written}) == processes
    assert written == sorted(set(written)) and len(written) == processes * records  # each once, none lost
