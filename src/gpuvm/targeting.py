"""`--target NAME`: plan, apply or verify some hosts, VMs and guests only (or a vCenter's: all its hosts).

A host implies its VMs and their guests (and its ESXi shell); a VM implies its guest (guests are
named after their VM). What the targets left out would have to do first is never half-done: a
change that depends on one is left out with it. What is left out is listed in the plan with why
(`Plan.left_out`) and counts: such a plan never reads "No changes" (see `gpuvm.render`).

A change depends on a target outside the selection when:

- a VM's new devices or a guest's setting that a host reboot activates (ConnectX ATS) need changes
  planned on its host (passthrough, graphics, MIG mode, the reboot): the whole VM and its guest
  are left out;
- a VM's new devices need devices removed from another VM on its host (a GPU moves, or frees room
  for a vGPU or a dynamic DirectPath count), or its power-on needs another VM powered off (that
  VM's dynamic DirectPath holds the GPU it names): the whole VM and its guest are left out;
- a running VM's stop for its host's reboot is that reboot's: with the host outside, the stop is left
  out, and so is the power-on `vm.power` plans after it (unless a change of the VM's own powers it off);
  a VM the runbook wants off (no power-on after the stop) is powered off on its own instead, by
  `vm.power`: that change is the VM's, made and counted by the run;
- a guest's image is to be copied from a builder that builds it in this run: its `guest.image`;
- the SSH mesh changes on a guest left out too: the mesh is one key and one set of files on every
  guest, so its `guest.ssh_mesh` changes are left out on all of them.

The selection is checked against the runbook before anything is read: an unknown name is an
input error (exit 2). Filtering happens on the plan, after the whole runbook is resolved, so the
devices chosen are the same with or without `--target`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuvm.errors import InputError, listed
from gpuvm.plan import NOT_TARGETED, WHOLE_RUN, Change, Disruption, LeftOut, Note, Plan
from gpuvm.runbook.model import Runbook
from gpuvm.names import split
from gpuvm.steps.host_reboot import StopForReboot
from gpuvm.steps.vm_power import SetPower, set_power
from gpuvm.vsphere.facts import Inventory


@dataclass(frozen=True)
class Selection:
    """The names given with --target, checked against the runbook."""

    names: frozenset[str]
    hosts_of: Mapping[str, str] = field(default_factory=dict)  # the runbook's VMs → their hosts (new ones too)

    def targets(self, inventory: Inventory) -> frozenset[str]:
        """The names with what they imply: a host's VMs (the runbook's, created or not, and the others
        it runs, whose guests the runbook may name) and, by name, their guests and the host's ESXi shell."""
        return self.names | {vm for vm, host in vms_by_host(self, inventory) if host in self.names}

    def drift(self, plan: Plan, inventory: Inventory) -> Plan:
        """What `verify` reports: every change on the targets, whatever else it waits for."""
        inside = self.targets(inventory)
        return replace(plan, changes=[c for c in plan.changes if c.target in inside],
                       notes=[n for n in plan.notes if n.target in inside or n.target == "-"],
                       unobserved={n: why for n, why in plan.unobserved.items() if n in inside})


def select(runbook: Runbook, names: Sequence[str]) -> Selection | None:
    """The selection for `--target` names, or None for everything. Unknown names: InputError."""
    if not names:
        return None
    hosts = {h.name for h in runbook.hosts} | {vm.host for vm in runbook.vms}
    vms = {vm.name for vm in runbook.vms} | {g.vm for g in (runbook.guests.hosts if runbook.guests else [])}
    vcenters = {vc.name for vc in runbook.vcenters}  # a vCenter's name: all its hosts (and so their VMs)
    names = [_named(runbook, n, hosts | vms, vcenters) for n in names]
    unknown = [n for n in dict.fromkeys(names) if n not in hosts | vms | vcenters]
    if unknown:
        known_vcenters = f"; vCenters: {', '.join(sorted(vcenters))}" if vcenters else ""
        raise InputError(f"--target {', '.join(unknown)}: no host, VM or guest of that name in {runbook.file} "
                         f"(hosts: {', '.join(sorted(hosts)) or 'none'}; VMs and guests: {', '.join(sorted(vms)) or 'none'}"
                         f"{known_vcenters})")
    expanded = [h for n in names if n in vcenters and n not in hosts | vms
                for h in sorted({h.name for h in runbook.part(n).hosts} | {vm.host for vm in runbook.part(n).vms})]
    chosen = [n for n in names if n not in vcenters or n in hosts | vms] + expanded
    return Selection(frozenset(chosen), {vm.name: vm.host for vm in runbook.vms})


def _named(runbook: Runbook, name: str, known: set[str], vcenters: set[str]) -> str:
    """The runbook's name for a --target name: as given, or `<vcenter>/<name>` for a name unique in
    the runbook (gpuvm shows it bare). A bare name used in several vCenters is refused with the
    qualified names it could mean (gpuvm/names.py)."""
    if name in known or name in vcenters:
        return name
    vcenter, bare = split(name)
    if vcenter is not None and bare in known and runbook.vcenter_of(bare) == vcenter:
        return bare
    choices = sorted(n for n in known if split(n)[0] is not None and split(n)[1] == name)
    if choices:
        among = f" (or a vCenter: {', '.join(sorted(vcenters))})" if vcenters else ""
        raise InputError(f"--target {name}: a name in several vCenters; give one of {', '.join(choices)}{among}")
    return name


