"""Host and VM names are unique per vCenter, not per runbook: two regions built from one template
both hold `esx-01`. gpuvm names each host and VM by its vCenter name alone when that is unique in
the runbook, and as `<vcenter>/<name>` when the name is used in more than one vCenter: that is the
name plans, progress, the journal, verify and `--target` show and take. vCenter never sees it
(`vsphere_name`): its names cannot hold '/' (runbook names cannot either).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuvm.errors import listed

SEPARATOR = "/"


def qualified(vcenter: str, name: str) -> str:
    return f"{vcenter}{SEPARATOR}{name}"


def vsphere_name(target: str) -> str:
    """A host's or VM's name in its vCenter: `east/esx-01` → `esx-01` (a unique name as it is)."""
    return target.rpartition(SEPARATOR)[2]


def split(reference: str) -> tuple[str | None, str]:
    """`east/esx-01` → ('east', 'esx-01'); `esx-01` → (None, 'esx-01')."""
    vcenter, separator, name = reference.rpartition(SEPARATOR)
    return (vcenter if separator else None), name


class Names:
    """One kind's names (hosts, or VMs) by (vCenter, name in vCenter) → the name gpuvm gives it."""

    def __init__(self, kind: str, field: str, entries: Iterable[tuple[str, str]], declared: Iterable[str]):
        self.kind, self.field = kind, field  # "host", "hosts": for messages
        self.declared = list(declared)  # the runbook's vCenters
        self.vcenters: dict[str, list[str]] = {}  # name in vCenter → the vCenters that hold one
        for vcenter, name in entries:
            self.vcenters.setdefault(name, []).append(vcenter)
        self.ids = {(vc, name): qualified(vc, name) if len(set(vcs)) > 1 else name
                    for name, vcs in self.vcenters.items() for vc in vcs}

    def resolve(self, reference: str, vcenter: str | None = None, hint: str = "") -> str:
        """The name gpuvm gives the one `reference` names: `<vcenter>/<name>`, or a name unique in the
        runbook, or one in `vcenter` (when given). ValueError saying why none or several."""
        named_vcenter, name = split(reference)
        held_in = self.vcenters.get(name, [])
        if named_vcenter is not None:
            if (named_vcenter, name) in self.ids:
                return self.ids[(named_vcenter, name)]
            if named_vcenter not in self.declared:
                raise ValueError(f"{self.kind} '{reference}' is not in {self.field} (vCenter '{named_vcenter}' is not "
                                 f"declared; vCenters: {listed(self.declared)})")
            there = [n for (vc, n) in self.ids if vc == named_vcenter]
            raise ValueError(f"{self.kind} '{reference}' is not in {self.field} ({named_vcenter}'s: "
                             f"{listed(there) or 'none'})")
        if vcenter is not None and held_in:
            if (vcenter, name) in self.ids:
                return self.ids[(vcenter, name)]
            there = [n for (vc, n) in self.ids if vc == vcenter]
            raise ValueError(f"{self.kind} '{reference}' is not in vCenter '{vcenter}' (its {self.kind}s there: "
                             f"{listed(there) or 'none'})")
        if len(held_in) > 1:
            choices = " or ".join(qualified(vc, name) for vc in held_in)
            raise ValueError(f"{self.kind} '{reference}' is in several vCenters: {hint}write {choices}")
        if not held_in:
            raise ValueError(f"{self.kind} '{reference}' is not in {self.field} "
                             f"(declared: {listed(dict.fromkeys(self.ids.values())) or 'none'})")
        return self.ids[(held_in[0], name)]

    def choices(self, name: str) -> list[str]:
        """The qualified names a bare `name` could mean (two or more: it is ambiguous)."""
        return [qualified(vc, name) for vc in self.vcenters.get(name, [])] if len(self.vcenters.get(name, [])) > 1 else []


def file_stem(target: str) -> str:
    """A host's or VM's name where a local file name holds it: `east/gpu-vm-01` → `east@gpu-vm-01`
    ('@' is in no name, so two targets never share a file)."""
    return target.replace(SEPARATOR, "@")
