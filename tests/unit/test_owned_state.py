"""State gpuvm owns: maintenance mode it entered (recorded on the host, not in the journal), and a run's
end journaled even when the run was interrupted (issue 11, item 2)."""

from __future__ import annotations

import json

import pytest

from gpuvm import engine
from gpuvm.journal import Journal, past_entries
from gpuvm.plan import Plan
from gpuvm.desired import Desired
from gpuvm.steps.base import Context
from gpuvm.runbook.loader import load_runbook
from gpuvm.vsphere.intent import Intent
from tests.unit.factories import inventory, r750xa


def test_maintenance_mode_is_gpuvms_by_the_record_on_the_host_not_by_the_journal(tmp_path):
    """A journal line saying "entered" (the old ownership) no longer takes a host out: an operator's
    maintenance stays; only the "maintenance" intent on the host itself does (issue 21, item 1)."""
    book = tmp_path / "rb.yaml"
    book.write_text("hosts: [{name: esx-01, allow_maintenance: true, allow_reboot: true}]\n")
    operator = r750xa(in_maintenance=True)  # whatever any journal says: plan reads none
    plan, _ = engine.make_plan(load_runbook(book), inventory([operator], []))
    assert plan.for_step("host.reboot") == []
    gpuvms = r750xa(in_maintenance=True, intents={"maintenance": Intent(run="3f2a", why="reboot of esx-01")})
    plan, _ = engine.make_plan(load_runbook(book), inventory([gpuvms], []))
    assert [(c.field, c.after) for c in plan.for_step("host.reboot")] == [("maintenance mode", "off")]
    assert [n.target for n in plan.notes if n.step == "intent"] == ["esx-01"]  # plan shows the record too


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
