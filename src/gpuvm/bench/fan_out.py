"""How many guests the campaign runner talks to at once.

Each guest is one SSH session doing a few seconds of work at most (a lock, a probe, a version or
environment script): all of a 64-guest campaign's guests in one round, not eight rounds of eight.
"""

from __future__ import annotations

from collections.abc import Sized

MOST_AT_ONCE = 64  # as `gpuvm apply --parallel`'s limit


def at_once(targets: Sized) -> int:
    """Workers for a pool over `targets`: one each, up to MOST_AT_ONCE."""
    return max(1, min(MOST_AT_ONCE, len(targets)))
