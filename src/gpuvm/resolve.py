"""From runbook + inventory to the concrete desired state, checked against what exists.

Everything a plan needs to know about the runbook is decided here, once: which PCI devices each
host passes through, which GPU each VM gets (keeping NUMA nodes and NVLink pairs: `topology.py`),
how large its MMIO window is. Errors name the runbook file, line and field; warnings become plan
notes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpuvm.capacity import check_capacity
from gpuvm.clone_network import clone_network
from gpuvm.cloud_init import guestinfo, public_key_problem, read_public_key
from gpuvm.pci import NVLINK_PAIRED, mmio_size_gb, next_power_of_two, pci_id
from gpuvm.desired import Clone, Desired, DesiredDevice, DesiredHost, DesiredVm, Nvlink
from gpuvm.errors import InputError, listed
from gpuvm.names import vsphere_name
from gpuvm.nvswitch import check_nvswitch
from gpuvm.plan import Note
from gpuvm.topology import (Problem, best_set, dynamic_problems, gpu_problems, host_nvlink, nic_problems,
                            numa_nodes)
from gpuvm.runbook.hosts import Host
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.vms import DynamicGpus, PassthroughGpus, VgpuGpus, Vm
from gpuvm.vsphere.facts import DatastoreFacts, HostFacts, Inventory, PciDevice, VmFacts, VmPciDevice

GRAPHICS_TYPES = {"shared": "shared", "shared_direct": "sharedDirect"}
MANAGED_PREFIXES = ("pciPassthru.", "numa.nodeAffinity")


def _select(rb: Runbook, index: int, host: Host, facts: HostFacts) -> list[str]:
    chosen: dict[str, None] = {}  # in order, each once (a host may list thousands of devices)
    for j, selector in enumerate(host.passthrough):
        loc = ("hosts", index, "passthrough", j)
        if selector.address:
            matches = [d for d in facts.pci if d.id == selector.address]
        elif selector.id:
            matches = [d for d in facts.pci if d.pci_id == selector.id]
        else:
            needle = (selector.model or "").lower()
            matches = [d for d in facts.pci if needle in d.device_name.lower() and d.passthru_capable]
        if not matches:
            raise rb.error(loc, f"no PCI device on host {host.name} matches '{selector.describe()}' "
                                f"(devices: {_device_summary(facts)})")
        for device in matches:
            if not device.passthru_capable:
                raise rb.error(loc, f"device {device.id} ({device.device_name}) on {host.name} "
                                    "is not passthrough capable")
            chosen.setdefault(device.id)
    return list(chosen)


def _device_summary(facts: HostFacts) -> str:
    capable = [f"{d.id} {d.device_name} [{d.pci_id}]" for d in facts.pci if d.passthru_capable]
    return "; ".join(capable) or "none passthrough capable"


def _passthrough_ok(rb: Runbook, loc: tuple, device: PciDevice, host: DesiredHost, facts: HostFacts) -> None:
    if device.id not in host.passthrough and not device.passthru_enabled:
        i = next(i for i, h in enumerate(rb.hosts) if h.name == facts.name)
        raise rb.error(loc, f"device {device.id} is not enabled for passthrough on {facts.name}; "
                            f"select it in hosts[{i}].passthrough")


class _GpuPool:
    """Hands out a host's passthrough GPUs to VMs in runbook order, keeping what VMs already have."""

    def __init__(self, rb: Runbook, inventory: Inventory):
        self.rb = rb
        self.inventory = inventory
        self.taken: dict[tuple[str, str], str] = {}  # (host, address) → VM
        self.attached: dict[tuple[str, str], str] = {}  # what VMs of the runbook have now: left to them if possible
        managed = {vm.name for vm in rb.vms}
        for vm in inventory.vms.values():  # devices of VMs the runbook does not manage are taken
            for dev in vm.pci:
                if dev.kind == "classic" and vm.host and dev.address:
                    owners = self.attached if vm.name in managed else self.taken
                    owners[(vm.host, dev.address)] = vm.name
        for vm in rb.vms:  # explicit addresses and NICs are claimed first
            for address in [] if vm.state == "absent" else _explicit(vm):
                self.taken.setdefault((vm.host, address), vm.name)

    def claim(self, vm: Vm, spec: PassthroughGpus, facts: HostFacts, current: VmFacts | None,
              nvlink: Nvlink) -> list[PciDevice]:
        """The best set (`topology.best_set`) of the GPUs free for the VM; it keeps what it has, and
        leaves what other VMs of the runbook have, where that costs no topology rule."""
        if spec.addresses:
            return [facts.device(a) for a in spec.addresses]  # type: ignore[misc]
        gpus = [d for d in facts.gpus if d.passthru_capable]
        mine = [d for d in gpus if current and any(p.kind == "classic" and p.address == d.id for p in current.pci)
                and self.taken.get((facts.name, d.id), vm.name) == vm.name]
        free = [d for d in gpus if (facts.name, d.id) not in self.taken and d not in mine]

        def cost(d: PciDevice) -> int:
            return 0 if d in mine else 2 if self.attached.get((facts.name, d.id), vm.name) != vm.name else 1

        chosen = sorted(best_set(mine + free, spec.count, vm.numa_node, nvlink, cost), key=lambda d: d.id)
        for device in chosen:
            self.taken[(facts.name, device.id)] = vm.name
        return chosen


