"""The GPU model and count `gpuvm size` takes from a saved inventory (`gpuvm inventory RUNBOOK --save
FILE`, the snapshot `plan --snapshot` reads): the NVIDIA GPUs of its hosts, by model of gpuvm's table
(tables.find_gpu on the name vSphere gives the device, with the memory the host reports where the
name alone does not tell 40 GB from 80 GB)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuvm.errors import InputError, listed
from gpuvm.sizing.tables import GPUS, find_gpu


@dataclass
class InventoryGpus:
    """The GPUs of one model in the inventory: the table's name (or vSphere's, if not in the table)."""

    model: str
    known: bool  # a GPU of gpuvm's table
    hosts: dict[str, int] = field(default_factory=dict)  # host → GPUs of this model on it

    @property
    def count(self) -> int:
        return sum(self.hosts.values())

    def where(self) -> str:
        return f"{self.count} on {len(self.hosts)} host(s): {listed(sorted(self.hosts))}"

    def describe(self) -> str:
        return f"{self.model} ({self.where()})" if self.known else f"'{self.model}' ({self.where()}; not in gpuvm's table)"


def gpus_by_model(path: Path) -> dict[str, InventoryGpus]:
    """The inventory's NVIDIA GPUs by model, whatever their passthrough or vGPU state."""
    from gpuvm.vsphere.facts import Inventory

    inventory = Inventory.load(path)
    models: dict[str, InventoryGpus] = {}
    for host in inventory.hosts.values():
        for gpu in host.gpus:
            name = gpu.device_name or gpu.pci_id
            memory = host.gpu_memory_gb(gpu)
            spec = find_gpu(name) or (find_gpu(f"{name} {memory}GB") if memory else None)
            key = spec.name if spec else name
            entry = models.setdefault(key, InventoryGpus(key, spec is not None))
            entry.hosts[host.name] = entry.hosts.get(host.name, 0) + 1
    return {m.model: m for m in sorted(models.values(), key=lambda m: (not m.known, m.model))}  # the table's first


def gpu_from_inventory(path: Path, wanted: str | None, flag: str = "--gpu") -> tuple[InventoryGpus, str]:
    """The inventory's GPU model (`wanted` picks one where it holds several) and a note saying where
    it came from. `flag`: how the user names a pick, for the messages."""
    models = gpus_by_model(path)
    held = "; ".join(m.describe() for m in models.values())
    if not models:
        raise InputError(f"{path}: the inventory holds no NVIDIA GPU: give {flag} instead of --inventory")
    if wanted is not None:
        spec = find_gpu(wanted)
        chosen = models.get(spec.name) if spec else None
        if chosen is None:
            what = f"'{wanted}' ({spec.name})" if spec and spec.name != wanted else f"'{wanted}'"
            raise InputError(f"{flag} {what}: not in the inventory {path}, which holds: {held}")
    else:
        known = [m for m in models.values() if m.known]
        if len(models) > 1:
            raise InputError(f"{path}: the inventory holds several GPU models: {held}; "
                             f"pick one with {flag}")
        if not known:
            raise InputError(f"{path}: the inventory's GPU {held} is not a GPU of gpuvm's table "
                             f"({', '.join(GPUS)}): leave --inventory out and give --gpu with the nearest one")
        chosen = known[0]
    return chosen, f"GPU: {chosen.model} from the inventory {path} ({chosen.where()})"
