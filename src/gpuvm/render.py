"""The one renderer: every table gpuvm prints goes through `table`; plans print grouped by target
(one line per change), or as a table; their JSON form is gpuvm.documents'."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuvm.errors import listed
from gpuvm.long_table import LongTable
from gpuvm.plan import NOT_TARGETED, WHOLE_RUN, Change, Disruption, Plan
from gpuvm.secrets import redact
from gpuvm.untrusted import printable

if TYPE_CHECKING:
    from gpuvm.vsphere.shown import Shown

NO_CHANGES = "No changes. Infrastructure matches the runbook."
KNOWN_AFTER_APPLY = "(known after apply)"  # a change planned from the runbook alone (gpuvm.after_apply)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, caption: str | None = None,
          numbers_from: int | None = None, styles: Sequence[str | None] = (),
          sections: Sequence[int] = ()) -> Table:
    """Every table gpuvm prints: columns from `numbers_from` on are right-aligned figures; `styles`
    gives a row its style; a row whose index is in `sections` starts a new section."""
    out = LongTable(title=title, title_justify="left", show_lines=False, header_style="bold", caption=caption,
                caption_justify="left")
    for i, column in enumerate(columns):
        figure = numbers_from is not None and i >= numbers_from
        out.add_column(column, overflow="fold", justify="right" if figure else "left",
                       no_wrap=numbers_from is not None and i > 0)
    cells = [tuple(redact("" if cell is None else str(cell)) for cell in row) for row in rows]
    if not styles and not sections and all(len(row) == len(columns) for row in cells):
        out.add_plain_rows(cells)
        return out
    starts = set(sections)  # looked up per row: a set, not the caller's list
    for i, row in enumerate(cells):
        if i in starts and i:
            out.add_section()
        out.add_row(*row, style=styles[i] if i < len(styles) else None)
    return out


def _value(value: Any) -> str:
    return "(none)" if value is None else str(value)


_SHORT = {Disruption.VM_POWER_OFF: "VM power-off", Disruption.HOST_REBOOT: "host reboot",
          Disruption.VM_DESTROY: "DESTROYS THE VM"}


def change_line(change: Change) -> str:
    """One change as `mark resource field: before → after (disruption)`, without its target and step
    (a field that the resource's name ends with is said once: `~/.ssh/config: ...`). The mark: `!`
    needs a reboot or power-off, else `+` added, `-` removed, `~` changed."""
    before, after, disruption = change.before, change.after, change.disruption
    if before is None:
        values, sign = _value(after), "+"
    elif after is None:
        values, sign = f"{before} (removed)", "-"
    else:
        values, sign = f"{before} → {after}", "~"
    resource = change.resource
    what = resource if resource.endswith(change.field) else f"{resource} {change.field}"
    label = f" {KNOWN_AFTER_APPLY}" if change.known_after_apply else ""
    if disruption is not Disruption.NONE:
        label += f" ({'pending: ' if change.pending else ''}{_SHORT[disruption]})"
        sign = "!"
    return f"{sign} {what}: {values}{label}"


def grouped_lines(changes: Sequence[Change]) -> list[str]:
    """Changes grouped by target (in plan order), then by step: one line per change."""
    by_target: dict[str, dict[str, list[str]]] = {}
    for change in changes:
        if (steps := by_target.get(change.target)) is None:
            steps = by_target[change.target] = {}
        if (lines := steps.get(change.step)) is None:
            lines = steps[change.step] = []
        lines.append(f"    {change_line(change)}")
    grouped = []
    for target, steps in by_target.items():
        grouped.append(target)
        for step, lines in steps.items():
            grouped.append(f"  {step}")
            grouped += lines
    return grouped


def _incomplete(plan: Plan) -> str:
    """What keeps a plan from being the whole truth: changes left out, targets not observed."""
    parts = []
    if plan.left_out:
        by_target = plan.left_out_by_target()
        parts.append(f"{len(plan.left_out)} change(s) left out on {len(by_target)} target(s): {listed(by_target)}")
    if plan.unobserved:
        parts.append(f"{len(plan.unobserved)} target(s) not observed: {listed(plan.unobserved)}")
    return "; ".join(parts)


def plan_summary(plan: Plan) -> str:
    """One line. A plan that left changes out (`--target`) or could not observe every target never
    reads as "no changes"."""
    missing = _incomplete(plan)
    if plan.empty:
        if not missing:
            others = any(note.step == NOT_TARGETED for note in plan.notes)
            return "No changes on the targets (other targets have changes, not targeted)." if others else NO_CHANGES
        nothing = "No changes to carry out" if plan.left_out else "No changes planned on the targets observed"
        return f"{nothing}; {missing}. The plan is incomplete."
    counts = Counter(c.disruption for c in plan.changes)
    power, reboot, destroy = (counts[kind] for kind in (Disruption.VM_POWER_OFF, Disruption.HOST_REBOOT,
                                                         Disruption.VM_DESTROY))
    pending = sum(1 for c in plan.changes if c.pending) if reboot else 0
    later = sum(1 for c in plan.changes if c.known_after_apply)
    marks = [f"{destroy} DESTROY a VM" if destroy else "", f"{power} need VM power-off" if power else "",
             f"{reboot} need host reboot" + (f" of which {pending} pending" if pending else "") if reboot else "",
             f"{later} known after apply" if later else ""]
    marked = ", ".join(m for m in marks if m)
    summary = f"Plan: {len(plan.changes)} change(s) on {len(plan.targets())} target(s)" + \
        (f" ({marked})." if marked else ".")
    return summary + (f" {missing}." if missing else "")


def left_out_lines(plan: Plan) -> list[str]:
    """The changes left out (`--target`), grouped by target, each target with why."""
    why = plan.left_out_by_target()
    lines = ["Left out (not carried out with this --target; still drift):"]
    for line in grouped_lines([entry.change for entry in plan.left_out]):
        lines.append(f"{line} — {why[line]}" if line in why else line)
    return lines


def print_plan(console: Console, plan: Plan, form: str = "text") -> None:
    """The plan grouped by target, one line per change (`form` "text"), or as one table ("table");
    then what was left out, the notes (a target not observed has one, saying why) and the summary. Plain text, so that
    10,000 changes print in a blink."""
    if not plan.empty and form == "table":
        rows = [(c.step, c.target, c.resource, c.field, _value(c.before),
                 _value(c.after) + (f" {KNOWN_AFTER_APPLY}" if c.known_after_apply else ""),
                 ("! " + c.disruption_label) if c.disruption != Disruption.NONE else "") for c in plan.changes]
        console.print(table(None, ["step", "target", "resource", "field", "before", "after", "disruption"], rows))
    elif not plan.empty:
        _write(console, redact("\n".join(grouped_lines(plan.changes))))
    if plan.left_out:
        _write(console, redact("\n".join(left_out_lines(plan))))
    for note in plan.notes:
        about = "" if note.target == WHOLE_RUN else f"{escape(note.target)}: "
        console.print(f"[yellow]{note.level}[/]: {about}{escape(redact(note.message))}", highlight=False, markup=True,
                      soft_wrap=not console.is_terminal)  # wrapped to a terminal; whole in a pipe or a log
    console.print(plan_summary(plan), highlight=False, soft_wrap=True)


def _write(console: Console, text: str) -> None:
    """Plain text as it is: rich's line splitting would take seconds for 10,000 lines."""
    text = printable(text)  # what guests answered is in it: no control character reaches the terminal
    if console.record:  # kept for export_text
        console.out(text, highlight=False)
    else:
        console.file.write(text + "\n")
        console.file.flush()


def progress_state(status: str) -> str:
    """An apply progress status ("started", "done (3 change(s))", "failed: ...") as one word."""
    word = status.split(" ", 1)[0].rstrip(":")
    return word if word in ("started", "done", "failed") else "info"


def progress_line(step: str, target: str, status: str) -> str:
    """One apply progress event (markup): `✓ step target: status`, with `✗` for a failure."""
    mark = {"done": "[green]✓[/]", "failed": "[red]✗[/]"}.get(progress_state(status), "…")
    return f"{mark} {step:<17} {escape(target)}: {escape(redact(status))}"


def print_inventory(console: Console, seen: "Shown") -> None:
    """The hosts, their GPUs and NICs, and the VMs as tables (several vCenters: a vcenter column)."""
    inventory, fleet = seen.inventory, bool(seen.host_vcenters or seen.vm_vcenters)

    def where(vcenters: dict[str, str], name: str) -> tuple[str, ...]:
        return (vcenters.get(name, ""),) if fleet else ()

    first = ["vcenter"] if fleet else []
    host_rows = []
    for host in inventory.hosts.values():
        state = "maintenance" if host.in_maintenance else host.connection_state
        host_rows.append((*where(seen.host_vcenters, host.name), host.name, state, f"{host.memory_mb // 1024} GB",
                          host.graphics.default_type, len(host.vgpu_profiles), len(inventory.vms_on(host.name))))
    console.print(table("Hosts", [*first, "host", "state", "memory", "graphics", "vGPU profiles", "VMs"], host_rows))
    device_rows = [(host.name, d.id, d.device_name, d.pci_id, "" if d.numa_node is None else d.numa_node,
                    d.passthru_state)
                   for host in inventory.hosts.values() for d in host.pci if d.is_gpu or d.is_mellanox]
    console.print(table("GPUs and NICs", ["host", "address", "model", "id", "NUMA", "passthrough"], device_rows))
    vm_rows = [(*where(seen.vm_vcenters, vm.name), vm.name, vm.host, vm.power_state, vm.cpus,
                f"{vm.memory_mb // 1024} GB", vm.firmware, "yes" if vm.reservation_locked else "no",
                ", ".join(d.describe() for d in vm.pci) or "-")
               for vm in inventory.vms.values()]
    console.print(table("VMs", [*first, "vm", "host", "power", "CPUs", "memory", "firmware", "reserved", "PCI devices"],
                        vm_rows))
