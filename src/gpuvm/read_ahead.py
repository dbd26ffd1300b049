"""`gpuvm inventory`'s read, sent before the runbook is validated: a vCenter takes a while to prepare
a large answer (a 4,096-VM vCenter's: a third of a second before its first byte), and the runbook's
validation, with the modules it and the output need (a fifth of a second), fits in that wait.

Only the runbook's text and its `vcenter:` entry are read first (the YAML up to that entry: it
usually comes first); the login and the request use them as the run would. Nothing here is ever the run's word: the runbook is then validated in full, and the read
sent ahead is used only if the runbook's own vCenter target is the same (gpuvm.connecting); any
failure here is kept for that moment (a login refused: the same error, then named by file:line), or
leaves the run to read as always. Reading is all it does: no lock, no change, logged out on exit.
(A vCenter that does not answer holds the runbook's own errors back by its connect bound.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuvm.errors import ConnectError, GpuvmError
from gpuvm.runbook import fast_yaml
from gpuvm.runbook.document import read_text
from gpuvm.runbook.vcenters import VCenter
from gpuvm.vsphere.retrieve import send_retrieve
from gpuvm.vsphere.session import Session, Target, resolve_target


@dataclass
class ReadAhead:
    """The runbook's text (not yet validated) and, when its vCenter could be reached before its
    validation, the session and the inventory read sent there (or why the login failed)."""

    text: str | None = None  # the loader takes it from here
    target: Target | None = None
    session: Session | None = None
    sent: Callable[..., list[Any]] | None = None  # retrieve.send_retrieve's answer, not yet read
    refused: ConnectError | None = None  # the login's failure, raised once the runbook is valid


@contextmanager
def read_ahead(path: Path, insecure: bool) -> Iterator[ReadAhead]:
    """The runbook read and its one vCenter's inventory read sent (when it gives one), logged out on exit."""
    ahead = ReadAhead()
    try:
        ahead.text = read_text(Path(path))
    except GpuvmError:
        yield ahead  # the loader says what is wrong with the file
        return
    entry = fast_yaml.top_value(ahead.text, "vcenter")  # a runbook with `vcenters:`, or none, is read as always
    try:
        target = resolve_target(VCenter.model_validate(entry[0]), insecure) if entry else None
    except Exception:  # a setting the runbook's validation will name (file:line)
        target = None
    ahead.target = target if target is not None and not target.insecure else None  # TLS off: only once said
    with ExitStack() as stack:
        if ahead.target is not None:
            try:
                ahead.session = stack.enter_context(Session(ahead.target))
                ahead.sent = send_retrieve(ahead.session)
            except ConnectError as e:
                ahead.refused = e
            except Exception:  # read as always, once the runbook is valid
                stack.close()
                ahead.session = ahead.sent = None
        yield ahead
