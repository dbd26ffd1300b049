"""Which guest a failed pair of the mesh check is charged to (pure).

A pair is the guest that ran ssh (`origin`) and the one it tried to log in to (`peer`). It is
charged to the origin, unless the peer is the one at fault: nobody could log in to it, while the
origin logged in to some other guest (its key and its ssh work). That is a peer that went down
after gpuvm last reached it, or one whose own mesh files are not in place (an earlier step failed on
it, so the engine skipped it). Charged to every guest that tried it, one such guest would fail the
mesh everywhere, and the engine would then hold back every later step (the image) on every guest.
With two guests that fail each other nothing tells which is at fault: each is charged its own.
"""

from __future__ import annotations

from gpuvm.steps.guest_ssh_mesh.verify import FailedPair


def charge(pairs: list[FailedPair], guests: list[str]) -> dict[str, list[FailedPair]]:
    """The failed pairs by the guest they are charged to; `guests`: every guest checked."""
    failed = {(p.origin, p.peer) for p in pairs}
    reaches = {g for g in guests if any((g, o) not in failed for o in guests if o != g)}
    reached = {g for g in guests if any((o, g) not in failed for o in guests if o != g)}
    charged: dict[str, list[FailedPair]] = {}
    for pair in pairs:
        at_fault = pair.peer if pair.origin in reaches and pair.peer not in reached else pair.origin
        charged.setdefault(at_fault, []).append(pair)
    return charged
