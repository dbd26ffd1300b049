"""The typed desired state `resolve` produces from runbook + inventory: what each target should be.

Steps, capacity, topology, the engine and the bench code import this layer, never the resolver;
it imports nothing of gpuvm's but plain value types (`plan.Note`, `pci`), so it can never take part
in an import cycle. One module per kind of target: `vsphere` (hosts and VMs, role "host" and "vm").
"""

from gpuvm.desired.vsphere import Clone, CloneNetwork, Desired, DesiredDevice, DesiredHost, DesiredVm, Nvlink

__all__ = ["Clone", "CloneNetwork", "Desired", "DesiredDevice", "DesiredHost", "DesiredVm", "Nvlink"]
