"""Every vCenter call bounded (STYLE 15): a connection opens (TCP and TLS) within `connect_timeout`
seconds, and each call waits at most `call_timeout` for its answer. A vCenter that lets either go by
is taken as not answering: that call fails with a ConnectError naming it, and so do at once the
other calls under way to it (cut) and every later one (its targets fail or are "not observed"; the
run does not wait on it again).

An interrupt (SIGTERM, Ctrl-C) cuts every call under way (their sockets shut down, so a thread
blocked reading an answer wakes now, not after a timeout); worker threads call no more, and what
the main thread still says to vCenter (locks released, logout) has GRACE seconds in all.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPException, HTTPSConnection
from typing import Any, NoReturn

from gpuvm.errors import ConnectError
from gpuvm.executors.base import UNDER_WAY

GRACE = 2.0  # seconds, after an interrupt, for the clean-up's calls to every vCenter together
MAX_VERSIONS_XML = 1 << 20  # bytes of vimServiceVersions.xml worth reading (vCenter's: a few KiB)


@dataclass(frozen=True)
class Timeouts:
    connect: float = 15.0  # the runbook's vcenter.connect_timeout
    call: float = 120.0  # vcenter.call_timeout


class _ConnectTimeout(TimeoutError):
    """No connection within the connect timeout (a timeout while reading an answer is a plain one)."""


class Line:
    """One vCenter's connections (pyVmomi's stub makes them here: `attach`), with their bounds."""

    def __init__(self, url: str, timeouts: Timeouts):
        self.url = url
        self.timeouts = timeouts
        self.silent: str | None = None  # why the vCenter is taken as not answering; None: it answers
        self._grace_ends: float | None = None  # set by an interrupt
        self._open: weakref.WeakSet[TimedConnection] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._stub: Any = None

    def timeout(self, kind: str) -> float:
        """`connect` or `call`'s bound now (after an interrupt: what is left of the grace)."""
        bound: float = getattr(self.timeouts, kind)
        if self._grace_ends is not None:
            bound = min(bound, max(0.1, self._grace_ends - time.monotonic()))
        return bound

    def connection(self, host: str, port: int, context: ssl.SSLContext | None = None, **_: Any) -> "TimedConnection":
        """A new connection (pyVmomi's `scheme`)."""
        connection = TimedConnection(self, host, port, context)
        with self._lock:
            self._open.add(connection)
        return connection

    def attach(self, stub: Any) -> None:
        """pyVmomi's stub opens its connections here, and pools none that an interrupt cut."""
        self._stub = stub
        stub.scheme = self.connection
        give_back = stub.ReturnConnection

        def return_connection(connection: Any) -> None:
            if getattr(connection, "was_cut", False):
                connection.close()
            else:
                give_back(connection)

        stub.ReturnConnection = return_connection

    @contextmanager
    def calling(self, method: str) -> Iterator[None]:
        """One call: refused at once when the vCenter is not answering, or (in a worker thread) once
        gpuvm was interrupted; a timeout is a ConnectError naming the call and its bound."""
        if self.silent is not None:
            raise ConnectError(self.silent)
        if UNDER_WAY.refuses():
            raise ConnectError(f"{self.url}: {method} not called: gpuvm was interrupted")
        try:
            yield
        except _ConnectTimeout as e:
            self._give_up(f"{self.url}: no answer within {e.args[0]:g} s (connecting; vcenter.connect_timeout)")
        except TimeoutError:
            self._give_up(f"{self.url}: did not answer {method} within {self.timeout('call'):g} s (vcenter.call_timeout)")
        except (OSError, HTTPException, ssl.SSLError):
            if self.silent is not None:  # cut: another call found the vCenter silent
                raise ConnectError(self.silent) from None
            if self._grace_ends is None:
                raise
            raise ConnectError(f"{self.url}: {method} stopped: gpuvm was interrupted") from None

    def _give_up(self, why: str) -> NoReturn:
        """The vCenter is not answering: said once, the other calls waiting on it cut."""
        with self._lock:
            first = self.silent is None
            if first:
                self.silent = why
        if first:
            self._cut_all()
        raise ConnectError(self.silent) from None

    def cut(self) -> None:
        """At an interrupt (from the signal's own thread): every connection's socket shut down, the
        idle ones dropped; the calls that follow have what is left of GRACE."""
        self._grace_ends = time.monotonic() + GRACE
        self._cut_all()

    def let_go(self) -> None:
        """Every connection's socket closed in this process only (Session.let_go): the process that
        shares them goes on using them."""
        with self._lock:
            connections = list(self._open)
            self._open = weakref.WeakSet()
        for connection in connections:
            if connection.sock is not None:
                connection.sock.close()  # this process's descriptor; an SSL socket's close sends nothing
                connection.sock = None

    def _cut_all(self) -> None:
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            connection.cut()
        if self._stub is not None:
            self._stub.DropConnections()


class TimedConnection(HTTPSConnection):
    """An HTTPS connection whose opening has the connect bound and whose every read the call bound."""

    def __init__(self, line: Line, host: str, port: int, context: ssl.SSLContext | None):
        super().__init__(host, port, timeout=line.timeout("connect"), context=context)
        self.line = line
        self.was_cut = False

    def connect(self) -> None:
        try:
            super().connect()
        except TimeoutError:
            raise _ConnectTimeout(self.timeout) from None
        if self.sock is not None:
            self.sock.settimeout(self.line.timeout("call"))

    def cut(self) -> None:
        self.was_cut = True
        sock = self.sock
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's: TLS state untouched
            except OSError:
                pass  # closed meanwhile


def api_version(line: Line, host: str, port: int, path: str, context: ssl.SSLContext) -> str:
    """The newest vim25 API version both pyVmomi and the server speak, as pyVim's SmartConnect
    chooses it, over a bounded connection (SmartConnect's own has no timeout)."""
    from pyVmomi.VmomiSupport import GetServiceVersions, versionIdMap

    from gpuvm.vsphere.soap_xml import xml_tree

    connection = line.connection(host, port, context)
    try:
        connection.request("GET", path + "/vimServiceVersions.xml")
        response = connection.getresponse()
        body = response.read(MAX_VERSIONS_XML) if response.status == 200 else b""
    finally:
        connection.close()
    try:
        root = xml_tree(body) if body else None
    except Exception:  # lxml's XMLSyntaxError: not the document asked for
        root = None
    served = set()
    if root is not None and root.tag == "namespaces":
        for namespace in root.iter("namespace"):
            served |= {v.text for v in namespace.iter("version")}
    for version in GetServiceVersions("vim25"):
        if versionIdMap.get(version) in served:
            return str(version)
    raise ConnectError(f"{line.url}: not a vCenter (no API version gpuvm speaks in {path}/vimServiceVersions.xml)",
                       field="url")