def _explicit(vm: Vm) -> list[str]:
    addresses = [n.address for n in vm.nics]
    if isinstance(vm.gpus, PassthroughGpus) and vm.gpus.addresses:
        addresses += vm.gpus.addresses
    return addresses


def resolve(rb: Runbook, inventory: Inventory, nvlink: Mapping[str, Nvlink] | None = None) -> Desired:
    """`nvlink`: the NVLink pairs read from ESXi shells, by host (for hosts that declare none)."""
    desired = Desired()
    clones = _add_clones(rb, inventory)
    for i, host in enumerate(rb.hosts):
        facts = inventory.hosts.get(host.name)
        if facts is None:
            raise rb.error(("hosts", i, "name"), f"host '{host.name}' not found in vCenter "
                                                 f"(found: {listed(sorted(inventory.hosts)) or 'none'})")
        if facts.connection_state != "connected":
            raise rb.error(("hosts", i, "name"), f"host '{host.name}' is {facts.connection_state} in vCenter")
        desired.hosts[host.name] = DesiredHost(
            name=host.name, passthrough=_select(rb, i, host, facts),
            graphics=GRAPHICS_TYPES[host.graphics] if host.graphics else None,
            allow_reboot=host.allow_reboot and host.allow_maintenance,
            nvlink=host_nvlink(rb, i, facts, nvlink or {}),
        )
    check_nvswitch(rb, inventory, desired, nvlink or {})
    pool = _GpuPool(rb, inventory)
    memory_by_host: dict[str, int] = {}
    for i, vm in enumerate(rb.vms):
        if vm.state == "absent":
            desired.vms[vm.name] = DesiredVm(vm.name, vm.host, None, None, vm.firmware, False, [], {}, "off",
                                             state="absent")
            continue
        desired.vms[vm.name] = _resolve_vm(rb, i, vm, inventory, desired, pool)
        desired.vms[vm.name].clone = clones.get(vm.name)
        if vm.host in desired.hosts:
            desired.hosts[vm.host].vms.append(vm.name)
        if vm.memory_gb:
            memory_by_host[vm.host] = memory_by_host.get(vm.host, 0) + vm.memory_gb * 1024
            host_mb = inventory.hosts[vm.host].memory_mb
            if memory_by_host[vm.host] > host_mb:
                raise rb.error(("vms", i, "memory_gb"),
                               f"reserving {vm.memory_gb} GB does not fit: VMs on {vm.host} would reserve "
                               f"{memory_by_host[vm.host] // 1024} GB of its {host_mb // 1024} GB")
    unseen, elsewhere = _unseen(inventory), _Users.outside(inventory, desired)
    for host in desired.hosts.values():
        _release_unused(inventory, desired, host, elsewhere, unseen)
        _drop_named_candidates(inventory, desired, host)
    check_capacity(rb, inventory, desired)
    return desired


