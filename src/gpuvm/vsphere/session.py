"""Connecting to vCenter: settings from the runbook, govc's variables and the command line.

TLS verification is on unless the user turns it off (`insecure: true`, `GOVC_INSECURE=1` or
`--insecure`). A CA bundle can be given (`ca_file`, `GOVC_TLS_CA_CERTS`). The password is read
from an environment variable and registered as a secret. Every call is bounded (vsphere/bounded.py:
`connect_timeout`, `call_timeout`).
"""

from __future__ import annotations

import gzip
import logging
import os
import ssl
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from gpuvm.errors import ConnectError, InputError
from gpuvm.executors.base import UNDER_WAY
from gpuvm.runbook.vcenters import VCenter, env_flag, url_problem
from gpuvm.runbook.strict import shown
from gpuvm.secrets import redact, remember, secret_from_env, without_password
from gpuvm.vsphere.bounded import Line, Timeouts, api_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    user: str
    password: str
    insecure: bool
    ca_file: Path | None
    timeouts: Timeouts = Timeouts()

    @property
    def url(self) -> str:  # never carries credentials
        return f"https://{self.host}:{self.port}{self.path}"


def resolve_target(config: VCenter, insecure: bool = False, where: Callable[[str], str] = str) -> Target:
    """The vCenter to talk to. Runbook values win; govc's variables fill the gaps. `where` names a
    field of the runbook in messages ('vcenter.url' → 'lab.yaml:3: vcenter.url')."""
    url = config.url or os.environ.get("GOVC_URL")
    if not url:
        raise InputError(f"{where('vcenter.url')}: no vCenter URL (set vcenter.url in the runbook or GOVC_URL)")
    if problem := url_problem(url):
        raise InputError(f"{where('vcenter.url') if config.url else 'GOVC_URL'}: {shown(without_password(url))} {problem}")
    if "://" not in url:
        url = "https://" + url
    parts = urlsplit(url)
    user = config.user or parts.username or os.environ.get("GOVC_USERNAME")
    if not user:
        raise InputError(f"{where('vcenter.user')}: no user (set vcenter.user or GOVC_USERNAME)")
    if config.password_env:
        password = secret_from_env(config.password_env, where("vcenter.password_env"))
    elif parts.password:
        password = remember(parts.password, "vcenter.url (its password)")  # type: ignore[assignment]
    elif os.environ.get("GOVC_PASSWORD"):
        password = remember(os.environ["GOVC_PASSWORD"], "GOVC_PASSWORD")  # type: ignore[assignment]
    else:
        raise InputError(f"{where('vcenter.password_env')}: no password (name an environment variable in "
                         "vcenter.password_env, or set GOVC_PASSWORD)")
    # The command line wins, then the runbook, then govc's variable: a runbook that says
    # `insecure: false` keeps verification on whatever GOVC_INSECURE says.
    turn_off = insecure or (config.insecure if config.insecure is not None else bool(env_flag("GOVC_INSECURE")))
    ca = config.ca_file or (Path(os.environ["GOVC_TLS_CA_CERTS"]) if os.environ.get("GOVC_TLS_CA_CERTS") else None)
    if ca is not None:
        _check_ca(ca, where("vcenter.ca_file") if config.ca_file else "GOVC_TLS_CA_CERTS")
    return Target(host=parts.hostname or "", port=parts.port or 443, path=parts.path or "/sdk",
                  user=user, password=password, insecure=turn_off, ca_file=ca,
                  timeouts=Timeouts(config.connect_timeout, config.call_timeout))


def _check_ca(ca: Path, where: str) -> None:
    """A CA bundle that exists, is a file and holds PEM certificates."""
    if not ca.exists():
        raise InputError(f"{where}: {ca} does not exist")
    if not ca.is_file():
        raise InputError(f"{where}: {ca} is not a file (give a PEM bundle of CA certificates)")
    if ca.stat().st_size == 0:
        raise InputError(f"{where}: {ca} is empty (give a PEM bundle of CA certificates)")
    try:
        ssl.create_default_context(cafile=str(ca))
    except (ssl.SSLError, OSError, ValueError) as e:
        raise InputError(f"{where}: {ca} is not a PEM bundle of CA certificates ({e})") from None


class RequestCounter:
    """Counts SOAP round trips by method name (for `--stats` and the plan benchmark)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())


# Methods that change nothing in vCenter's inventory (reads, and the session's own bookkeeping);
# every other method is a change, checked against the run's lease first (`Session.fence`).
READS = frozenset({"RetrieveServiceContent", "RetrievePropertiesEx", "ContinueRetrievePropertiesEx",
                   "CancelRetrievePropertiesEx", "RetrieveProperties", "CurrentTime", "CreateContainerView",
                   "DestroyView", "CreateFilter", "DestroyPropertyFilter", "WaitForUpdatesEx", "CancelWaitForUpdates",
                   "Fetch", "Login", "Logout", "SessionIsActive"})  # Fetch: pyVmomi's property read


def changes_vcenter(method: str) -> bool:
    """Whether a SOAP method may change vCenter (unknown methods do: the fence fails closed)."""
    return method not in READS and not method.startswith(("Retrieve", "Query"))


_unfenced = threading.local()


@contextmanager
def unfenced() -> Iterator[None]:
    """The lease's own calls (taking, renewing, releasing locks) in this thread pass the fence."""
    before = getattr(_unfenced, "on", False)
    _unfenced.on = True
    try:
        yield
    finally:
        _unfenced.on = before


