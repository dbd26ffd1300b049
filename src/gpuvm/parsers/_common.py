from __future__ import annotations

from gpuvm.errors import RemoteCommandError


def unparseable(command: str, expected: str, text: str) -> RemoteCommandError:
    """The error for output that is not what `command` prints; quotes the start of the text."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    shown = f"got {first[:80]!r}" if first else "got no output"
    return RemoteCommandError(f"could not parse the output of `{command}`: expected {expected}; {shown}")
