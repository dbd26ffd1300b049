"""`gpuvm init`: a starter runbook written from what one inventory read finds.

It describes the world as it is, so that its first plan changes nothing: every host with the GPUs
and ConnectX NICs it has (address, model, PCI id, NUMA node, passthrough state) as comments, the
devices already enabled for passthrough as entries; every VM with its CPUs, memory, firmware,
power state and the GPUs and NICs it has. The user then edits it to what they want.
"""

from __future__ import annotations

import json
from collections import Counter

from gpuvm.pci import pci_id
from gpuvm.vsphere.facts import HostFacts, Inventory, VmFacts

def _q(value: object) -> str:
    """A YAML scalar: JSON's quoting is valid YAML."""
    return json.dumps(value)


def _host_lines(host: HostFacts) -> list[str]:
    devices = [d for d in host.pci if d.is_gpu or d.is_mellanox]
    lines = [f"  - name: {_q(host.name)}"]
    if devices:
        lines.append("    # GPUs and NICs found (address, model, PCI id, NUMA node, passthrough now):")
        lines += [f"    #   {d.id}  {d.device_name}  {d.pci_id}  NUMA {'?' if d.numa_node is None else d.numa_node}"
                  f"  {d.passthru_state}" for d in devices]
    enabled = [d for d in devices if d.passthru_enabled]
    capable = [d for d in devices if d.passthru_capable and not d.passthru_enabled]
    lines.append("    passthrough:" + ("" if enabled else " []") + "   # enable more by address, model or id:")
    lines += [f"      - address: {_q(d.id)}   # {d.device_name}, NUMA {d.numa_node}, enabled" for d in enabled]
    lines += [f"      # - address: {_q(d.id)}   # {d.device_name}, NUMA {d.numa_node}" for d in capable]
    if host.graphics.default_type == "sharedDirect":
        lines.append("    graphics: shared_direct   # Shared Direct, as NVIDIA vGPU needs")
    else:
        lines.append("    # graphics: shared_direct   # for NVIDIA vGPU")
    lines += ["    allow_maintenance: false   # true (both) lets apply enter maintenance mode and reboot the host",
              "    allow_reboot: false",
              "    # ssh: {address: ..., user: root, key_file: ...}   # the ESXi shell, for ats: and mig:"]
    return lines


def _gpus(vm: VmFacts, inventory: Inventory) -> tuple[str | None, list[str]]:
    """The VM's `gpus:` value, and its NICs' addresses."""
    host = inventory.hosts.get(vm.host or "")
    classic, nics, dynamic, vgpus = [], [], Counter(), Counter()
    for device in vm.pci:
        found = host.device(device.address) if host and device.address else None
        if device.kind == "classic" and found is not None and found.is_mellanox:
            nics.append(device.address)
        elif device.kind == "classic":
            classic.append(device.address)
        elif device.kind == "dynamic":
            dynamic[pci_id(device.vendor_id or 0, device.device_id or 0)] += 1
        else:
            vgpus[device.profile] += 1
    if classic:
        gpus = f"{{mode: passthrough, count: {len(classic)}, addresses: [{', '.join(_q(a) for a in classic)}]}}"
    elif dynamic:
        [(ident, count)] = dynamic.most_common(1)
        gpus = f"{{mode: dynamic, count: {count}, id: {_q(ident)}}}"
    elif vgpus:
        [(profile, count)] = vgpus.most_common(1)
        gpus = f"{{mode: vgpu, profile: {_q(profile)}, count: {count}}}"
    else:
        gpus = None
    return gpus, nics


def _vm_lines(vm: VmFacts, inventory: Inventory) -> list[str]:
    gpus, nics = _gpus(vm, inventory)
    lines = [f"  - name: {_q(vm.name)}",
             f"    host: {_q(vm.host)}",
             f"    cpus: {vm.cpus}",
             f"    memory_gb: {max(1, vm.memory_mb // 1024)}   # fully reserved once the VM has passthrough devices",
             f"    firmware: {vm.firmware}   # GPU passthrough needs efi",
             f"    power: {'on' if vm.powered_on else 'off'}"]
    lines.append(f"    gpus: {gpus}" if gpus else
                 "    # gpus: {mode: passthrough, count: 1}   # or {mode: dynamic, count: 1} or {mode: vgpu, profile: ...}")
    if nics:
        lines.append(f"    nics: [{', '.join('{address: ' + _q(a) + '}' for a in nics)}]")
    extra = vm.extra_config
    if vm.pci and extra.get("pciPassthru.allowP2P", "").lower() != "true":
        lines.append("    p2p: false   # true: pciPassthru.allowP2P and RelaxACSforP2P")
    if (mmio := extra.get("pciPassthru.64bitMMIOSizeGB", "")).isdigit():
        lines.append(f"    mmio: {mmio}   # 64-bit MMIO GB; auto: a power of two >= 2x the GPUs' memory")
    if (node := extra.get("numa.nodeAffinity", "")).isdigit():
        lines.append(f"    numa_node: {node}")
    if vm.pci and len({d.kind for d in vm.pci if not (d.kind == 'classic' and d.address in nics)}) > 1:
        lines.append("    # it has GPUs of several kinds; a runbook VM takes one kind: "
                     + ", ".join(d.describe() for d in vm.pci))
    return lines


def starter_runbook(inventory: Inventory, url: str, user: str) -> str:
    """The runbook's text (YAML with comments)."""
    lines = [f"# Starter runbook written by `gpuvm init` from {url} ({inventory.taken:%Y-%m-%d %H:%M} UTC).",
             "# It describes the hosts and VMs as they are: `gpuvm plan` on it changes nothing.",
             "# Edit it to what you want (every field: docs/runbook.md), then `gpuvm validate` and `gpuvm plan`.",
             "vcenter:",
             f"  url: {_q(url)}",
             f"  user: {_q(user)}",
             "  # password_env: VCENTER_PASSWORD   # the variable holding the password (else GOVC_PASSWORD)",
             "",
             "hosts:" + ("" if inventory.hosts else " []")]
    for host in inventory.hosts.values():
        lines += _host_lines(host)
    lines += ["", "vms:" + ("" if inventory.vms else " []")]
    for vm in inventory.vms.values():
        lines += _vm_lines(vm, inventory)
    lines += ["",
              "# guests:    # the guest OSes over SSH (ConnectX ports, MIG, the training image, the SSH mesh)",
              "#   hosts:",
              "#     - {vm: NAME, ssh: {address: ..., user: ..., key_file: ...}}"]
    return "\n".join(lines) + "\n"
