"""A local receiver of Countersign's outbound webhooks, verifying them with `standardwebhooks`.

Guarantee: every request is verified from the receiver's side with the same library the sender signs
with (headers, signature, timestamp tolerance); `deliveries` holds each verified one in arrival order
(duplicates included, so a test can count them), `rejected` the ones that failed verification. The
receiver can be down: `down()` closes its listening socket (connection refused) and `up()` binds the
same port again; `failing(n)` answers the next n requests 503 instead (`refuse_runs`: those of some
runs); `hold` makes requests wait (up to a bound) until released. It binds 127.0.0.1 on a free port
in a thread of the test process; `stop` (or leaving `running()`) shuts it down and joins the thread.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

MAX_HOLD = 30.0


@dataclass(frozen=True)
class Delivery:
    webhook_id: str
    type: str
    data: dict[str, Any]
    at: float


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WebhookReceiver:
    def __init__(self, secret: str | None = None, port: int | None = None) -> None:
        self.secret = secret or new_secret()
        self.port = port or _free_port()
        self.deliveries: list[Delivery] = []
        self.rejected: list[str] = []
        self.refused_503 = 0
        self.refuse_runs: set[str] = set()
        """Runs whose events are answered 503 (a receiver that chokes on one subject only)."""
        self._failing = 0
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self.held = threading.Event()
        """Set once a request has arrived while held."""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def up(self) -> None:
        if self._server is not None:
            return
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if not receiver._released.is_set():
                    receiver.held.set()
                    receiver._released.wait(MAX_HOLD)
                receiver._answer(self, body)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop listening: new connections are refused until `up`."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        assert self._thread is not None
        self._thread.join(10)
        self._server = None
        self._thread = None

    stop = down

    def failing(self, count: int) -> None:
        with self._lock:
            self._failing = count

    def hold(self) -> None:
        self.held.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def _answer(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        with self._lock:
            fail = self._failing > 0 or _run_of(body) in self.refuse_runs
            if fail:
                self._failing = max(0, self._failing - 1)
                self.refused_503 += 1
        if fail:
            handler.send_response(503)
            handler.send_header("retry-after", "0")
            handler.end_headers()
            return
        headers = {k: v for k, v in handler.headers.items()}
        try:
            payload = Webhook(self.secret).verify(body, headers)
        except (WebhookVerificationError, ValueError) as exc:
            with self._lock:
                self.rejected.append(str(exc))
            handler.send_response(401)
            handler.end_headers()
            return
        with self._lock:
            self.deliveries.append(
                Delivery(webhook_id=headers["webhook-id"], type=payload["type"], data=payload["data"], at=time.time())
            )
        handler.send_response(204)
        handler.end_headers()

    def unique(self) -> list[Delivery]:
        """The verified deliveries, the first of each webhook-id only, in arrival order."""
        seen: set[str] = set()
        first = []
        with self._lock:
            for delivery in self.deliveries:
                if delivery.webhook_id not in seen:
                    seen.add(delivery.webhook_id)
                    first.append(delivery)
        return first

    def ids_seen(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for delivery in self.deliveries:
                counts[delivery.webhook_id] = counts.get(delivery.webhook_id, 0) + 1
        return counts


def _run_of(body: bytes) -> str | None:
    try:
        return str(json.loads(body)["data"]["run_id"])
    except (ValueError, KeyError, TypeError):
        return None


@contextmanager
def running(*, start_up: bool = True, secret: str | None = None) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(secret)
    if start_up:
        receiver.up()
    try:
        yield receiver
    finally:
        receiver.release()
        receiver.down()


def config(tenant: str, *receivers: WebhookReceiver, events: list[str] | None = None) -> str:
    """A COUNTERSIGN_WEBHOOKS value sending `tenant`'s events to `receivers`."""
    endpoints = [
        {"name": f"r{n}", "url": r.url, "secret": r.secret, **({"events": events} if events else {})}
        for n, r in enumerate(receivers)
    ]
    return json.dumps({tenant: endpoints})
