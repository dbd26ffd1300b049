"""Which NVIDIA driver each guest gets, and whether it can run there.

A guest's own `guests.hosts[i].driver` (a driver, or `none`) comes first; then `guests.driver`:
one driver for every guest, or a list of one driver per kind, where each guest gets the kind its
VM's GPUs need (vGPU: `kind: vgpu`; passthrough and dynamic DirectPath: `kind: datacenter`) and a
guest whose VM has no GPUs gets none. The chosen driver must suit the VM: NVIDIA's vGPU guest driver
for a vGPU VM, compatible with the vGPU manager the runbook gives its host (vgpu_compat.py; a
manager the runbook does not give is read on the host, esxi.vgpu_manager); the data-center driver
for a passthrough VM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuvm.vgpu_compat import incompatibility

if TYPE_CHECKING:
    from gpuvm.runbook.guests import Guest, NvidiaDriver
    from gpuvm.runbook.hosts import Host
    from gpuvm.runbook.model import Runbook
    from gpuvm.runbook.vms import Vm

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Chosen:
    driver: "NvidiaDriver"
    where: Loc  # the runbook field that gives it: ("guests", "driver") or ("guests", "hosts", 2, "driver")


def needed_kind(vm: "Vm | None") -> str | None:
    """The driver kind a VM's GPUs need; None: the runbook gives it no GPUs."""
    if vm is None or vm.gpus is None:
        return None
    return "vgpu" if vm.gpus.mode == "vgpu" else "datacenter"


def chosen(runbook: "Runbook", i: int, guest: "Guest") -> Chosen | None:
    """The driver guests.hosts[i] gets (module docstring); None: none."""
    if guest.driver == "none":
        return None
    if guest.driver is not None:
        return Chosen(guest.driver, ("guests", "hosts", i, "driver"))
    wide = runbook.guests.driver if runbook.guests else None
    if wide is None:
        return None
    if not isinstance(wide, list):
        return Chosen(wide, ("guests", "driver"))
    kind = needed_kind(runbook.vm(guest.vm))
    return next((Chosen(d, ("guests", "driver", j)) for j, d in enumerate(wide) if d.kind == kind), None)


def check(runbook: "Runbook") -> None:
    """Every guest's driver suits its VM (the runbook's error, at the field that chose it)."""
    guests = runbook.guests
    if guests is None:
        return
    if isinstance(guests.driver, list):
        kinds: dict[str, int] = {}
        for j, driver in enumerate(guests.driver):
            if driver.kind in kinds:
                raise runbook.error(("guests", "driver", j, "kind"), f"a second {driver.kind} driver (also "
                                    f"guests.driver[{kinds[driver.kind]}]): give one driver per kind, and a guest's "
                                    "own under guests.hosts[].driver")
            kinds[driver.kind] = j
    for i, guest in enumerate(guests.hosts):
        vm = runbook.vm(guest.vm)
        pick = chosen(runbook, i, guest)
        if pick is None:
            kind = needed_kind(vm)
            if isinstance(guests.driver, list) and kind is not None and guest.driver is None:
                raise runbook.error(("guests", "driver"), f"VM '{guest.vm}' has {_gpus(vm)}: guests.driver lists "
                                    f"no kind: {kind} driver for it (add one, or give the guest driver: none)")
            continue
        if vm is not None and (why := problem(pick.driver, vm, runbook.host(vm.host))):
            raise runbook.error(pick.where + (why[0],), why[1])


def _gpus(vm: "Vm | None") -> str:
    gpus = vm.gpus if vm else None
    return f"vGPU {gpus.profile}" if gpus is not None and gpus.mode == "vgpu" else \
        f"GPUs in passthrough ({gpus.mode if gpus else 'none'})"


def problem(driver: "NvidiaDriver", vm: "Vm", host: "Host | None") -> tuple[str, str] | None:
    """The field and why `driver` cannot run in `vm` on `host` (None: it can)."""
    where = f"VM '{vm.name}' on host {vm.host}"
    kind = needed_kind(vm)
    if kind == "vgpu":
        if driver.kind != "vgpu":
            return "kind", (f"{where} has {_gpus(vm)}: it needs NVIDIA's vGPU guest driver (kind: vgpu), "
                            f"not the data-center driver {driver.version}")
        manager = host.nvidia_host_driver if host else None
        if manager is None:
            return None  # read on the host where its ESXi shell is given (esxi.vgpu_manager)
        if manager.state == "absent":
            return "version", f"{where} has {_gpus(vm)} but the host's vGPU manager is to be removed (state: absent)"
        if why := incompatibility(manager.version, driver.version):
            return "version", f"{where}: {why}"
        return None
    if kind == "datacenter" and driver.kind == "vgpu":
        return "kind", (f"{where} has {_gpus(vm)}: it needs NVIDIA's data-center driver "
                        f"(kind: datacenter), not the vGPU guest driver {driver.version}")
    return None
