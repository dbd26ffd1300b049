"""The inventory reads of `gpuvm inventory`, `plan` and `verify`, sent before the runbook is validated:
a vCenter takes a while to prepare a large answer (a 4,096-VM vCenter's: a third of a second before
its first byte), and the runbook's validation, with the modules it and the output need (a fifth of
a second for one vCenter's runbook, more than half a second for four), fits in that wait.

Only the runbook's text and its `vcenter:` or `vcenters:` entry are read first (the YAML up to that
entry: it usually comes first); the logins and the requests use them as the run would, in threads
while the runbook is validated. Nothing here is ever the run's word: the runbook is validated in
full, and a read sent ahead is used only for a vCenter whose target in the validated runbook is the
same (gpuvm.connecting); any failure here is kept for that moment (a login refused: the same error,
then named by file:line), or leaves the run to read as always. Reading is all it does: no lock, no
change, logged out on exit.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuvm.errors import ConnectError, GpuvmError
from gpuvm.runbook import fast_yaml
from gpuvm.runbook.document import read_text
from gpuvm.runbook.vcenters import DEFAULT_VCENTER, NamedVCenter, VCenter
from gpuvm.vsphere.bounded import GRACE
from gpuvm.vsphere.retrieve import Sent, send_retrieve
from gpuvm.vsphere.session import Session, Target, resolve_target

LOGIN_WAIT_S = 1.0  # the logins and requests awaited before the runbook's validation (a vCenter that answers
# takes a tenth of that); one that takes longer goes on in its thread, the runbook validated meanwhile


@dataclass
class Ahead:
    """One vCenter reached before the runbook's validation: its session and the inventory read sent
    there, or why the login failed."""

    target: Target
    session: Session | None = None
    sent: Sent | None = None
    refused: ConnectError | None = None  # the login's failure, raised once the runbook is valid


@dataclass
class ReadAhead:
    """The runbook's text (not yet validated) and the vCenters reached before its validation, by the
    runbook's name for them (`default` for `vcenter:`), once their logins' threads are done."""

    text: str | None = None  # the loader takes it from here
    _vcenters: dict[str, Ahead] = field(default_factory=dict)
    _logins: list[threading.Thread] = field(default_factory=list)

    def reached(self) -> dict[str, Ahead]:
        """The vCenters reached ahead, once their logins and requests are done."""
        for login in self._logins:
            login.join()
        return self._vcenters

    def sent_on(self, sessions: Mapping[str, Session]) -> dict[str, Sent]:
        """The reads sent ahead on these sessions (those the run took: same vCenter, same target)."""
        return {name: a.sent for name, a in self.reached().items()
                if a.sent is not None and a.session is not None and sessions.get(name) is a.session}


NOTHING_AHEAD = ReadAhead()  # no read sent ahead (never filled): the run reads as always


@contextmanager
def read_ahead(path: Path, insecure: bool, reads: bool = True) -> Iterator[ReadAhead]:
    """The runbook read and its vCenters' inventory reads sent (when it names them first), logged out
    on exit (`reads` False: nothing read ahead, the run reads as always). The logins run in threads,
    awaited LOGIN_WAIT_S at most before the runbook's validation and, when the run ends before
    taking them (the runbook not valid), GRACE at most: a vCenter that does not answer holds the
    runbook's error back by those bounds, not by its connect bound."""
    if not reads:
        yield NOTHING_AHEAD
        return
    ahead = ReadAhead()
    try:
        ahead.text = read_text(Path(path))
    except GpuvmError:
        yield ahead  # the loader says what is wrong with the file
        return
    targets = {name: target for name, target in _targets(ahead.text, insecure).items()
               if not target.insecure}  # TLS off: only once the runbook has said so, as always
    with ExitStack() as stack:
        guard = threading.Lock()  # the stack is shared with the logins' threads
        ended = False  # the run went on without them: a login done now logs itself out

        def reach(name: str) -> None:
            one = Ahead(targets[name])
            try:
                with ExitStack() as own:
                    one.session = own.enter_context(Session(one.target))
                    one.sent = send_retrieve(one.session)
                    with guard:
                        if not ended:
                            stack.push(own.pop_all())
            except ConnectError as e:
                one.refused, one.session = e, None
            except Exception:  # read as always, once the runbook is valid
                one.session = one.sent = None
            ahead._vcenters[name] = one

        if targets:
            importlib.import_module("pyVmomi")  # here, not in two threads at once (Python's import locks)
        ahead._logins = [threading.Thread(target=reach, args=(name,), daemon=True) for name in targets]
        for login in ahead._logins:
            login.start()
        try:
            _join(ahead._logins, LOGIN_WAIT_S)  # the runbook's modules and validation then run alone on the GIL
            yield ahead
        finally:
            with guard:
                ended = True
            _join(ahead._logins, GRACE)


def _join(threads: list[threading.Thread], seconds: float) -> None:
    """Wait for the threads, `seconds` at most in all."""
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _targets(text: str, insecure: bool) -> dict[str, Target]:
    """The vCenters of the runbook's `vcenter:` or `vcenters:` entry, by name, when it comes early and
    each is valid as it stands (else none: the runbook's validation will name what is wrong)."""
    found = fast_yaml.top_value(text, "vcenter", "vcenters")
    if found is None:
        return {}
    key, value = found
    try:
        if key == "vcenter":
            return {DEFAULT_VCENTER: resolve_target(VCenter.model_validate(value), insecure)}
        entries = [NamedVCenter.model_validate(entry) for entry in value]
        targets = {entry.name: resolve_target(entry, insecure) for entry in entries}
    except Exception:  # a setting the runbook's validation will name (file:line)
        return {}
    return targets if len(targets) == len(entries) else {}  # a name twice: the runbook's error
