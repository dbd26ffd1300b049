"""A campaign's setups (`benchmarks.setups`), each built into a runbook of its own.

A setup lists the VMs that take part, each by name with the fields that differ from its `vms`
entry (`{name: vm1, gpus: {mode: passthrough, count: 1}}`; a field given replaces the runbook's,
`gpus: null` removes them), and guest fields that differ (`{vm: vm1, slots: 1}`). Every other VM
of the runbook is *parked* for the setup: powered off with no GPUs and no NICs, so its devices
are free for the VMs that take part (the capacity check counts devices held by any VM, running
or not, as taken), and its guest is left out. Each setup thus names its whole layout, so setups
apply in any order: 1 → 2 → 3, and back from 3 to 1.

The built runbook has the setup's runs only and no setups; it is checked like any runbook, so an
error names the line in the file and the setup.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from gpuvm.errors import InputError, listed
from gpuvm.names import vsphere_name
from gpuvm.runbook.benchmarks import Setup
from gpuvm.runbook.document import document_path, validation_message
from gpuvm.runbook.guests import Guest, Guests
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.vms import Vm

PARKED = {"power": "off", "gpus": None, "nics": []}


def select_setup(book: Runbook, setup: str | None) -> Runbook:
    """The runbook laid out as its setup `setup` (`plan/apply/verify --setup NAME`); None: as is."""
    if setup is None:
        return book
    names = [s.name for s in book.benchmarks.setups] if book.benchmarks else []
    if setup not in names:
        raise InputError(f"--setup {setup}: no such setup in {book.file} (setups: {listed(names) or 'none'})")
    return setup_runbook(book, names.index(setup))


def setup_runbooks(runbook: Runbook) -> list[tuple[Setup, Runbook]]:
    """Every setup of the runbook's campaign with its runbook, in campaign order (checked)."""
    spec = runbook.benchmarks
    return [(setup, setup_runbook(runbook, i)) for i, setup in enumerate(spec.setups if spec else [])]


def setup_runbook(runbook: Runbook, index: int) -> Runbook:
    """The runbook of setup `index`: its VMs and guests overlaid, the others parked, its runs."""
    spec = runbook.benchmarks
    assert spec is not None
    setup = spec.setups[index]
    loc = ("benchmarks", "setups", index)
    vms = _vms(runbook, setup, loc)
    taking_part = {vm.name for vm in vms if vm.power == "on"}
    runs = [run for run in spec.runs if run.setups is None or setup.name in run.setups]
    if not runs:
        raise runbook.error(loc + ("name",), f"no benchmark runs in setup '{setup.name}' "
                                             "(a run's `setups` names those it runs in; left out: all)")
    guests = None
    if runbook.guests is not None or setup.guests:
        base = runbook.guests or _no_guests()
        hosts = _guests(runbook, setup, loc, taking_part)
        guests = base.model_copy(update={"hosts": hosts})
    built = runbook.model_copy(update={
        "vms": vms, "guests": guests, "benchmarks": spec.model_copy(update={"runs": runs, "setups": []})})
    try:
        built.check_references()
    except InputError as e:
        raise InputError(f"{e} (in setup '{setup.name}')") from None
    return built


def _vms(runbook: Runbook, setup: Setup, loc: tuple) -> list[Vm]:
    base = {vm.name: vm for vm in runbook.vms}
    overlays: dict[str, Vm] = {}
    for j, overlay in enumerate(setup.vms):
        name = overlay["name"]
        if name not in base:
            raise runbook.error(loc + ("vms", j, "name"), f"VM '{name}' is not in vms "
                                                          f"(declared: {listed(base) or 'none'})")
        if name in overlays:
            raise runbook.error(loc + ("vms", j, "name"), f"VM '{name}' is listed twice in setup '{setup.name}'")
        data = _merged(base[name], overlay) | {"name": vsphere_name(name)}  # east/vm1 (gpuvm's name) is vm1
        overlays[name] = _validated(runbook, Vm, data, loc + ("vms", j), overlay).model_copy(update={"name": name})
    return [overlays.get(vm.name) or vm.model_copy(update=PARKED) for vm in runbook.vms]


def _guests(runbook: Runbook, setup: Setup, loc: tuple, taking_part: set[str]) -> list[Guest]:
    base = {g.vm: g for g in (runbook.guests.hosts if runbook.guests else [])}
    overlays: dict[str, Guest] = {}
    for j, overlay in enumerate(setup.guests):
        name = overlay["vm"]
        if name not in taking_part:
            raise runbook.error(loc + ("guests", j, "vm"),
                                f"VM '{name}' is not powered on in setup '{setup.name}' "
                                f"(its VMs: {listed(sorted(taking_part)) or 'none'})")
        if name in overlays:
            raise runbook.error(loc + ("guests", j, "vm"), f"guest '{name}' is listed twice in setup '{setup.name}'")
        data = _merged(base[name], overlay) if name in base else dict(overlay)
        overlays[name] = _validated(runbook, Guest, data, loc + ("guests", j), overlay)
    kept = [overlays.pop(g.vm, g) for g in base.values() if g.vm in taking_part]
    return kept + list(overlays.values())  # guests the runbook did not declare come last


def _merged(base: BaseModel, overlay: dict[str, Any]) -> dict[str, Any]:
    return {**base.model_dump(exclude_unset=True), **overlay}


def _validated(runbook: Runbook, model: type[BaseModel], data: dict[str, Any], loc: tuple, overlay: dict) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        path = document_path(first["loc"], overlay, first["type"])
        raise runbook.error(loc + path, validation_message(first)) from None


def _no_guests() -> Guests:
    return Guests()
