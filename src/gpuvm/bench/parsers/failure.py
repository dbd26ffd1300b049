"""What a failed benchmark run's log says went wrong, in one line (its repeat's `error`)."""

from __future__ import annotations

import re

from gpuvm.bench.parsers.common import tagged_lines

TRACEBACK = "Traceback (most recent call last):"
# a launcher's banner rule: mpirun's "-----…" around "Primary job terminated normally…", torchrun's "=====…"
_RULER = re.compile(r"^([-=*#~_])\1{9,}$")


def failure_line(text: str) -> str:
    """The exception that the log's first Python traceback ends with (the first rank to fail: the
    root cause, as torchrun reports it); else its last line outside launchers' banners (blocks
    between two rules of one character, and the rules); else its last line but a rule. Lines are given as printed (rank tags kept)."""
    lines = [(raw.strip(), body) for raw, (_, body) in zip(text.splitlines(), tagged_lines(text)) if body.strip()]
    start = next((i for i, (_, body) in enumerate(lines) if body.strip() == TRACEBACK), None)
    if start is not None:
        raised = next((raw for raw, body in lines[start + 1:] if not body[:1].isspace()), None)
        if raised is not None:
            return raised
    rule = ""  # the banner being skipped (from its closing rule up), by its rule's character
    for raw, body in reversed(lines):
        ruler = _RULER.match(body.strip())
        if ruler and rule in ("", ruler[1]):
            rule = "" if rule else ruler[1]  # rules of another character inside a banner are its own
        elif not rule and not ruler:
            return raw
    return next((raw for raw, body in reversed(lines) if not _RULER.match(body.strip())), "")