def vms_by_host(selection: Selection, inventory: Inventory) -> set[tuple[str, str | None]]:
    return {(vm.name, vm.host) for vm in inventory.vms.values()} | set(selection.hosts_of.items())


def _host_of(name: str, selection: Selection, inventory: Inventory) -> str | None:
    vm = inventory.vms.get(name)
    return vm.host if vm is not None else selection.hosts_of.get(name)


def _adds_devices(changes: Iterable[Change]) -> bool:
    return any(c.step == "vm.hardware" and c.before is None and c.resource.startswith("pci device")
               for c in changes)


def _removes_devices(changes: Iterable[Change]) -> bool:
    """Devices removed, or the VM destroyed (`state: absent`) with them."""
    return any((c.step == "vm.hardware" and c.after is None and c.resource.startswith("pci device"))
               or (c.step == "vm.lifecycle" and c.field == "exists" and c.after == "DESTROYED") for c in changes)


def _frees_gpu_for(change: Change) -> str | None:
    return getattr(change.action, "for_vm", None) if change.step == "vm.power" else None


def _needs_host(changes: list[Change]) -> bool:
    """A VM's (and its guest's) changes that wait for changes on its host."""
    return _adds_devices(changes) or any(c.disruption == Disruption.HOST_REBOOT for c in changes)


def _on_hosts(selection: Selection, inventory: Inventory) -> dict[str | None, set[str]]:
    """`vms_by_host` indexed by host: host → the VMs on it (the inventory's and the runbook's)."""
    index: dict[str | None, set[str]] = {}
    for vm, host in vms_by_host(selection, inventory):
        index.setdefault(host, set()).add(vm)
    return index


def _whole_target_reasons(by_target: dict[str, list[Change]], inside: set[str], selection: Selection,
                          inventory: Inventory, on_hosts: dict[str | None, set[str]]) -> dict[str, str]:
    """VMs (with their guests) inside that depend on a target outside: name → why. `on_hosts`:
    `_on_hosts(selection, inventory)`, built once by the caller."""
    reasons: dict[str, str] = {}
    for name in sorted(inside & by_target.keys()):
        changes = by_target[name]
        host = _host_of(name, selection, inventory)
        if host is None or host in inside:
            continue
        if host in by_target and _needs_host(changes):
            reasons[name] = f"waits on host {host} ({len(by_target[host])} change(s) planned there), not targeted"
            continue
        others = sorted(vm for vm in on_hosts.get(host, ()) if vm != name and vm not in inside)
        removing = [o for o in others if _removes_devices(by_target.get(o, []))]
        if _adds_devices(changes) and removing:
            reasons[name] = f"its new devices wait on devices removed from {', '.join(removing)}, not targeted"
            continue
        holders = [c.target for o in others for c in by_target.get(o, []) if _frees_gpu_for(c) == name]
        if holders:
            reasons[name] = (f"its power-on waits on {', '.join(holders)} powered off (its dynamic DirectPath holds "
                             f"a GPU {name} names), not targeted")
    return reasons


def _stops_outside(changes: list[Change], inside: set[str]) -> list[Change]:
    """A VM's stops for the reboot of a host outside (only that reboot makes them)."""
    return [c for c in changes if isinstance(c.action, StopForReboot) and c.action.host not in inside]


def _own_power_off(changes: list[Change], inside: set[str]) -> tuple[Change, Change] | None:
    """(the stop, the VM's own power-off) for a VM of the runbook's that is stopped for the reboot of
    a host outside and wanted off: nothing of its own powers it off before nor on after (vm.power
    planned no power-on: the stop leaves it as the runbook wants). The run makes that power-off."""
    stops = _stops_outside(changes, inside)
    if len(stops) != 1 or stops[0].action.restore:
        return None
    own = [c for c in changes if c is not stops[0]]
    if any(c.disruption in (Disruption.VM_POWER_OFF, Disruption.VM_DESTROY) or isinstance(c.action, SetPower)
           for c in own):
        return None
    return stops[0], set_power(stops[0].target, "off")


def _reboot_reasons(changes: list[Change], inside: set[str]) -> list[tuple[Change, str]]:
    """A VM's stop for the reboot of a host outside (only that reboot makes it; a VM wanted off is
    powered off on its own instead: `_own_power_off`), and the power-on `vm.power` plans after it
    unless a change of the VM's own powers it off: with why."""
    stops = _stops_outside(changes, inside)
    if not stops or _own_power_off(changes, inside):
        return []
    host = stops[0].action.host
    left = [(c, f"waits for the reboot of {host}, not targeted") for c in stops]
    if not any(c.disruption == Disruption.VM_POWER_OFF for c in changes if c not in stops):
        left += [(c, f"powers it on after the reboot of {host}, not targeted") for c in changes
                 if isinstance(c.action, SetPower) and c.action.state == "on"]
    return left


