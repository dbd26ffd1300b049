"""Every vCenter call bounded (issue 33, point 3; vsphere/bounded.py): a timeout is a ConnectError
naming the vCenter, the call and its bound, and the vCenter is not called again; an interrupt cuts
the calls under way and refuses worker threads' calls. The timing itself is tested against a silent
peer in tests/integration/test_vcenter_silent.py."""

from __future__ import annotations

import os
import socket
import threading
from http.client import HTTPSConnection
from types import SimpleNamespace

import pytest

from gpuvm.errors import ConnectError
from gpuvm.executors.base import UNDER_WAY
from gpuvm.runbook.vcenters import VCenter
from gpuvm.vsphere.bounded import GRACE, Line, Timeouts, api_version
from gpuvm.vsphere.session import resolve_target

URL = "https://vc-east/sdk"


@pytest.fixture(autouse=True)
def _not_interrupted():
    UNDER_WAY.reset()
    yield
    UNDER_WAY.reset()


def line(connect: float = 15, call: float = 120) -> Line:
    return Line(URL, Timeouts(connect, call))


def in_a_thread(fn):
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return outcome


def test_the_runbooks_bounds_reach_the_target_and_default_to_15_and_120_s(monkeypatch):
    monkeypatch.setenv("VC_PASSWORD", "secret-x")
    given = resolve_target(VCenter(url="https://vc/sdk", user="u", password_env="VC_PASSWORD",
                                   connect_timeout=2, call_timeout=3.5))
    assert given.timeouts == Timeouts(2, 3.5)
    assert resolve_target(VCenter(url="https://vc/sdk", user="u", password_env="VC_PASSWORD")).timeouts == Timeouts(15, 120)


def test_a_call_unanswered_in_time_names_the_vcenter_the_call_and_the_bound_and_ends_all_later_calls():
    bounded_line = line(call=3)
    with pytest.raises(ConnectError, match=r"^https://vc-east/sdk: did not answer RetrievePropertiesEx within 3 s"):
        with bounded_line.calling("RetrievePropertiesEx"):
            raise socket.timeout("The read operation timed out")
    called = []
    with pytest.raises(ConnectError, match="did not answer RetrievePropertiesEx within 3 s"):
        with bounded_line.calling("ReconfigVM_Task"):
            called.append(True)
    assert not called, "a vCenter that stopped answering was called again"


def test_a_connection_not_opened_in_time_is_said_so(mocker):
    mocker.patch.object(HTTPSConnection, "connect", side_effect=TimeoutError("_ssl.c: The handshake operation timed out"))
    bounded_line = line(connect=2)
    connection = bounded_line.connection("vc-east", 443)
    assert connection.timeout == 2
    with pytest.raises(ConnectError, match=r"^https://vc-east/sdk: no answer within 2 s \(connecting"):
        with bounded_line.calling("Login"):
            connection.connect()
    assert bounded_line.silent


def test_other_failures_pass_as_they_are_and_leave_the_vcenter_answering():
    bounded_line = line()
    with pytest.raises(ConnectionRefusedError):
        with bounded_line.calling("Login"):
            raise ConnectionRefusedError(111, "Connection refused")
    assert bounded_line.silent is None


def test_a_connection_once_open_reads_with_the_call_bound(mocker):
    def connect(self):
        self.sock = mocker.Mock()

    mocker.patch.object(HTTPSConnection, "connect", connect)
    connection = line(connect=2, call=7).connection("vc-east", 443)
    connection.connect()
    connection.sock.settimeout.assert_called_once_with(7)


def test_an_interrupt_cuts_the_calls_under_way_and_refuses_workers_calls_and_gives_the_rest_grace(mocker):
    mocker.patch.object(HTTPSConnection, "connect", lambda self: None)
    bounded_line = line(connect=600, call=600)
    stub = SimpleNamespace(DropConnections=mocker.Mock(), ReturnConnection=mocker.Mock())
    bounded_line.attach(stub)
    under_way = bounded_line.connection("vc-east", 443)
    under_way.sock, peer = socket.socketpair()
    key = UNDER_WAY.add(bounded_line.cut)
    try:
        UNDER_WAY.stop_all()  # what SIGTERM's handler starts
    finally:
        UNDER_WAY.remove(key)
    peer.settimeout(5)
    assert peer.recv(1) == b"", "the socket under way was not shut down"
    stub.DropConnections.assert_called_once_with()
    stub.ReturnConnection(under_way)  # a cut connection is closed, never pooled for the next call
    assert under_way.sock is None

    worker = in_a_thread(lambda: bounded_line.calling("ReconfigVM_Task").__enter__())
    assert isinstance(worker.get("error"), ConnectError) and "gpuvm was interrupted" in str(worker["error"])
    with pytest.raises(ConnectError, match=r"RemoveCustomFieldDef stopped: gpuvm was interrupted"):
        with bounded_line.calling("RemoveCustomFieldDef"):  # the main thread's clean-up may still call
            raise ConnectionResetError(104, "Connection reset by peer")
    assert bounded_line.silent is None  # cut, not silent: the clean-up still calls it
    assert 0 < bounded_line.timeout("connect") <= GRACE and 0 < bounded_line.timeout("call") <= GRACE
    peer.close()


