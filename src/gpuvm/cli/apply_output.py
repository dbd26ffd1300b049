"""What `gpuvm apply` prints: the plan, progress, a summary; as text, or one JSON document a line."""

from __future__ import annotations

from typing import Any

from gpuvm.cli.common import err, out
from gpuvm.documents import document, dumps, plan_fields
from gpuvm.errors import counted
from gpuvm.render import print_plan, progress_line, progress_state


class ApplyOutput:
    """Text: the plan on stdout, progress on stderr, the summary on stdout. JSON (`as_json`): every
    event a `gpuvm.apply/1` document on its own stdout line, flushed, so a script can follow the run."""

    def __init__(self, as_json: bool, form: str = "text"):
        self.as_json, self.form = as_json, form

    def _emit(self, event: str, **fields: Any) -> None:
        print(dumps(document("apply", event=event, **fields), indent=None), flush=True)

    def plan(self, plan: Any) -> None:
        if self.as_json:
            self._emit("plan", **plan_fields(plan))
        else:
            print_plan(out, plan, self.form)

    def progress(self, step: str, target: str, status: str) -> None:
        if self.as_json:
            self._emit("progress", step=step, target=target, state=progress_state(status), status=status)
        else:
            err.print(progress_line(step, target, status), highlight=False, markup=True, soft_wrap=True)

    def summary(self, applied: Any) -> None:
        if self.as_json:
            self._emit("summary", applied=applied.ran, changes_done=applied.changes_done,
                       changes_planned=len(applied.plan.changes), seconds=round(applied.seconds, 3),
                       failed={target: str(error) for target, error in applied.failed.items()},
                       skipped=applied.skipped, journal=None if applied.journal is None else str(applied.journal),
                       not_observed=applied.unobserved, left_out=applied.plan.left_out_by_target())
            return
        if not applied.ran:
            return
        out.print(f"Applied {applied.changes_done} of {len(applied.plan.changes)} change(s) in {applied.seconds:.1f} s; "
                  f"{counted(applied.failed, len(applied.unobserved), len(applied.skipped), every=True)}. "
                  f"Journal: {applied.journal}", soft_wrap=True)
        for target, reason in applied.skipped.items():
            err.print(f"skipped {target}: {reason}", highlight=False, soft_wrap=True)
