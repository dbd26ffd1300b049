"""Saved plans: `gpuvm plan RUNBOOK --out FILE`, reviewed, then `gpuvm apply FILE` carries out exactly it.

The file (schema gpuvm.saved-plan/1, src/gpuvm/schemas/saved-plan.json) holds the plan's changes and
notes as `plan --json` prints them, the runbook it was made from (path, sha256 of its text, `--setup`,
`--target`), the `--allow-*` flags its changes need, and for every object the plan changes a digest
of what gpuvm observed of it (its host or VM facts in the inventory, its guest's facts over SSH).

`apply FILE` reads the runbook again and refuses when its text changed; under the run's locks it
observes again and plans again, and refuses ("stale plan: plan again", exit 2, nothing touched),
naming each object whose digest or whose changes differ. Only a plan made again equal to the saved
one is carried out. Secrets are scrubbed from the file as from every document (`documents.dumps`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from gpuvm import collector
from gpuvm.documents import document, dumps, plan_fields, schema_id
from gpuvm.engine import STEPS
from gpuvm.errors import InputError
from gpuvm.files import RUNBOOK_BYTES, read_capped
from gpuvm.apply_options import ApplyOptions
from gpuvm.plan import Change, Disruption, LeftOut, Note, Plan
from gpuvm.runbook.loader import load_runbook
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.setups import select_setup
from gpuvm.render import change_line
from gpuvm.runs import Access, Applied, RemoteFacts, apply_loaded, plan_observed
from gpuvm.targeting import select
from gpuvm.vsphere.facts import Inventory

KIND = "saved-plan"
# Observed values that move by themselves, not changes to an object: a running VM's committed
# storage (VmFacts.disk_gb), the seconds a guest's licence has left (guest.licensing's expires_in)
_VOLATILE = {"disk_gb", "expires_in"}
_KEPT = object()  # a saved change's action: carried out (not pending); the re-made plan's actions are what runs


@dataclass(frozen=True)
class SavedPlan:
    """A plan as written to its file, with what `apply FILE` checks before carrying it out."""

    runbook: str  # the runbook's path, as given to `plan`
    sha256: str  # of the runbook's text
    plan: Plan
    objects: dict[str, str]  # every target the plan changes → digest of what was observed of it
    needs: list[str] = field(default_factory=list)  # the --allow-* flags its changes need
    setup: str | None = None
    targets: tuple[str, ...] = ()

    def to_json(self) -> str:
        return dumps(document(KIND, runbook={"path": self.runbook, "sha256": self.sha256, "setup": self.setup,
                                             "targets": list(self.targets)},
                              needs=self.needs, objects=self.objects, **plan_fields(self.plan)))


def made(book: Runbook, runbook: Path, setup: str | None, targets: Sequence[str], plan: Plan, inventory: Inventory,
         facts: RemoteFacts) -> SavedPlan:
    """The saved form of `plan`, made from `book` (the runbook at `runbook`) over what was observed."""
    return SavedPlan(str(runbook), book.digest, plan, object_digests(plan, inventory, facts), needed_flags(plan),
                     setup, tuple(targets))


def plan_to_file(runbook: Path, out: Path, access: Access, setup: str | None = None,
                 targets: Sequence[str] = ()) -> SavedPlan:
    """`plan RUNBOOK --out FILE`: plan the runbook live (on `targets` only when given) and write the
    saved plan to `out`. `out` the runbook itself is refused before anything is read."""
    if out.exists() and runbook.exists() and out.samefile(runbook):
        raise InputError(f"--out {out}: the runbook itself; save the plan to another file ({runbook.stem}.plan)")
    book = select_setup(load_runbook(runbook), setup)
    select(book, targets)  # unknown names refused before anything is read
    with collector.paused():  # inventories and plans: objects made in bulk
        plan, inventory, facts = plan_observed(book, access, targets)
    saved = made(book, runbook, setup, targets, plan, inventory, facts)
    try:
        out.write_text(saved.to_json() + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"--out {out}: cannot write the saved plan: {e.strerror}") from None
    return saved


def apply_saved(file: Path, saved: SavedPlan, access: Access, options: ApplyOptions, **shown: Any) -> Applied:
    """`apply FILE`: carry out the saved plan, and only it (runs.Applied). Refused with nothing touched
    when the runbook's text changed, when the plan needs an --allow-* flag `options` lacks (before
    connecting), or when the plan made again under the locks differs (StalePlan). `shown`:
    apply_loaded's show_plan, confirm and progress."""
    if not Path(saved.runbook).exists():
        where = "there any more" if Path(saved.runbook).is_absolute() else (
            f"in {Path.cwd()}: run apply in the directory plan --out ran in (a saved plan names its runbook as plan "
            "was given it)")
        raise InputError(f"{file}: its runbook {saved.runbook} is not {where}")
    book = select_setup(load_runbook(saved.runbook), saved.setup)
    check_runbook(saved, book, file)
    given = [flag for flag, on in {"--allow-destroy": options.allow_destroy, "--allow-power-off": options.allow_power_off,
                                   "--allow-host-reboot": options.allow_host_reboot}.items() if on]
    if missing := [flag for flag in saved.needs if flag not in given]:
        raise InputError(f"refusing to apply; nothing was changed: the saved plan needs {', '.join(missing)}")
    return apply_loaded(book, access, options, targets=saved.targets, check=refuse_if_stale(saved, file), **shown)


