"""A vCenter that stops answering: a TCP proxy on 127.0.0.1 in front of a simulator that forwards both
ways until `silence()`, then forwards nothing, answers nothing and keeps every connection open (new
ones too: they are accepted, and left without a word, so a TLS handshake waits)."""

from __future__ import annotations

import socket
import threading
from typing import Any


class SilentProxy:
    def __init__(self, upstream_url: str):
        netloc = upstream_url.split("://", 1)[1].split("/", 1)[0]
        host, port = netloc.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.url = upstream_url.replace(netloc, f"{host}:{{port}}")
        self.silent = threading.Event()
        self._server = socket.create_server((host, 0))
        self.url = self.url.format(port=self._server.getsockname()[1])
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> "SilentProxy":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.close()
        with self._lock:
            for sock in self._held:
                sock.close()

    def silence(self) -> None:
        self.silent.set()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._held.append(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            self._keep(client)
            if self.silent.is_set():
                continue  # held open, never answered
            upstream = socket.create_connection(self.upstream)
            self._keep(upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    break
                if not self.silent.is_set():
                    sink.sendall(data)
            except OSError:
                break
        if not self.silent.is_set():  # an end passed on while forwarding; a silent proxy tells nothing
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass
