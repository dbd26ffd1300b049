"""Steps that work over SSH: observe (commands → a typed fact), plan (pure), apply (commands).

A remote step serves one role ("esxi" shells or "guest" OSes). The engine observes every target
in parallel, plans with the pure `plan`, and applies per target in parallel — or, for steps that
must order their targets (build an image once, then ship it), through the step's `apply_all`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from gpuvm.plan import Change
from gpuvm.remote import Cluster, RemoteTarget


class RemoteStep(Protocol):
    name: str
    role: Literal["esxi", "guest"]

    def wanted(self, target: RemoteTarget, cluster: Cluster) -> bool:
        """Whether the runbook asks this step of the target at all."""

    def observe(self, target: RemoteTarget, cluster: Cluster) -> Any: ...

    def plan(self, target: RemoteTarget, fact: Any, cluster: Cluster) -> list[Change]: ...

    def apply(self, target: RemoteTarget, changes: list[Change], cluster: Cluster) -> None: ...