VERSIONS = b"""<?xml version="1.0" encoding="UTF-8" ?>
<namespaces version="1.0">
 <namespace><name>urn:vim25</name><version>8.0.1.0</version>
  <priorVersions><version>7.0</version><version>6.7</version></priorVersions></namespace>
</namespaces>"""


def _served(mocker, status: int, body: bytes) -> None:
    answer = SimpleNamespace(status=status, read=lambda limit: body[:limit])
    connection = mocker.Mock(getresponse=mocker.Mock(return_value=answer))
    mocker.patch.object(Line, "connection", return_value=connection)


def test_the_api_version_is_the_newest_both_sides_speak(mocker):
    from pyVmomi.VmomiSupport import GetServiceVersions, versionIdMap

    _served(mocker, 200, VERSIONS)
    chosen = api_version(line(), "vc-east", 443, "/sdk", None)
    served = {"8.0.1.0", "7.0", "6.7"}
    assert versionIdMap[chosen] in served
    newer = GetServiceVersions("vim25")[:GetServiceVersions("vim25").index(chosen)]
    assert not {versionIdMap[v] for v in newer} & served


@pytest.mark.parametrize("status, body", [(404, b""), (200, b"<html>not here</html>"), (200, b"\x00\x01 not xml")])
def test_a_server_without_the_versions_document_is_not_a_vcenter(mocker, status, body):
    _served(mocker, status, body)
    with pytest.raises(ConnectError, match=r"^https://vc-east/sdk: not a vCenter") as raised:
        api_version(line(), "vc-east", 443, "/sdk", None)
    assert raised.value.field == "url"



def test_a_sessions_calls_are_bounded_and_a_property_read_is_named_by_its_property(mocker):
    from gpuvm.vsphere.session import RequestCounter, _instrument

    invoke = mocker.Mock(side_effect=socket.timeout("timed out"))
    stub = SimpleNamespace(InvokeMethod=invoke, InvokeAccessor=mocker.Mock())
    session = SimpleNamespace(fence=None, line=line(call=3))
    _instrument(stub, RequestCounter(), mocker.Mock(generation=0), session)
    with pytest.raises(ConnectError, match=r"did not answer a read of field within 3 s"):
        stub.InvokeMethod(None, SimpleNamespace(wsdlName="Fetch"), ("field",))
    with pytest.raises(ConnectError, match=r"did not answer a read of field within 3 s"):  # not called again
        stub.InvokeMethod(None, SimpleNamespace(wsdlName="CurrentTime"), ())
    assert invoke.call_count == 1



def test_the_first_call_unanswered_cuts_the_others_waiting_on_the_same_vcenter(mocker):
    mocker.patch.object(HTTPSConnection, "connect", lambda self: None)
    bounded_line = line(call=3)
    waiting = bounded_line.connection("vc-east", 443)
    waiting.sock, peer = socket.socketpair()
    waiting_call = bounded_line.calling("ReconfigVM_Task")
    waiting_call.__enter__()  # under way in another thread, say
    with pytest.raises(ConnectError, match="did not answer RetrievePropertiesEx within 3 s"):
        with bounded_line.calling("RetrievePropertiesEx"):
            raise socket.timeout("timed out")
    peer.settimeout(5)
    assert peer.recv(1) == b"", "the other call's socket was not shut down"
    reset = ConnectionResetError(104, "Connection reset by peer")  # what the waiting call's read then meets
    with pytest.raises(ConnectError, match="did not answer RetrievePropertiesEx within 3 s"):
        waiting_call.__exit__(type(reset), reset, None)
    peer.close()


def test_a_line_let_go_closes_its_sockets_here_only_and_an_interrupt_no_longer_cuts_them():
    """A fleet's child took the session over (Session.let_go): the child's copy of each socket (here a
    dup) goes on working, and the parent's interrupt does not shut the shared socket down."""
    bounded_line = line()
    ours, peer = socket.socketpair()
    connection = bounded_line.connection("vc-east", 443)
    connection.sock = ours
    childs = socket.socket(fileno=os.dup(ours.fileno()))  # what fork gives the child
    bounded_line.let_go()
    assert ours.fileno() == -1 and connection.sock is None
    bounded_line.cut()  # an interrupt in the parent, afterwards
    childs.sendall(b"still the child's")
    assert peer.recv(64) == b"still the child's"
    peer.sendall(b"and back")
    assert childs.recv(64) == b"and back"
    childs.close()
    peer.close()
