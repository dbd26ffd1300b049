"""The JSON documents gpuvm prints with `--json`: one versioned schema per command.

Every document carries `"schema": "gpuvm.<command>/<version>"`; the JSON Schema that describes it
is src/gpuvm/schemas/<command>.json (shipped in the wheel, read by `schema`). A version changes
only when a field is removed or changes meaning; new fields can appear within a version.
Secrets are scrubbed from every document (`dumps`). A command given `--json` that ends in an error
prints that error as a `gpuvm.error/1` document (`error_json`), unless it printed the document
that tells how it ended first (verify's drift, bench run's campaign, apply's summary).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from gpuvm.errors import DOCUMENT_VERSION, error_document
from gpuvm.plan import Plan
from gpuvm.secrets import scrub

if TYPE_CHECKING:
    from gpuvm.vsphere.shown import Shown

VERSIONS = {"plan": 1, "apply": 1, "verify": 1, "inventory": 1, "bench-run": 1, "bench-compare": 2, "size": 1,
            "locks": 1, "saved-plan": 1, "error": DOCUMENT_VERSION}
STREAM_ENDS = {"apply": "summary"}  # a command printing a stream of documents: the event that ends it
_outcome_printed = False  # the command under way has made the document that tells how it ended


def schema_id(command: str) -> str:
    return f"gpuvm.{command}/{VERSIONS[command]}"


def schema(command: str) -> dict[str, Any]:
    """The JSON Schema of `command`'s document."""
    return json.loads(resources.files("gpuvm").joinpath("schemas", f"{command}.json").read_text(encoding="utf-8"))


def document(command: str, **fields: Any) -> dict[str, Any]:
    global _outcome_printed
    if command not in STREAM_ENDS or fields.get("event") == STREAM_ENDS[command]:
        _outcome_printed = True
    return {"schema": schema_id(command), **fields}


def command_begins() -> None:
    global _outcome_printed
    _outcome_printed = False


def error_json(message: str, exit_code: int, code: str) -> str | None:
    """The gpuvm.error/1 document of the error that ends a command (on one line, so that it also
    ends apply's stream), or None after a document told how it ended (its own, or an error's)."""
    global _outcome_printed
    if _outcome_printed:
        return None
    _outcome_printed = True
    return dumps(error_document(message, exit_code, code), indent=None)


def dumps(data: dict[str, Any], indent: int | None = 2) -> str:
    """One document as JSON text, secrets scrubbed from its values before encoding; `indent=None`:
    one line (for event streams)."""
    return json.dumps(scrub(data), indent=indent, default=str, ensure_ascii=False)


def plan_fields(plan: Plan) -> dict[str, Any]:
    """A plan's changes, notes, summary, the targets not observed (with why), and with `--target` the
    targets with changes left out (with why) and those changes."""
    return {**plan.to_dict(), "not_observed": dict(plan.unobserved), "left_out": plan.left_out_by_target(),
            "left_out_changes": [{**entry.change.to_dict(), "why": entry.why} for entry in plan.left_out]}


def plan_json(plan: Plan) -> str:
    return dumps(document("plan", **plan_fields(plan)))


def inventory_json(seen: Shown, warnings: Sequence[str] = ()) -> str:
    """What `inventory` prints: hosts with their GPUs and NICs, and VMs (with several vCenters, each
    one's vCenter); the vCenters not reached, and the warnings said of them."""
    inventory = seen.inventory

    def where(vcenters: dict[str, str], name: str) -> dict[str, str]:
        return {"vcenter": vcenters[name]} if name in vcenters else {}

    hosts = [{"name": h.name, **where(seen.host_vcenters, h.name),
              "state": "maintenance" if h.in_maintenance else h.connection_state,
              "memory_mb": h.memory_mb, "cpu_threads": h.cpu_threads, "graphics": h.graphics.default_type,
              "vgpu_profiles": list(h.vgpu_profiles),
              "devices": [{"address": d.id, "model": d.device_name, "vendor": d.vendor_name, "id": d.pci_id,
                           "kind": "gpu" if d.is_gpu else "nic", "numa_node": d.numa_node,
                           "passthrough": d.passthru_state} for d in h.pci if d.is_gpu or d.is_mellanox]}
             for h in inventory.hosts.values()]
    vms = [{"name": vm.name, **where(seen.vm_vcenters, vm.name), "host": vm.host, "power": vm.power_state,
            "cpus": vm.cpus, "memory_mb": vm.memory_mb, "firmware": vm.firmware, "reserved": vm.reservation_locked,
            "hw_version": vm.hw_version, "pci": [d.describe() for d in vm.pci]} for vm in inventory.vms.values()]
    return dumps(document("inventory", source=inventory.source, taken=inventory.taken.isoformat(), hosts=hosts, vms=vms,
                          not_reached=dict(seen.down), warnings=list(warnings)))


def verify_json(verified: Any = None, drift: Any = None) -> str:
    """`verify`'s verdict: no drift (`verified`, a runs.Verified), or the drift (a DriftError with its
    plan, or a runs.NotObserved: the targets it could not reach, and the drift on the others)."""
    if drift is None:
        notes = [{"target": n.target, "step": n.step, "message": n.message, "level": n.level} for n in verified.foreign]
        return dumps(document("verify", drift=False, changes=[], notes=notes, unreachable={},
                              mesh_guests=verified.mesh_guests, message=verified.message))
    plan = getattr(drift, "plan", None) or Plan()
    return dumps(document("verify", drift=True, changes=[c.to_dict() for c in plan.changes],
                          notes=plan.to_dict()["notes"], unreachable=getattr(drift, "down", {}), mesh_guests=None,
                          message=str(drift), exit_code=drift.exit_code))