def _add_clones(rb: Runbook, inventory: Inventory) -> dict[str, Clone]:
    """The VMs to create (missing, with a template): each goes into `inventory` as it will be
    once cloned (the template's facts on the VM's host, powered off, `clone_of` set, no moid yet),
    so that the VM steps plan its hardware, devices and power-on like any VM's, and capacity
    counts it."""
    clones = {}
    taken: dict[str, _Taken] = {}  # datastore → the clones planned onto it
    for i, vm in enumerate(rb.vms):
        if vm.state == "absent" or vm.name in inventory.vms or vm.template is None:
            continue
        template = inventory.templates.get(vm.template) or inventory.vms.get(vm.template)
        if template is None:
            known = ", ".join(sorted(inventory.templates)) or "none"
            raise rb.error(("vms", i, "template"), f"template '{vm.template}' for VM '{vm.name}' not found in "
                                                   f"vCenter (templates: {known})")
        datastore = vm.datastore or (template.datastores[0] if template.datastores else None)
        if datastore not in inventory.datastores:
            known = ", ".join(sorted(inventory.datastores)) or "none"
            raise rb.error(("vms", i, "datastore"), f"datastore '{datastore}' not found in vCenter "
                                                    f"(datastores: {known})")
        _check_space(rb, i, vm, template, inventory.datastores[datastore], taken.setdefault(datastore, _Taken()))
        info = _guestinfo(rb, i, vm) if vm.cloud_init else {}
        clones[vm.name] = Clone(vm.template, datastore, tuple(info.items()), vm.folder, _folder(rb, i, vm, inventory),
                                vm.resource_pool, _pool(rb, i, vm, inventory),
                                clone_network(rb, i, vm, template, inventory))
        inventory.vms[vm.name] = template.model_copy(update={
            "name": vm.name, "moid": "", "host": vm.host, "power_state": "poweredOff", "datastores": [datastore],
            "clone_of": vm.template, "extra_config": template.extra_config | info})
    return clones


def _folder(rb: Runbook, i: int, vm: Vm, inventory: Inventory) -> str:
    """The moid of the runbook's VM folder; "" for the template's."""
    if vm.folder is None:
        return ""
    moids = inventory.folders.get(vm.folder, [])
    if len(moids) != 1:
        known = ", ".join(sorted(inventory.folders)) or "none"
        why = f"is not one VM folder but {len(moids)}" if moids else f"not found in vCenter (VM folders: {known})"
        raise rb.error(("vms", i, "folder"), f"VM folder '{vm.folder}' for VM '{vm.name}' {why}")
    return moids[0]


def _pool(rb: Runbook, i: int, vm: Vm, inventory: Inventory) -> str:
    """The moid of the runbook's resource pool, one of the VM's host's cluster; "" for its root pool."""
    if vm.resource_pool is None:
        return ""
    cluster = inventory.hosts[vm.host].compute_resource
    mine = [moid for moid, owner in inventory.pools.get(vm.resource_pool, []) if owner == cluster]
    if len(mine) != 1:
        known = ", ".join(sorted(n for n, pools in inventory.pools.items() if any(o == cluster for _, o in pools))) or "none"
        why = f"names {len(mine)} pools" if mine else "is not a pool"
        raise rb.error(("vms", i, "resource_pool"), f"VM {vm.name}: resource pool '{vm.resource_pool}' {why} of "
                                                    f"{vm.host}'s cluster (its pools: {known})")
    return mine[0]


