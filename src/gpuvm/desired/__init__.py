"""The typed desired state of every target: what each one should be.

`resolve(runbook, inventory)` produces the vSphere roles' state, `resolve_ssh(runbook)` the SSH
roles'. Steps, capacity, topology, the engine and the bench code import this layer, never the
resolvers; it imports no code that plans or applies (resolve, resolve_ssh, the engine, steps, bench:
tests/unit/test_import_graph.py), so it takes part in no import cycle. One module per kind of
target: `vsphere` (hosts and VMs, roles "host" and "vm"), `ssh` (ESXi shells and guests, roles
"esxi" and "guest").
"""

from gpuvm.desired.ssh import DesiredEsxi, DesiredGuest
from gpuvm.desired.vsphere import Clone, CloneNetwork, Desired, DesiredDevice, DesiredHost, DesiredVm, Nvlink

__all__ = ["Clone", "CloneNetwork", "Desired", "DesiredDevice", "DesiredEsxi", "DesiredGuest", "DesiredHost",
           "DesiredVm", "Nvlink"]