def _instrument(stub: Any, counter: RequestCounter, relogin: "_Relogin", session: "Session") -> None:
    """Count every round trip; check the run's lease before every call that changes vCenter; when
    vCenter says the session is gone (NotAuthenticated: an expired or terminated session), log in
    again once and repeat the call — it was refused, not done. Every call within its bounds."""
    from pyVmomi import vim

    invoke, invoke_accessor = stub.InvokeMethod, stub.InvokeAccessor

    def invoke_method(mo: Any, info: Any, args: Any, *rest: Any) -> Any:
        name = f"a read of {args[0]}" if info.wsdlName == "Fetch" and args else info.wsdlName  # an accessor
        with session.line.calling(name):
            return invoke(mo, info, args, *rest)

    def method(mo: Any, info: Any, args: Any, *rest: Any) -> Any:
        if session.fence is not None and changes_vcenter(info.wsdlName) and not getattr(_unfenced, "on", False):
            session.fence(info.wsdlName)  # raises LeaseLostError once the lease is lost
        counter.add(info.wsdlName)
        generation = relogin.generation
        try:
            result = invoke_method(mo, info, args, *rest)
            if info.wsdlName not in _PROPERTY_READS or not _read_without_session(result):
                return result
        except vim.fault.NotAuthenticated:
            if info.wsdlName in ("Login", "Logout"):
                raise
        relogin(generation)
        counter.add(info.wsdlName)
        return invoke_method(mo, info, args, *rest)

    def accessor(mo: Any, info: Any, *rest: Any) -> Any:
        counter.add(f"get {info.name}")
        return invoke_accessor(mo, info, *rest)

    stub.InvokeMethod, stub.InvokeAccessor = method, accessor


_PROPERTY_READS = ("RetrievePropertiesEx", "ContinueRetrievePropertiesEx", "RetrieveProperties")


def _read_without_session(result: Any) -> bool:
    """A property read of a lost session: answered, with NotAuthenticated in place of every
    property (missingSet), as govmomi's simulator models vCenter, rather than faulted."""
    from pyVmomi import vim

    objects = result if isinstance(result, list) else getattr(result, "objects", None)
    return any(isinstance(missing.fault, vim.fault.NotAuthenticated)
               for obj in objects or [] for missing in obj.missingSet or [])


class _Relogin:
    """Logs in again, once for all the threads that found the session gone at the same time."""

    def __init__(self, session: "Session"):
        self.session = session
        self.generation = 0
        self._lock = threading.Lock()

    def __call__(self, seen: int) -> None:
        with self._lock:
            if self.generation != seen:
                return  # another thread already logged in again
            target = self.session.target
            log.warning("%s: the vCenter session was lost; logging in again as %s", target.url, target.user)
            self.session.content.sessionManager.Login(userName=target.user, password=target.password)
            self.generation += 1