def needed_flags(plan: Plan) -> list[str]:
    """The --allow-* flags `apply` needs for `plan` (engine.check_allowed asks for them)."""
    reboot_steps = {s.name for s in STEPS if s.reboots_host}
    flags = {"--allow-destroy": plan.disruptive(Disruption.VM_DESTROY),
             "--allow-power-off": plan.disruptive(Disruption.VM_POWER_OFF),
             "--allow-host-reboot": [c for c in plan.disruptive(Disruption.HOST_REBOOT) if c.step in reboot_steps]}
    return [flag for flag, changes in flags.items() if changes]


def object_digests(plan: Plan, inventory: Inventory, facts: RemoteFacts) -> dict[str, str]:
    """Every target `plan` changes → sha256 of what was observed of it (absent: observed absent)."""
    return {target: object_digest(target, inventory, facts) for target in plan.targets()}


def object_digest(target: str, inventory: Inventory, facts: RemoteFacts) -> str:
    seen = _canonical({"host": inventory.hosts.get(target), "vm": inventory.vms.get(target),
                       "remote": {step: fact for (step, name), fact in facts.items() if name == target}})
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()


def _canonical(value: Any) -> Any:
    """An observed fact as plain JSON values, the same for the same fact whatever its type; the
    values that move by themselves (`_VOLATILE`) left out."""
    if isinstance(value, BaseModel):
        return _canonical(value.model_dump(mode="json"))
    if is_dataclass(value) and not isinstance(value, type):
        return _canonical(asdict(value))
    if isinstance(value, Enum):
        return _canonical(value.value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def stale(saved: SavedPlan, plan: Plan, inventory: Inventory, facts: RemoteFacts) -> list[str]:
    """What differs between the saved plan and `plan`, made again now over `inventory` and `facts`:
    one line per object changed since (its digest) or planned otherwise now; none: the same plan."""
    now, before = _by_target(plan.changes), _by_target(saved.plan.changes)
    problems = []
    for target in dict.fromkeys([*before, *now]):
        changed = target in saved.objects and object_digest(target, inventory, facts) != saved.objects[target]
        planned, current = before.get(target, {}), now.get(target, {})
        differs = "" if planned.keys() == current.keys() else (
            f"; planned: {_lines(planned, current)}; now: {_lines(current, planned)}")
        if changed or differs:
            problems.append(f"{target}: {'changed since the plan was made' if changed else 'planned otherwise now'}"
                            f"{differs}")
    return problems


def _by_target(changes: Sequence[Change]) -> dict[str, dict[str, Change]]:
    """Changes by target, each keyed by its form in the file (scrubbed, JSON values)."""
    by_target: dict[str, dict[str, Change]] = {}
    for change in changes:
        by_target.setdefault(change.target, {})[dumps(change.to_dict(), indent=None)] = change
    return by_target


def _lines(these: dict[str, Change], but_not: dict[str, Change], most: int = 3) -> str:
    """The changes of `these` not in `but_not`, one short line each."""
    lines = [change_line(change) for key, change in these.items() if key not in but_not]
    return ", ".join(lines[:most]) + (f" and {len(lines) - most} more" if len(lines) > most else "") or "nothing"


class StalePlan(InputError):
    """The saved plan no longer matches the runbook or the world: nothing was touched."""


def refuse_if_stale(saved: SavedPlan, file: Path) -> Callable[[Plan, Inventory, RemoteFacts], None]:
    """`runs.apply_loaded`'s check: raise StalePlan naming every object that differs."""
    def check(plan: Plan, inventory: Inventory, facts: RemoteFacts) -> None:
        if problems := stale(saved, plan, inventory, facts):
            raise StalePlan(f"stale plan: plan again; {file} no longer matches, nothing was changed:\n  "
                            + "\n  ".join(problems))
    return check


def check_runbook(saved: SavedPlan, book: Runbook, file: Path) -> None:
    """Refuse a runbook whose text changed since the plan was made."""
    if book.digest != saved.sha256:
        raise StalePlan(f"stale plan: plan again; the runbook {saved.runbook} changed since {file} was made "
                        f"(sha256 {saved.sha256[:12]}… then, {book.digest[:12]}… now), nothing was changed")


# The file, read back: input from outside, bounded and checked against its schema before use.

STEP_NAMES = frozenset(s.name for s in STEPS)


def _a_step(name: str) -> str:
    if name not in STEP_NAMES:
        raise ValueError(f"{name[:40]!r} is not a step of this gpuvm (plan again)")
    return name


Named = Annotated[str, Field(min_length=1)]


class _Change(BaseModel):
    """A change as `plan --json` prints it: a step gpuvm has, on a named target, resource and field."""

    model_config = ConfigDict(extra="forbid")
    step: Annotated[str, AfterValidator(_a_step)]
    target: Named
    resource: Named
    field: Named
    before: Any
    after: Any
    disruption: Disruption
    pending: bool
    known_after_apply: bool = False

    def change(self) -> Change:
        return Change(self.step, self.target, self.resource, self.field, self.before, self.after,
                      self.disruption, None if self.pending else _KEPT, known_after_apply=self.known_after_apply)


class _LeftOut(_Change):
    why: str


class _Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str
    step: str
    message: str
    level: str


class _Runbook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    setup: str | None = None
    targets: list[str] = []


class _File(BaseModel):
    model_config = ConfigDict(extra="ignore")  # summary and left_out: derived from the changes
    runbook: _Runbook
    needs: list[Literal["--allow-destroy", "--allow-power-off", "--allow-host-reboot"]] = []
    objects: dict[str, str]
    changes: list[_Change]
    notes: list[_Note] = []
    not_observed: dict[str, str] = {}
    left_out_changes: list[_LeftOut] = []


def read(path: Path) -> SavedPlan | None:
    """The saved plan in `path`, or None when it holds something else (a runbook). A saved plan of
    another version, or one that does not match its schema, is refused naming the file."""
    text = read_capped(path, RUNBOOK_BYTES, "runbook or saved plan")
    try:
        data = json.loads(text) if text.lstrip()[:1] == b"{" else None
    except ValueError:
        return None
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("gpuvm.plan/"):
        raise InputError(f"{path}: a {str(data['schema'])[:40]} document (plan --json), not a saved plan: "
                         "save one with gpuvm plan RUNBOOK --out FILE")
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith(f"gpuvm.{KIND}/"):
        return None
    if data["schema"] != schema_id(KIND):
        raise InputError(f"{path}: a saved plan of schema {str(data['schema'])[:40]!r}, not {schema_id(KIND)} "
                         "(written by another gpuvm version): plan again")
    try:
        file = _File.model_validate({k: v for k, v in data.items() if k != "schema"})
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError(f"{path}: not a valid saved plan: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    plan = Plan([c.change() for c in file.changes], [Note(**n.model_dump()) for n in file.notes],
                dict(file.not_observed), [LeftOut(c.change(), c.why) for c in file.left_out_changes])
    return SavedPlan(file.runbook.path, file.runbook.sha256, plan, dict(file.objects), list(file.needs),
                     file.runbook.setup, tuple(file.runbook.targets))
