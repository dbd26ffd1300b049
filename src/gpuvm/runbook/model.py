"""The runbook's typed model (pydantic v2). Field names are the YAML keys users write."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, PrivateAttr, field_validator

from gpuvm.errors import InputError, listed
from gpuvm.names import Names, vsphere_name
from gpuvm.runbook import guest_drivers
from gpuvm.runbook.benchmarks import BenchmarkSpec, check_benchmarks
from gpuvm.runbook.document import field_path
from gpuvm.runbook.guests import Guest, Guests
from gpuvm.runbook.hosts import Host, SshSettings, TopologyPolicy
from gpuvm.runbook.slurm import Slurm
from gpuvm.runbook.strict import Strict
from gpuvm.runbook.vcenters import DEFAULT_VCENTER, NamedVCenter, VCenter, vcenter_address
from gpuvm.runbook.vms import PassthroughGpus, Vm
from gpuvm.sizing.spec import SizingSpec

if TYPE_CHECKING:
    from gpuvm.runbook.document import Locator


class Runbook(Strict):
    model_config = ConfigDict(extra="forbid", frozen=False)

    vcenter: VCenter = VCenter()  # where and how gpuvm logs in to vCenter
    vcenters: list[NamedVCenter] = []  # several vCenters, each named (instead of vcenter)
    topology: TopologyPolicy = "warn"  # GPUs of a VM on one NUMA node, in NVLink pairs, its NICs on their node
    hosts: list[Host] = []  # the ESXi hosts gpuvm configures
    vms: list[Vm] = []  # the VMs gpuvm configures; a missing one with a template is created
    ssh: SshSettings = SshSettings()  # SSH settings for every ESXi shell and guest
    guests: Guests | None = None  # the guest OSes, over SSH
    benchmarks: BenchmarkSpec | None = None  # the benchmark campaign `gpuvm bench run` runs
    sizing: SizingSpec | None = None  # what `gpuvm size` reads (gpuvm/sizing/spec.py)
    slurm: Slurm | None = None  # Slurm on the guests (gpuvm/runbook/slurm.py, guest.slurm)

    _file: Path | None = PrivateAttr(default=None)
    _locator: "Locator | None" = PrivateAttr(default=None)
    _digest: str = PrivateAttr(default="")

    @field_validator("benchmarks")
    @classmethod
    def _reserved(cls, value: Any) -> Any:
        return value  # validated by the benchmark runner

    def attach(self, file: Path, locator: "Locator", text: str) -> None:
        self._file, self._locator = file, locator
        self._digest = hashlib.sha256(text.encode()).hexdigest()

    @property
    def file(self) -> Path:
        return self._file or Path("<runbook>")

    @property
    def digest(self) -> str:
        return self._digest

    def error(self, loc: tuple[str | int, ...], message: str) -> InputError:
        """An InputError at a field of this runbook: `file:line: field: message`."""
        if self._locator is None:
            return InputError(f"{self.file}: {field_path(loc)}: {message}")
        return self._locator.error(loc, message)

    def where(self, loc: tuple[str | int, ...]) -> str:
        """`file:line: field` of a field of this runbook."""
        if self._locator is None:
            return f"{self.file}: {field_path(loc)}"
        return self._locator.where(loc)

    def host(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)

    def vm(self, name: str) -> Vm | None:
        return next((v for v in self.vms if v.name == name), None)

    @property
    def all_vcenters(self) -> dict[str, VCenter]:
        """Every vCenter of the runbook by name: `vcenters`, or `vcenter` named "default"."""
        if self.vcenters:
            return {vc.name: vc for vc in self.vcenters}
        return {DEFAULT_VCENTER: self.vcenter}

    def vcenter_loc(self, name: str) -> tuple[str | int, ...]:
        """Where a vCenter's settings are in the runbook ('vcenter', or 'vcenters', i)."""
        index = next((i for i, vc in enumerate(self.vcenters) if vc.name == name), None)
        return ("vcenter",) if index is None else ("vcenters", index)

    def vcenter_of(self, target: str) -> str:
        """The vCenter of a host, VM or guest of the runbook (checked: `check_references`)."""
        by_host = self.vcenters_by_host()
        vm = next((v for v in self.vms if v.name == target), None) if target not in by_host else None
        return by_host.get(vm.host if vm is not None else target, self._first_vcenter())

    def vcenters_by_host(self) -> dict[str, str]:
        """Each declared host's vCenter."""
        first = self._first_vcenter()
        return {h.name: h.vcenter or first for h in self.hosts}

    def _first_vcenter(self) -> str:
        return self.vcenters[0].name if self.vcenters else DEFAULT_VCENTER

    def part(self, *vcenters: str) -> "Runbook":
        """This runbook with only these vCenters' hosts, VMs and their guests (its other settings kept)."""
        by_host = self.vcenters_by_host()
        first = self._first_vcenter()
        hosts = [h for h in self.hosts if by_host[h.name] in vcenters]
        vms = [v for v in self.vms if by_host.get(v.host, first) in vcenters]
        names = {v.name for v in vms}
        guests = self.guests
        if guests is not None:
            guests = guests.model_copy(update={"hosts": [g for g in guests.hosts if g.vm in names]})
        part = self.model_copy(update={"hosts": hosts, "vms": vms, "guests": guests})
        part._file, part._locator, part._digest = self._file, self._locator, self._digest
        return part

    def slots_of(self, guest: Guest) -> int:
        """A guest's MPI slots (the GPUs a job uses there): its `slots`, else its VM's GPU count (in
        this runbook: a setup's own), else 1."""
        if guest.slots is not None:
            return guest.slots
        vm = next((v for v in self.vms if v.name == guest.vm), None)
        return vm.gpus.count if vm is not None and vm.gpus is not None else 1

    def strict_topology(self, vm: Vm) -> bool:
        return (vm.topology or self.topology) == "strict"

    def check_references(self) -> "Runbook":
        """Checks that need only the runbook: names unique per vCenter, references that name one host
        or VM, VMs on declared hosts, devices given once. Returns the runbook `qualified` (made here)."""
        self._check_vcenters()
        book = self.qualified()
        vms = {vm.name: i for i, vm in enumerate(book.vms)}
        claimed: dict[tuple[str, str], str] = {}
        for i, vm in enumerate(book.vms):
            addresses = [(("nics", j, "address"), n.address) for j, n in enumerate(vm.nics)]
            if isinstance(vm.gpus, PassthroughGpus) and vm.gpus.addresses:
                addresses += [(("gpus", "addresses", j), a) for j, a in enumerate(vm.gpus.addresses)]
            for loc, address in addresses:
                owner = claimed.setdefault((vm.host, address), vm.name)
                if owner != vm.name:
                    raise self.error(("vms", i) + loc, f"device {address} on {vm.host} is already given to VM '{owner}'")
                if owner == vm.name and loc[0] == "nics" and sum(1 for _, a in addresses if a == address) > 1:
                    raise self.error(("vms", i) + loc, f"device {address} is listed twice")

        book._check_guests(vms)
        if book.benchmarks is not None:
            check_benchmarks(book, local=not (book.guests and book.guests.hosts))
        return book

    def qualified(self) -> "Runbook":
        """This runbook with each host and VM named as gpuvm shows and targets it: a name used in more
        than one vCenter as `<vcenter>/<name>` (gpuvm/names.py), and every reference to one resolved
        to that name (a VM's host within the VM's vCenter). Itself when nothing changes. InputError at
        file:line: field for a name declared twice in one vCenter, or a reference naming none or
        several. Run again on its result, it changes nothing."""
        first = self._first_vcenter()
        declared = list(self.all_vcenters)
        keys = [(h.vcenter or first, vsphere_name(h.name)) for h in self.hosts]
        hosts = Names("host", "hosts", keys, declared)
        self._once("hosts", "host", keys)
        host_vcenter = {hosts.ids[key]: key[0] for key in keys}
        vm_hosts = [self._host_of(i, vm, hosts, host_vcenter) for i, vm in enumerate(self.vms)]
        vm_keys = [(vm.vcenter or host_vcenter[vm_hosts[i]], vsphere_name(vm.name)) for i, vm in enumerate(self.vms)]
        vms = Names("VM", "vms", vm_keys, declared)
        self._once("vms", "VM", vm_keys)
        host_names = [hosts.ids[key] for key in keys]
        vm_names = [(vms.ids[key], host) for key, host in zip(vm_keys, vm_hosts)]
        guests, benchmarks = self._qualified_guests(vms), self._qualified_benchmarks(vms)
        if host_names == [h.name for h in self.hosts] and vm_names == [(v.name, v.host) for v in self.vms] \
                and guests is self.guests and benchmarks is self.benchmarks:
            return self
        book = self.model_copy(update={
            "hosts": [h.model_copy(update={"name": name}) for h, name in zip(self.hosts, host_names)],
            "vms": [v.model_copy(update={"name": name, "host": host}) for v, (name, host) in zip(self.vms, vm_names)],
            "guests": guests, "benchmarks": benchmarks})
        book._file, book._locator, book._digest = self._file, self._locator, self._digest
        return book

    def _once(self, field: str, kind: str, keys: list[tuple[str, str]]) -> None:
        """Each (vCenter, name) of `field` (hosts or vms) declared once."""
        seen: dict[tuple[str, str], int] = {}
        for i, key in enumerate(keys):
            if key in seen:
                where = f" in vCenter '{key[0]}'" if self.vcenters else ""
                raise self.error((field, i, "name"), f"{kind} '{key[1]}' is declared twice{where} "
                                                     f"(also {field}[{seen[key]}])")
            seen[key] = i

    def _host_of(self, i: int, vm: Vm, hosts: Names, host_vcenter: dict[str, str]) -> str:
        """The name gpuvm gives VM i's host: its `host`, looked for in the VM's `vcenter` when it gives one."""
        try:
            host = hosts.resolve(vm.host, vm.vcenter, hint="give vcenter, or ")
        except ValueError as e:
            try:  # in one other vCenter only: the VM's vcenter is what is wrong
                host = hosts.resolve(vm.host)
            except ValueError:
                raise self.error(("vms", i, "host"), str(e)) from None
        if vm.vcenter is not None and host_vcenter[host] != vm.vcenter:
            raise self.error(("vms", i, "vcenter"), f"VM '{vm.name}' is in vCenter '{vm.vcenter}' but its host "
                                                    f"'{vm.host}' is in '{host_vcenter[host]}'")
        return host

    def _qualified_guests(self, vms: Names) -> "Guests | None":
        """`guests` with each guest's `vm` and the image's `builder` resolved (`qualified`)."""
        guests = self.guests
        if guests is None:
            return None
        named = [self._vm_named(vms, ("guests", "hosts", i, "vm"), g.vm, strict=True) for i, g in enumerate(guests.hosts)]
        hosts = [g if vm == g.vm else g.model_copy(update={"vm": vm}) for g, vm in zip(guests.hosts, named)]
        image = guests.image
        if image is not None and image.builder is not None:
            builder = self._vm_named(vms, ("guests", "image", "builder"), image.builder)
            image = image if builder == image.builder else image.model_copy(update={"builder": builder})
        if [g.vm for g in hosts] == [g.vm for g in guests.hosts] and image is guests.image:
            return guests
        return guests.model_copy(update={"hosts": hosts, "image": image})

    def _qualified_benchmarks(self, vms: Names) -> "BenchmarkSpec | None":
        """`benchmarks` with the VMs it names (launcher, a run's groups, a setup's VMs and guests)
        resolved (`qualified`); itself when none needs it."""
        spec = self.benchmarks
        if spec is None:
            return None
        loc: tuple[str | int, ...] = ("benchmarks",)
        launcher = spec.launcher and self._vm_named(vms, loc + ("launcher",), spec.launcher)
        runs = [run if run.groups is None else run.model_copy(update={"groups": [
            [self._vm_named(vms, loc + ("runs", i, "groups", j, k), vm) for k, vm in enumerate(group)]
            for j, group in enumerate(run.groups)]}) for i, run in enumerate(spec.runs)]
        setups = [setup.model_copy(update={
            "vms": [self._named_in(vms, loc + ("setups", i, "vms", j), item, "name") for j, item in enumerate(setup.vms)],
            "guests": [self._named_in(vms, loc + ("setups", i, "guests", j), item, "vm")
                       for j, item in enumerate(setup.guests)]}) for i, setup in enumerate(spec.setups)]
        if launcher == spec.launcher and [r.groups for r in runs] == [r.groups for r in spec.runs] and \
                [(s.vms, s.guests) for s in setups] == [(s.vms, s.guests) for s in spec.setups]:
            return spec
        return spec.model_copy(update={"launcher": launcher, "runs": runs, "setups": setups})

    def _named_in(self, vms: Names, loc: tuple[str | int, ...], item: Any, key: str) -> Any:
        """A setup's VM or guest entry with its `key` (the VM) resolved."""
        if not isinstance(item, dict) or not isinstance(item.get(key), str):
            return item
        return {**item, key: self._vm_named(vms, loc + (key,), item[key])}

    def _vm_named(self, vms: Names, loc: tuple[str | int, ...], reference: str, strict: bool = False) -> str:
        """The name gpuvm gives the VM `reference` names. Not `strict`: a bare name no VM has is left as
        it is (the check of that field says what it must name)."""
        if not strict and "/" not in reference and not vms.choices(reference):
            return reference
        try:
            return vms.resolve(reference)
        except ValueError as e:
            raise self.error(loc, str(e)) from None

    def _check_vcenters(self) -> None:
        """`vcenter` or `vcenters`; names unique; every host and VM names a declared vCenter (with
        several). Host and VM names are unique per vCenter (`qualified`)."""
        if not self.vcenters:
            for loc, item in [*((("hosts", i), h) for i, h in enumerate(self.hosts)),
                              *((("vms", i), v) for i, v in enumerate(self.vms))]:
                if item.vcenter not in (None, DEFAULT_VCENTER):
                    raise self.error(loc + ("vcenter",), f"vCenter '{item.vcenter}' is not declared (the runbook "
                                     "gives one vcenter; name several under vcenters)")
            return
        if "vcenter" in self.model_fields_set:
            raise self.error(("vcenter",), "give vcenter (one) or vcenters (several), not both")
        names: dict[str, int] = {}
        addresses: dict[str, int] = {}  # no url: GOVC_URL's
        for i, vc in enumerate(self.vcenters):
            if vc.name in names:
                raise self.error(("vcenters", i, "name"), f"vCenter '{vc.name}' is declared twice "
                                 f"(also vcenters[{names[vc.name]}])")
            names[vc.name] = i
            address = vcenter_address(vc.url) if vc.url else "GOVC_URL"
            if (first := addresses.setdefault(address, i)) != i:
                raise self.error(("vcenters", i, "url"), f"vCenter '{vc.name}' is vCenter "
                                 f"'{self.vcenters[first].name}' again (vcenters[{first}]: {address}): "
                                 "declare each vCenter once")
        declared = listed(names)
        for i, host in enumerate(self.hosts):
            if host.vcenter is None and len(names) > 1:
                raise self.error(("hosts", i, "vcenter"), f"host '{host.name}' names no vCenter (one of: {declared})")
            if host.vcenter is not None and host.vcenter not in names:
                raise self.error(("hosts", i, "vcenter"), f"vCenter '{host.vcenter}' is not in vcenters "
                                 f"(declared: {declared})")
        for i, vm in enumerate(self.vms):
            if vm.vcenter is not None and vm.vcenter not in names:
                raise self.error(("vms", i, "vcenter"), f"vCenter '{vm.vcenter}' is not in vcenters (declared: {declared})")

    def _check_guests(self, vms: dict[str, int]) -> None:
        if self.guests is None:
            return
        seen: dict[str, int] = {}
        for i, guest in enumerate(self.guests.hosts):
            loc = ("guests", "hosts", i, "vm")
            if guest.vm not in vms:
                raise self.error(loc, f"VM '{guest.vm}' is not in vms (declared: {listed(vms) or 'none'})")
            if self.vms[vms[guest.vm]].state == "absent":
                raise self.error(loc, f"VM '{guest.vm}' is marked state: absent; a guest in it cannot be configured")
            if guest.vm in seen:
                raise self.error(loc, f"guest for VM '{guest.vm}' is declared twice (also guests.hosts[{seen[guest.vm]}])")
            seen[guest.vm] = i
        guest_drivers.check(self)
        image = self.guests.image
        if image and image.builder and image.builder not in seen:
            raise self.error(("guests", "image", "builder"), f"'{image.builder}' is not a guest (guests: {listed(seen)})")
