"""A TCP forwarder in front of a test server that can be switched off: while it is off, connecting to
its port is refused (a provider outage as the client sees it), and live connections are cut.

Guarantee: the port stays the same across off/on; every socket and thread it opens is closed and
joined by `off()` (and by `close()`), so nothing outlives the test.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

from support.processes import free_port


class Switch:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def is_on(self) -> bool:
        return self._listener is not None

    def on(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._spawn(self._accept, listener)

    def off(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        with self._lock:
            live, self._sockets = self._sockets, set()
            threads, self._threads = self._threads, []
        for sock in live:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in threads:
            thread.join(timeout=10)

    close = off

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # switched off
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            ends = threading.Semaphore(0)
            self._spawn(self._pipe, client, upstream, ends)
            self._spawn(self._pipe, upstream, client, ends)

    def _pipe(self, source: socket.socket, sink: socket.socket, ends: threading.Semaphore) -> None:
        with suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        if ends.acquire(blocking=False):  # the other direction finished first: the connection is done
            with self._lock:
                self._sockets -= {source, sink}
            source.close()
            sink.close()
        else:
            ends.release()
