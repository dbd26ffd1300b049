"""Which guest a failed pair of the mesh check is charged to (issue 27: one guest down or skipped must
not fail the mesh, and so hold back the image, on every guest)."""

from __future__ import annotations

import pytest

from gpuvm.steps.guest_ssh_mesh.blame import charge
from gpuvm.steps.guest_ssh_mesh.verify import FailedPair

GUESTS = ["g1", "g2", "g3", "g4"]


def pairs(*failing: tuple[str, str]) -> list[FailedPair]:
    return [FailedPair(origin, peer, "Permission denied (publickey)") for origin, peer in failing]


def charged(failed: list[FailedPair], guests=GUESTS) -> dict[str, list[tuple[str, str]]]:
    return {g: [(p.origin, p.peer) for p in ps] for g, ps in charge(failed, guests).items()}


def test_a_guest_nobody_reaches_is_charged_with_every_pair_it_is_in():
    """Its mesh files are not in place (the engine skipped it) or it went down: not the others' failure."""
    failed = pairs(*[(o, "g3") for o in GUESTS if o != "g3"], *[("g3", p) for p in GUESTS if p != "g3"])
    assert charged(failed) == {"g3": [("g1", "g3"), ("g2", "g3"), ("g4", "g3"), ("g3", "g1"), ("g3", "g2"),
                                      ("g3", "g4")]}


def test_a_guest_that_reaches_nobody_is_charged_its_own_pairs():
    """Its own key or ssh is broken (or its check could not run): the others log in to it."""
    failed = pairs(("g2", "g1"), ("g2", "g3"), ("g2", "g4"))
    assert charged(failed) == {"g2": [("g2", "g1"), ("g2", "g3"), ("g2", "g4")]}


@pytest.mark.parametrize("failing, expected", [
    ([("g1", "g2")], {"g1": [("g1", "g2")]}),  # others reach g2: g1's side (a known_hosts line, say)
    ([("g1", "g2"), ("g2", "g1")], {"g1": [("g1", "g2")], "g2": [("g2", "g1")]}),
])
def test_a_pair_is_otherwise_charged_to_the_guest_that_ran_ssh(failing, expected):
    assert charged(pairs(*failing)) == expected


def test_with_two_guests_or_no_working_pair_nobody_is_singled_out():
    assert charged(pairs(("g1", "g2"), ("g2", "g1")), ["g1", "g2"]) == {"g1": [("g1", "g2")], "g2": [("g2", "g1")]}
    everything = pairs(*[(o, p) for o in GUESTS for p in GUESTS if o != p])
    assert charged(everything) == {o: [(o, p) for p in GUESTS if p != o] for o in GUESTS}
