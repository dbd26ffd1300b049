"""Run commands on a remote host over SSH: fabric for the connection, one paramiko channel per command.

Host keys are checked strictly: keys come from ~/.ssh/known_hosts and the files given; an
unknown key is refused unless `accept_new_host_keys` (then it is recorded and its fingerprint
logged), and a changed key is always refused. The connection opens on first use and is reused;
a dropped one is reopened on the next command.

Commands run on a raw channel rather than `Connection.run` because we need bytes on stdin,
stdout streamed to a file, and a hard timeout that also stops the remote process.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import BinaryIO, Sequence

import paramiko
from fabric import Config, Connection
from paramiko.common import cMSG_CHANNEL_REQUEST
from paramiko.message import Message

from gpuvm.errors import ConnectError, HostKeyError, RemoteCommandError
from gpuvm.executors.base import (MAX_OUTPUT, UNDER_WAY, CommandResult, Executor, OutputOverflow, check_result,
                                  interrupted_message, raise_if_stopped, timeout_message)
from gpuvm.executors.known_hosts import KnownHosts, read_known_hosts
from gpuvm.secrets import redact, remember
from gpuvm.ssh_keys import blob_fingerprint, known_hosts_name

log = logging.getLogger(__name__)

_record_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    return blob_fingerprint(key.asbytes())


class _UnknownHostKey(Exception):
    def __init__(self, key: paramiko.PKey):
        self.key = key


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or accept and record them when the user asked for that."""

    def __init__(self, executor: SshExecutor):
        self.executor = executor

    def missing_host_key(self, client, hostname, key):
        ex = self.executor
        if not ex.accept_new_host_keys:
            raise _UnknownHostKey(key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        if ex.record_to is not None:
            with _record_lock:
                ex.record_to.parent.mkdir(parents=True, exist_ok=True)
                with open(ex.record_to, "a") as f:
                    f.write(line)
        log.warning(
            "%s: trusting new host key for %s:%d (%s %s)%s",
            ex.name, ex.host, ex.port, key.get_name(), fingerprint(key),
            f"; recorded in {ex.record_to}" if ex.record_to else "",
        )


class SshExecutor(Executor):
    """Commands on one host over SSH. Thread-safe: commands may run in parallel on one executor."""

    def __init__(
        self,
        name: str,
        host: str,
        user: str,
        port: int = 22,
        key_file: Path | str | None = None,
        password: str | None = None,
        passphrase: str | None = None,
        known_hosts: Sequence[Path | str] = (),
        accept_new_host_keys: bool = False,
        record_to: Path | str | None = None,
        connect_timeout: float = 10,
    ):
        self.name = name
        self.host = host
        self.user = user
        self.port = port
        self.key_file = Path(key_file) if key_file else None
        self._password = remember(password)
        self._passphrase = remember(passphrase)
        self.known_hosts = [Path(p) for p in known_hosts]
        self.accept_new_host_keys = accept_new_host_keys
        self.record_to = Path(record_to) if record_to else None
        self.connect_timeout = connect_timeout
        self.max_output = MAX_OUTPUT
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._known = KnownHosts()

    def __repr__(self) -> str:
        return f"SshExecutor({self.name!r}, {self.user}@{self.host}:{self.port})"

    # -- the interface ----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def host_key_line(self) -> str:
        """The host's verified key as a known_hosts line (connects if needed), for the SSH mesh."""
        key = self._transport().get_remote_server_key()
        return f"{known_hosts_name(self.host, self.port)} {key.get_name()} {key.get_base64()}"

    # -- connection -------------------------------------------------------------------------

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._connection is not None and self._connection.is_connected:
                return self._connection.transport
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            connection = self._new_connection()
            self._open(connection)
            self._connection = connection
            return connection.transport

    def _new_connection(self) -> Connection:
        connect_kwargs: dict = {
            "allow_agent": False,
            "look_for_keys": False,
            "banner_timeout": self.connect_timeout,
            "auth_timeout": self.connect_timeout,
        }
        if self.key_file:
            connect_kwargs["key_filename"] = str(self.key_file)
        if self._password:
            connect_kwargs["password"] = self._password
        if self._passphrase:
            connect_kwargs["passphrase"] = self._passphrase
        connection = Connection(
            self.host,
            user=self.user,
            port=self.port,
            connect_timeout=max(1, int(self.connect_timeout)),
            connect_kwargs=connect_kwargs,
            # no ~/.ssh/config or /etc/ssh/ssh_config: the runbook says where to connect
            config=Config(ssh_config=paramiko.SSHConfig()),
        )
        client = connection.client
        # fabric trusts any key by default (AutoAddPolicy); we do not
        client.set_missing_host_key_policy(_HostKeyPolicy(self))
        user_known_hosts = Path("~/.ssh/known_hosts").expanduser()
        paths = [user_known_hosts, *self.known_hosts, *([self.record_to] if self.record_to else [])]
        self._known = read_known_hosts(list(dict.fromkeys(p for p in paths if p.is_file())))
        self._known.add_to(client.get_host_keys())
        return connection

    def _open(self, connection: Connection) -> None:
        where = f"{self.host}:{self.port}"
        try:
            connection.open()
            offered = connection.client.get_transport().get_remote_server_key()
            if self._known.is_revoked(offered):
                connection.close()
                raise HostKeyError(f"{self.name}: host key for {where} ({offered.get_name()} {fingerprint(offered)}) "
                                   "is @revoked in known_hosts: refusing to connect")
        except _UnknownHostKey as e:
            raise HostKeyError(
                f"{self.name}: host key for {where} is unknown ({e.key.get_name()} {fingerprint(e.key)}); "
                "pass --accept-new-host-keys to trust and record it"
            ) from None
        except paramiko.BadHostKeyException as e:
            raise HostKeyError(
                f"{self.name}: host key for {where} has CHANGED: the server offers {e.key.get_name()} "
                f"{fingerprint(e.key)} but the known key is {e.expected_key.get_name()} "
                f"{fingerprint(e.expected_key)}; if the host was reinstalled, remove its old key "
                "from known_hosts (possible man-in-the-middle attack)"
            ) from None
        except paramiko.AuthenticationException as e:
            raise ConnectError(redact(f"{self.name}: authentication as {self.user}@{where} failed: {e}")) from None
        except (socket.timeout, TimeoutError):
            raise ConnectError(f"{self.name}: connecting to {where} timed out after {self.connect_timeout:g}s") from None
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            reasons = "; ".join(sorted({err.strerror or str(err) for err in e.errors.values()}))
            raise ConnectError(f"{self.name}: cannot connect to {where}: {reasons}") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise ConnectError(redact(f"{self.name}: cannot connect to {where}: {e or type(e).__name__}")) from None

    # -- commands ---------------------------------------------------------------------------

    def _execute(
        self, command: str, timeout: float, check: bool, stdin: bytes | None, stdout_to: BinaryIO | None
    ) -> CommandResult:
        if UNDER_WAY.refuses():
            raise RemoteCommandError(interrupted_message(self.name, command))
        transport = self._transport()
        try:
            channel = transport.open_session(timeout=self.connect_timeout)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as e:
            # the connection died under us (host rebooted, sshd stopped): one fresh try
            self.close()
            transport = self._transport()
            try:
                channel = transport.open_session(timeout=self.connect_timeout)
                channel.exec_command(command)
            except (paramiko.SSHException, OSError, EOFError):
                raise ConnectError(redact(f"{self.name}: lost the connection to {self.host}:{self.port}: {e}")) from None
        out, err = bytearray(), bytearray()
        overflow = OutputOverflow(self.max_output, lambda: _stop_remote(channel))
        threads = [
            threading.Thread(target=_pump, args=(channel.recv, stdout_to, out, overflow), daemon=True),
            threading.Thread(target=_pump, args=(channel.recv_stderr, None, err, overflow), daemon=True),
            threading.Thread(target=_feed, args=(channel, stdin), daemon=True),
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        interrupted = threading.Event()

        def interrupt() -> None:
            interrupted.set()
            _stop_remote(channel)

        under_way = UNDER_WAY.add(interrupt)
        try:
            finished = channel.status_event.wait(timeout)  # also set when the channel is closed
        finally:
            UNDER_WAY.remove(under_way)
        raise_if_stopped(self.name, command, interrupted, overflow.over, self.max_output)
        if finished:
            for thread in threads[:2]:
                thread.join(max(0.1, deadline - time.monotonic()) + 5)
        if not finished or any(t.is_alive() for t in threads[:2]):
            _stop_remote(channel)
            raise RemoteCommandError(timeout_message(self.name, command, timeout))
        exit_code = channel.recv_exit_status()
        channel.close()
        if exit_code == -1:  # the session ended without an exit status (e.g. host went down)
            raise ConnectError(redact(f"{self.name}: connection to {self.host}:{self.port} dropped during `{command}`"))
        result = CommandResult(command, exit_code, out.decode(errors="replace"), err.decode(errors="replace"))
        return check_result(self.name, result) if check else result


def _pump(recv, sink: BinaryIO | None, buffer: bytearray, overflow: OutputOverflow) -> None:
    try:
        for chunk in iter(lambda: recv(65536), b""):
            if sink is not None:
                sink.write(chunk)
            elif not overflow.keep(buffer, chunk):
                return
    except (OSError, EOFError, paramiko.SSHException):
        pass


def _feed(channel: paramiko.Channel, data: bytes | None) -> None:
    try:
        if data:
            # a memoryview: sendall slices what is left after every packet, and slicing bytes
            # copies them (a 64 MiB image chunk went at ~100 KB/s); a view's slice copies nothing
            channel.sendall(memoryview(data))
        channel.shutdown_write()  # EOF, so commands that read stdin finish
    except (OSError, EOFError, paramiko.SSHException):
        pass


STOP_GRACE = 1.0  # seconds a remote command has to end on TERM before it gets KILL


def _stop_remote(channel: paramiko.Channel) -> None:
    """End the remote command: TERM to its process group, KILL if it is still there a moment later,
    then drop the channel.

    Closing a channel alone leaves a non-pty command running on the server. OpenSSH (7.9+)
    honours the RFC 4254 "signal" request by signalling the session's process group; paramiko
    has no public call for it, so the message is built by hand. TERM first because sudo relays
    it to the command it runs as root (which the user's session may not signal itself), where a
    KILL would only end sudo and orphan the command. sshd refuses signals for root logins
    ("session signalling requires privilege separation"), so those may outlive the stop; the
    executor is freed either way.
    """
    _signal(channel, "TERM")
    if not channel.status_event.wait(STOP_GRACE):
        _signal(channel, "KILL")
    channel.close()


def _signal(channel: paramiko.Channel, name: str) -> None:
    try:
        message = Message()
        message.add_byte(cMSG_CHANNEL_REQUEST)
        message.add_int(channel.remote_chanid)
        message.add_string("signal")
        message.add_boolean(False)
        message.add_string(name)
        channel.transport._send_user_message(message)
    except Exception:  # best effort: the channel may already be gone
        log.debug("could not signal the remote command", exc_info=True)