class _Taken:
    """The clones planned onto one datastore and the GB they take together (a running total, not
    summed again per clone)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.gb = 0


def _check_space(rb: Runbook, i: int, vm: Vm, template: VmFacts, datastore: DatastoreFacts, taken: _Taken) -> None:
    """A clone takes what its template's files take (summary.storage.committed); the clones planned
    onto one datastore fit its free space together, or the plan stops before anything is cloned."""
    need = template.disk_gb
    if not need:
        return  # a template vCenter reports no size for: vSphere decides (NoDiskSpace)
    before = taken.gb
    if before + need > datastore.free_gb:
        others = f" ({before} GB of it go to the clones of {', '.join(taken.names)})" if taken.names else ""
        raise rb.error(("vms", i, "datastore" if vm.datastore else "template"),
                       f"VM {vm.name}: its clone of {vm.template} needs {need} GB on datastore {datastore.name}, which "
                       f"has {datastore.free_gb} GB free{others}")
    taken.names.append(vm.name)
    taken.gb += need


def _guestinfo(rb: Runbook, i: int, vm: Vm) -> dict[str, str]:
    ci = vm.cloud_init
    assert ci is not None
    path = ci.ssh_public_key_file if ci.ssh_public_key_file.is_absolute() else rb.file.parent / ci.ssh_public_key_file
    loc = ("vms", i, "cloud_init", "ssh_public_key_file")
    try:
        key = read_public_key(path)
    except InputError as e:
        raise rb.error(loc, str(e)) from None
    if problem := public_key_problem(key):
        raise rb.error(loc, f"{path} {problem}")
    return guestinfo(vsphere_name(vm.name), ci, key)  # the hostname defaults to its name in vCenter


def _devices_on(inventory: Inventory, desired: Desired, host: DesiredHost) -> list[DesiredDevice | VmPciDevice]:
    """The host's passthrough devices as they will be: those of VMs the runbook does not manage (as
    they are), and those the runbook gives its VMs there."""
    others = [vm for vm in inventory.vms_on(host.name) if vm.name not in desired.vms]
    return [d for vm in others for d in vm.pci] + [d for name in host.vms for d in desired.vms[name].devices]


def _release_unused(inventory: Inventory, desired: Desired, host: DesiredHost, elsewhere: _Users, unseen: str) -> None:
    """Devices passed through that the runbook no longer selects and nothing may use: gpuvm turns
    passthrough off for those it turned on (its `gpuvm.owned` record on the host: freeing GPUs for
    vGPU); the others are only noted. A device gpuvm turned on and now sees turned off (a reinstall
    reset it) is no longer its own (`host.forget`): turned on again by hand, it stays.
    "Used": by a VM or template outside the runbook (`elsewhere`, see `_Users`), or by a runbook VM
    on this host as the runbook wants it (one that has it now loses it in the same apply, before the
    host reboot that releases it has its VMs powered on again). `unseen`: why the account may not
    see every user (then nothing is released)."""
    facts = inventory.hosts[host.name]
    users = _Users(elsewhere.held.copy(), elsewhere.dynamic.copy())
    users.add([d for name in host.vms for d in desired.vms[name].devices])
    mine, released, selected = set(facts.owned.passthrough), set(facts.owned.released), set(host.passthrough)
    for device in facts.pci:
        if device.id in selected:
            continue
        if device.id in mine and not device.passthru_enabled:
            host.forget.append(device.id)  # turned off by someone else, or reset: no longer gpuvm's
        if users.use(device) or not (device.passthru_enabled or device.passthru_active):
            continue
        if (device.id in mine) if device.passthru_enabled else (device.id in released):
            if unseen:
                desired.notes.append(Note(host.name, "resolve", f"passthrough of {device.id} (enabled by gpuvm, "
                                          f"unused) is kept: {unseen}, so a VM this account cannot see may use it"))
            else:
                host.release.append(device.id)  # to turn off, or turned off and waiting for the reboot
        elif device.is_gpu and host.graphics == "sharedDirect":
            desired.notes.append(Note(host.name, "resolve", f"GPU {device.id} is passthrough-enabled, unused, "
                                      "and not selected in the runbook, but gpuvm did not enable it (no record "
                                      "in the host's gpuvm.owned attribute): it cannot serve vGPU until its "
                                      "passthrough is turned off"))


@dataclass
class _Users:
    """What passthrough devices may be used: classic DirectPath addresses, and the PCI ids dynamic
    DirectPath entries allow (any device of such a model may be picked). Built once from every VM
    and template in vCenter the runbook does not manage, on any host (a VM registered elsewhere, or
    a template's clone, may come to this host)."""

    held: set[str] = field(default_factory=set)
    dynamic: set[str] = field(default_factory=set)

    @classmethod
    def outside(cls, inventory: Inventory, desired: Desired) -> _Users:
        users = cls()
        for vm in [*(vm for vm in inventory.vms.values() if vm.name not in desired.vms), *inventory.templates.values()]:
            users.add(vm.pci)
        return users

    def add(self, devices: list[DesiredDevice] | list[VmPciDevice]) -> None:
        for d in devices:
            if d.kind == "classic" and d.address:
                self.held.add(d.address)
            elif d.kind == "dynamic":
                self.dynamic.update((pci_id(d.vendor_id or 0, d.device_id or 0), *getattr(d, "also_allowed", ())))

    def use(self, device: PciDevice) -> bool:
        return device.id in self.held or device.pci_id in self.dynamic


def _unseen(inventory: Inventory) -> str:
    """Why the inventory read may have missed some VM (the hosts list VMs the read did not return:
    the account lacks read permission on them); "" when it saw every one."""
    seen = {vm.moid for vm in inventory.vms.values()} | {t.moid for t in inventory.templates.values()}
    hidden = {name: sum(m not in seen for m in facts.vm_moids or []) for name, facts in inventory.hosts.items()}
    hidden = {name: count for name, count in hidden.items() if count}
    if not hidden:
        return ""
    where = ", ".join(f"{count} on {name}" for name, count in sorted(hidden.items()))
    return f"vCenter lists {sum(hidden.values())} VM(s) this account cannot read ({where})"


def _drop_named_candidates(inventory: Inventory, desired: Desired, host: DesiredHost) -> None:
    """A dynamic DirectPath VM cannot get a GPU that classic DirectPath names (vm.power starts
    those VMs first): not a candidate."""
    named = {d.address for d in _devices_on(inventory, desired, host) if d.kind == "classic"}
    for name in host.vms:
        vm = desired.vms[name]
        vm.devices = [replace(d, candidates=tuple(c for c in d.candidates if c not in named))
                      if d.kind == "dynamic" else d for d in vm.devices]


@dataclass
class _VmScope:
    """What resolving one VM needs: its runbook entry (and index), its host's facts and desired state."""

    rb: Runbook
    i: int
    vm: Vm
    facts: HostFacts
    host: DesiredHost
    desired: Desired

    def error(self, loc: tuple[str | int, ...], message: str) -> InputError:
        return self.rb.error(("vms", self.i) + loc, message)


@dataclass
class _Gpus:
    devices: list[DesiredDevice] = field(default_factory=list)
    memory_gb: list[int] = field(default_factory=list)  # per GPU, for the MMIO window
    extra: dict[str, str] = field(default_factory=dict)


def _resolve_vm(rb: Runbook, i: int, vm: Vm, inventory: Inventory, desired: Desired, pool: _GpuPool) -> DesiredVm:
    current = inventory.vms.get(vm.name)
    if current is None:
        raise rb.error(("vms", i, "name"), f"VM '{vm.name}' not found in vCenter: name a template to create "
                                           "it from (template: ...)")
    if current.host != vm.host:
        raise rb.error(("vms", i, "host"), f"VM '{vm.name}' runs on host {current.host}, not {vm.host} "
                                           "(gpuvm does not migrate VMs)")
    scope = _VmScope(rb, i, vm, inventory.hosts[vm.host], desired.hosts[vm.host], desired)
    gpus = vm.gpus
    if isinstance(gpus, PassthroughGpus):
        chosen = _classic_gpus(scope, gpus, pool, current)
    elif isinstance(gpus, DynamicGpus):
        chosen = _dynamic_gpus(scope, gpus)
    elif isinstance(gpus, VgpuGpus):
        chosen = _vgpus(scope, gpus)
    else:
        chosen = _Gpus()
    nics = _nics(scope)
    extra = chosen.extra | _gpu_settings(scope, chosen.memory_gb)
    if vm.numa_node is not None:
        extra["numa.nodeAffinity"] = str(vm.numa_node)
    return DesiredVm(
        name=vm.name, host=vm.host, cpus=vm.cpus, memory_mb=vm.memory_gb * 1024 if vm.memory_gb else None,
        firmware=vm.firmware, reservation_locked=vm.has_passthrough, devices=chosen.devices + nics,
        extra_config=extra, power=vm.power, system_uuid=scope.facts.system_uuid,
        hardware_version=vm.hardware_version,
    )


def _classic_gpus(s: _VmScope, gpus: PassthroughGpus, pool: _GpuPool, current: VmFacts) -> _Gpus:
    """Classic DirectPath: host GPUs by address, or handed out by the pool."""
    for j, address in enumerate(gpus.addresses or []):
        device = s.facts.device(address)
        if device is None or not device.is_gpu:
            raise s.error(("gpus", "addresses", j), f"no GPU at {address} on host {s.vm.host} "
                                                    f"(GPUs: {', '.join(d.id for d in s.facts.gpus)})")
    chosen = pool.claim(s.vm, gpus, s.facts, current, s.host.nvlink)
    if len(chosen) < gpus.count:
        users = sorted({v for (h, _), v in pool.taken.items() if h == s.vm.host and v != s.vm.name})
        raise s.error(("gpus", "count"),
                      f"needs {gpus.count} GPU(s) but host {s.vm.host} has {len(s.facts.gpus)}, "
                      f"{len(s.facts.gpus) - len(chosen)} already given to: {listed(users) or 'none'}")
    out = _Gpus()
    for device in chosen:
        _passthrough_ok(s.rb, ("vms", s.i, "gpus"), device, s.host, s.facts)
        out.devices.append(DesiredDevice("classic", address=device.id, vendor_id=device.vendor_id,
                                         device_id=device.device_id, label=device.device_name))
        out.memory_gb.append(s.facts.gpu_memory_gb(device) or 0)
    _warn_topology(s, chosen, gpu_problems(chosen, gpus.count, s.vm.numa_node, s.host.nvlink))
    return out


def _dynamic_gpus(s: _VmScope, gpus: DynamicGpus) -> _Gpus:
    """Dynamic DirectPath: any host GPU of one PCI id, chosen by vSphere at power-on; with the VM's
    `numa_node` (numa.nodeAffinity) one on that node (simulator/gpusim/vm.go says why)."""
    wanted = gpus.id or (s.facts.gpus[0].pci_id if s.facts.gpus else None)
    matching = [d for d in s.facts.gpus if d.pci_id == wanted]
    if not matching:
        raise s.error(("gpus", "id"), f"no GPU {wanted} on host {s.vm.host}")
    usable = [d for d in matching if d.id in s.host.passthrough or d.passthru_enabled]
    node = s.vm.numa_node
    there = [d for d in usable if node is None or d.numa_node == node]
    if len(there) < gpus.count:
        where = "" if node is None else f" on NUMA node {node} (numa_node)"
        raise s.error(("gpus", "count"), f"needs {gpus.count} GPU(s) {wanted}{where} but host {s.vm.host} "
                                         f"passes through {len(there)}{' there' if where else ''}"
                                         f"{': ' + ', '.join(d.id for d in there) if there else ''}")
    gpu = matching[0]
    out = _Gpus()
    for _ in range(gpus.count):
        out.devices.append(DesiredDevice("dynamic", vendor_id=gpu.vendor_id, device_id=gpu.device_id,
                                         label=gpu.device_name, candidates=tuple(d.id for d in there)))
        out.memory_gb.append(s.facts.gpu_memory_gb(gpu) or 0)
    _warn_topology(s, there, dynamic_problems(there, gpus.count, s.host.nvlink), gpus.count)
    return out


def _vgpus(s: _VmScope, gpus: VgpuGpus) -> _Gpus:
    """vGPU: a profile the host offers, in Shared Direct mode; NVLinked vGPUs turn unified memory off."""
    if gpus.profile not in s.facts.vgpu_profiles and not _manager_coming(s):
        offered = ", ".join(s.facts.vgpu_profiles[:12]) or ("none (is the NVIDIA vGPU manager installed? "
                                                            "hosts[].nvidia_host_driver installs it)")
        raise s.error(("gpus", "profile"), f"vGPU profile '{gpus.profile}' is not offered by host "
                                           f"{s.vm.host} (offered: {offered})")
    if (s.host.graphics or s.facts.graphics.default_type) != "sharedDirect":
        h = next(j for j, x in enumerate(s.rb.hosts) if x.name == s.vm.host)
        raise s.error(("gpus",), f"vGPU needs host {s.vm.host} in Shared Direct graphics mode: "
                                 f"set hosts[{h}].graphics: shared_direct")
    out = _Gpus()
    for n in range(gpus.count):
        out.devices.append(DesiredDevice("vgpu", profile=gpus.profile, label=f"vGPU {gpus.profile}"))
        if gpus.uses_nvlink:
            out.extra[f"pciPassthru{n}.cfg.enable_uvm"] = "0"
    return out


def _manager_coming(s: _VmScope) -> bool:
    """The host offers no vGPU type because no vGPU manager runs yet, and the runbook installs one
    (esxi.vgpu_manager; it runs after the host reboot that comes before the VM steps): the profile
    is then checked when the VM powers on, where vSphere refuses one the host does not offer."""
    host = s.rb.host(s.vm.host)
    driver = host.nvidia_host_driver if host else None
    return not s.facts.vgpu_profiles and driver is not None and driver.state == "present"


def _nics(s: _VmScope) -> list[DesiredDevice]:
    devices = []
    for j, nic in enumerate(s.vm.nics):
        device = s.facts.device(nic.address)
        if device is None or not device.passthru_capable:
            raise s.error(("nics", j, "address"), f"no passthrough-capable device at {nic.address} on "
                                                  f"{s.vm.host} ({_device_summary(s.facts)})")
        _passthrough_ok(s.rb, ("vms", s.i, "nics", j, "address"), device, s.host, s.facts)
        devices.append(DesiredDevice("classic", address=device.id, vendor_id=device.vendor_id,
                                     device_id=device.device_id, label=device.device_name))
    return devices


def _gpu_settings(s: _VmScope, gpu_memory: list[int]) -> dict[str, str]:
    """P2P and the 64-bit MMIO window for passed-through GPUs (they need EFI)."""
    if not gpu_memory:
        return {}
    extra = {}
    if s.vm.p2p:
        extra["pciPassthru.allowP2P"] = "true"
        extra["pciPassthru.RelaxACSforP2P"] = "true"
    needed = mmio_size_gb(gpu_memory)
    if isinstance(s.vm.mmio, int) and s.vm.mmio < next_power_of_two(sum(gpu_memory)):
        raise s.error(("mmio",), f"64-bit MMIO of {s.vm.mmio} GB is too small for {len(gpu_memory)} GPU(s) "
                                 f"with {sum(gpu_memory)} GB in all (use 'auto' → {needed})")
    extra["pciPassthru.use64bitMMIO"] = "TRUE"
    extra["pciPassthru.64bitMMIOSizeGB"] = str(s.vm.mmio if isinstance(s.vm.mmio, int) else needed)
    if s.vm.firmware != "efi":
        raise s.error(("firmware",), "GPU passthrough with large BARs needs firmware: efi")
    return extra


def _warn_topology(s: _VmScope, gpus: list[PciDevice], problems: list[Problem], count: int | None = None) -> None:
    """The VM's topology problems (and its NICs' against `gpus`): plan warnings, or with
    `topology: strict` an input error."""
    count = len(gpus) if count is None else count
    nics = [(j, d) for j, nic in enumerate(s.vm.nics) if (d := s.facts.device(nic.address)) is not None]
    for problem in problems + nic_problems(nics, numa_nodes(gpus)):
        if s.rb.strict_topology(s.vm):
            raise s.error(problem.loc, f"{problem.message} (refused by topology: strict)")
        s.desired.notes.append(Note(s.vm.name, "resolve", problem.message))
    if count > 2 and gpus and gpus[0].device_id in NVLINK_PAIRED:
        s.desired.notes.append(Note(s.vm.name, "resolve", f"{count} NVLinked {gpus[0].device_name} GPUs in one VM: "
                                    "NVLink bridges join pairs, traffic between pairs crosses PCIe"))