class Session:
    """A logged-in vCenter session. Use as a context manager; logs out on exit."""

    def __init__(self, target: Target, counter: RequestCounter | None = None):
        self.target = target
        self.line = Line(target.url, target.timeouts)
        self.counter = counter or RequestCounter()
        self.si: Any = None
        # Called with the method's name before every call that changes vCenter (HostLocks sets it:
        # it raises once the run's lease is lost); None: no lease to check (plan, verify).
        self.fence: Callable[[str], None] | None = None

    def __enter__(self) -> "Session":
        if self.target.insecure:
            context = ssl._create_unverified_context()  # the user turned verification off
        else:
            context = ssl.create_default_context(cafile=str(self.target.ca_file) if self.target.ca_file else None)
        self._interrupt = UNDER_WAY.add(self.line.cut)  # an interrupt cuts this session's calls under way
        try:
            self.si = self._log_in(context)
            self._relogin = _Relogin(self)
            _instrument(self.si._stub, self.counter, self._relogin, self)
            self._content = self.si.RetrieveContent()  # `si.content` would be a round trip per use
        except BaseException:
            UNDER_WAY.remove(self._interrupt)
            raise
        return self

    def _log_in(self, context: ssl.SSLContext) -> Any:
        """The logged-in ServiceInstance, as pyVim's SmartConnect makes it but with every connection
        bounded (`self.line`); a failure is a ConnectError naming the runbook's field responsible."""
        from pyVmomi import SoapStubAdapter, vim

        target, line = self.target, self.line
        try:
            with line.calling("connect"):
                version = api_version(line, target.host, target.port, target.path, context)
                stub = SoapStubAdapter(host=target.host, port=target.port, path=target.path, version=version,
                                       sslContext=context, connectionPoolTimeout=-1)
                line.attach(stub)
                si = vim.ServiceInstance("ServiceInstance", stub)
                si.RetrieveContent().sessionManager.Login(userName=target.user, password=target.password)
                return si
        except ConnectError:
            raise
        except vim.fault.InvalidLogin:
            raise ConnectError(f"{target.url}: login refused for user {target.user}", field="password_env") from None
        except ssl.SSLCertVerificationError as e:
            raise ConnectError(f"{target.url}: TLS certificate not trusted ({e.verify_message}); "
                               "give vcenter.ca_file or GOVC_TLS_CA_CERTS, or --insecure to turn checks off",
                               field="ca_file" if target.ca_file else "url") from None
        except Exception as e:  # OSError, ssl.SSLError; pyvmomi wraps some transport errors in its own types
            raise ConnectError(f"{target.url}: cannot connect: {redact(str(e))}", field="url") from None

    def __exit__(self, *exc: Any) -> None:
        if self.si is not None:
            try:
                self._content.sessionManager.Logout()
            except Exception:
                pass  # the session may already be gone; nothing useful to tell the user
            self.si._stub.DropConnections()
            self.si = None
        UNDER_WAY.remove(self._interrupt)

    def let_go(self) -> None:
        """This process is done with the session: a forked child took it over (vsphere/fleet.py), with
        a read under way on it. Its connections are closed here without a word on them (no TLS
        shutdown, no logout: the child's), and an interrupt here no longer cuts them."""
        UNDER_WAY.remove(self._interrupt)
        self.line.let_go()
        self.si = None

    @property
    def content(self) -> Any:
        return self._content

    def call(self, mo: Any, method: str, *args: Any, parse: Callable[[bytes, type, Any], Any] | None = None) -> Any:
        """`mo.<method>(*args)`, its answer decoded by lxml (vsphere/soap_xml.py): several times
        faster than pyVmomi's decoder for a large answer (the inventory read). Counted like every
        call; a fault is raised as pyVmomi raises it; a lost session is logged in again once. `parse`
        is the caller's own reading of the answer, tried first (soap_xml.decode)."""
        return self.send(mo, method, *args)(parse)

    def send(self, mo: Any, method: str, *args: Any) -> Callable[[Callable[[bytes, type, Any], Any] | None], Any]:
        """`call`'s request sent now; its answer read and decoded (by soap_xml, `parse` first) when the
        function returned is called: vCenter prepares it meanwhile. A lost session: logged in again
        once, and the request made again."""
        from pyVmomi import vim

        generation = self._relogin.generation
        sent = self._send(mo, method, args)

        def answer(parse: Callable[[bytes, type, Any], Any] | None = None) -> Any:
            try:
                return sent(parse)
            except vim.fault.NotAuthenticated:
                self._relogin(generation)
                return self._send(mo, method, args)(parse)

        return answer

    def _send(self, mo: Any, method: str, args: tuple[Any, ...]) -> Callable[[Callable[[bytes, type, Any], Any] | None], Any]:
        """One SOAP request made as pyVmomi's stub makes it, sent now; the function returned reads its answer."""
        from http.client import HTTPException

        stub = self.si._stub
        info = mo._GetMethodInfo(method)
        self.counter.add(method)
        request = stub.SerializeRequest(mo, info, list(args))
        headers = {"Cookie": stub.cookie, "SOAPAction": stub.versionId, "Accept-Encoding": "gzip",
                   "Content-Type": "text/xml; charset=UTF-8"}

        def failed(connection: Any) -> None:
            connection.close()
            stub.DropConnections()  # as pyVmomi does: the server may be sick

        with self.line.calling(method):
            connection = stub.GetConnection()
            try:
                connection.request("POST", stub.path, request, headers)
            except (OSError, HTTPException):
                failed(connection)
                raise

        def answer(parse: Callable[[bytes, type, Any], Any] | None = None) -> Any:
            from gpuvm.vsphere.soap_xml import decode

            with self.line.calling(method):
                try:
                    response = connection.getresponse()
                    body = response.read()
                except (OSError, HTTPException):
                    failed(connection)
                    raise
            stub.ReturnConnection(connection)
            if response.getheader("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            if response.status not in (200, 500):
                raise HTTPException(f"{response.status} {response.reason}")
            decoded = decode(body, info.result, stub, fault=response.status == 500, parse=parse)
            if response.status == 500:
                raise decoded
            return decoded

        return answer

    def ref(self, kind: str, moid: str) -> Any:
        """A managed-object reference from a moid (as kept in facts and snapshots)."""
        from pyVmomi import vim

        return getattr(vim, kind)(moid, self.si._stub)