def _change_reasons(by_target: dict[str, list[Change]], inside: set[str]) -> list[tuple[Change, str]]:
    """Changes inside that depend on a guest or VM outside (or a host's reboot), with why."""
    left: list[tuple[Change, str]] = []
    mesh_outside = sorted(n for n, cs in by_target.items()
                          if n not in inside and any(c.step == "guest.ssh_mesh" for c in cs))
    for name in sorted(inside & by_target.keys()):
        left += _reboot_reasons(by_target[name], inside)
        for change in by_target[name]:
            action = change.action
            if change.step == "guest.ssh_mesh" and mesh_outside:
                left.append((change, f"the SSH mesh is one key on every guest, and {', '.join(mesh_outside)} "
                                     "(not targeted) need mesh changes too"))
            elif change.step == "guest.image" and getattr(action, "how", None) == "copy" \
                    and action.builder not in inside \
                    and any(getattr(c.action, "how", None) == "build" for c in by_target.get(action.builder, [])):
                left.append((change, f"its image is copied from {action.builder}, which builds it in this run"))
            elif (for_vm := _frees_gpu_for(change)) and for_vm not in inside:
                left.append((change, f"it powers {name} off to free a GPU for {for_vm}, which is not targeted"))
    return left


@dataclass
class Scope:
    """A selection applied to one inventory: narrows the plan, and what apply plans again later."""

    selection: Selection
    inventory: Inventory
    left_out: frozenset[str] = frozenset()  # targets left out whole when the plan was narrowed
    # selection.targets(inventory) and _on_hosts, built once: both go over every VM, and covers() is
    # asked per guest and per failure. Built again only if the inventory's VMs changed in number (apply
    # adds the VMs it clones; a VM entry replaced keeps its host).
    _index: tuple[tuple[int, int], frozenset[str], dict[str | None, set[str]]] | None = \
        field(default=None, init=False, repr=False, compare=False)

    def _indexed(self) -> tuple[frozenset[str], dict[str | None, set[str]]]:
        key = (id(self.inventory.vms), len(self.inventory.vms))
        if self._index is None or self._index[0] != key:
            self._index = (key, self.selection.targets(self.inventory), _on_hosts(self.selection, self.inventory))
        return self._index[1], self._index[2]

    def targets(self) -> frozenset[str]:
        """The selection's targets on this inventory (`Selection.targets`)."""
        return self._indexed()[0]

    def narrow_changes(self, changes: Sequence[Change]) -> tuple[list[Change], list[Note], list[LeftOut]]:
        """The changes on the selected targets that depend on nothing outside them; a note about the
        changes outside the selection; and the changes inside left out, each with why."""
        by_target: dict[str, list[Change]] = {}
        for change in changes:
            by_target.setdefault(change.target, []).append(change)
        targets, on_hosts = self._indexed()
        inside = set(targets) - self.left_out
        whole: dict[str, str] = {}
        while reasons := _whole_target_reasons(by_target, inside, self.selection, self.inventory,
                                               on_hosts):  # one left out may strand others
            inside -= reasons.keys()
            whole |= reasons
        self.left_out |= whole.keys()
        left = [LeftOut(c, why) for name, why in whole.items() for c in by_target[name]]
        left += [LeftOut(c, why) for c, why in _change_reasons(by_target, inside)]
        dropped = {id(entry.change) for entry in left}
        instead: dict[int, Change] = {}  # a stop for a reboot left out → the VM's own power-off
        for name in inside & by_target.keys():
            if pair := _own_power_off(by_target[name], inside):
                instead[id(pair[0])] = pair[1]
        kept = [instead.get(id(c), c) for c in changes if c.target in inside and id(c) not in dropped]
        notes = []
        outside = sorted(t for t in by_target if t not in inside and t not in whole and t not in targets)
        if outside:
            count = sum(len(by_target[t]) for t in outside)
            notes.append(Note(WHOLE_RUN, NOT_TARGETED, f"not targeted: {count} change(s) on {listed(outside)}",
                              level="info"))
        return kept, notes, left

    def keep(self, changes: Sequence[Change]) -> list[Change]:
        """What apply plans again (guests observed after their VM changed), narrowed the same way."""
        return self.narrow_changes(changes)[0]

    def covers(self, target: str) -> bool:
        return target in self.targets() and target not in self.left_out

    def narrow(self, plan: Plan) -> Plan:
        """The plan on the selection: what is left out of it is listed (`Plan.left_out`) and counts;
        a target in the selection that could not be observed counts, left out or not."""
        kept, notes, left = self.narrow_changes(plan.changes)
        inside = self.targets()
        return replace(plan, changes=kept, notes=[n for n in plan.notes if n.target in inside or n.target == "-"]
                       + notes, left_out=[*plan.left_out, *left],
                       unobserved={n: why for n, why in plan.unobserved.items() if n in inside})

