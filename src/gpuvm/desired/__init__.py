"""The typed desired state `resolve` produces from runbook + inventory: what each target should be.

Steps, capacity, topology, the engine and the bench code import this layer, never the resolver;
it imports no code that plans or applies (resolve, the engine, steps, bench: tests/unit/
test_import_graph.py), so it takes part in no import cycle. One module per kind of target:
`vsphere` (hosts and VMs, roles "host" and "vm").
"""

from gpuvm.desired.vsphere import Clone, CloneNetwork, Desired, DesiredDevice, DesiredHost, DesiredVm, Nvlink

__all__ = ["Clone", "CloneNetwork", "Desired", "DesiredDevice", "DesiredHost", "DesiredVm", "Nvlink"]
