"""State gpuvm owns, read back from its journal: maintenance mode it entered, and a run's end even
when the run was interrupted (issue 11, item 2)."""

from __future__ import annotations

import json

import pytest

from gpuvm import engine
from gpuvm.journal import Journal, past_entries
from gpuvm.plan import Plan
from gpuvm.resolve import Desired
from gpuvm.steps.base import Context
from gpuvm.steps.host_reboot import entered_by_gpuvm


def test_hosts_gpuvm_entered_maintenance_mode_on_and_never_left():
    entries = [{"status": "maintenance", "host": "esx-01", "state": "entered"},
               {"status": "maintenance", "host": "esx-02", "state": "entered"},
               {"status": "done", "step": "host.reboot", "target": "esx-03"},
               {"status": "maintenance", "host": "esx-01", "state": "left"},
               {"status": "maintenance", "host": "esx-04", "state": "left"}]
    assert entered_by_gpuvm(entries) == {"esx-02"}


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interrupted_apply_journals_its_end(tmp_path, mocker, stop):
    mocker.patch.object(engine, "_apply_steps", side_effect=stop)
    with pytest.raises(stop):
        engine.apply_plan(Plan(), Desired(), Context(), Journal(tmp_path))
    *_, end = past_entries(tmp_path)
    assert end["status"] == "run-end" and end["interrupted"] == stop.__name__


def test_past_entries_creates_nothing_and_skips_a_half_written_line(tmp_path):
    assert past_entries(tmp_path / "none") == [] and not (tmp_path / "none").exists()
    (tmp_path / "journal.jsonl").write_text(json.dumps({"status": "run-start"}) + "\n{\"status\": \"do")
    assert past_entries(tmp_path) == [{"status": "run-start"}]


def test_targets_journal_at_once_every_entry_whole_and_on_disk(tmp_path, mocker):
    from concurrent.futures import ThreadPoolExecutor

    from gpuvm.journal import os as journal_os
    from gpuvm.plan import Change

    synced = mocker.spy(journal_os, "fsync")
    journal = Journal(tmp_path)
    changes = {f"vm{t}": [Change("vm.hardware", f"vm{t}", "vm", f, 1, 2) for f in ("cpus", "memory_mb")]
               for t in range(32)}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda target: journal.record_all("started", changes[target]), changes))
    journal.record("run-end", changes=64)  # an entry's own `changes` field
    entries = past_entries(tmp_path)
    assert len(entries) == 65 and synced.call_count == 33  # one flush per target, not per change
    assert sorted((e["target"], e["field"]) for e in entries[:-1]) == sorted(
        (c.target, c.field) for cs in changes.values() for c in cs)
    assert entries[-1]["changes"] == 64
