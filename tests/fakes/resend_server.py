"""A local fake of the Resend API for tests, driven through the real `resend` SDK (`RESEND_API_URL`).

Guarantee: `POST /emails` and `POST /emails/batch` follow Resend's documented idempotency rules
(same key + same body → the same id and no second email; same key + a different body → 409
`invalid_idempotent_request`; same key while the first is still in progress → 409
`concurrent_idempotent_requests`); `accepted` holds each distinct email once, `requests` every
request. Faults queued with `fail_next` answer the next requests instead (429 with `retry-after`,
500, 502 HTML, slow, dropped connection, a final 4xx). The server binds 127.0.0.1 on a free port
in a thread of the test process; `stop` (or leaving `running()`) shuts it down and joins it.
`webhook` builds Resend (Svix) signed webhook deliveries for an accepted email.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import httpx

FaultKind = Literal["rate_limit", "server_error", "bad_gateway", "slow", "drop", "reject"]
_ADDRESS = re.compile(r"^(?:[^<>@]*<)?[^<>@\s]+@[^<>@\s]+\.[A-Za-z]{2,}>?$")
_TAG = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
MAX_SLOW = 30.0


@dataclass(frozen=True)
class Fault:
    """What the fake does with one request instead of (or around) handling it normally.

    `slow` and `drop` with `accept=True` take the email first, then answer late or not at all:
    the ambiguous failures where only the idempotency key prevents a duplicate.
    """

    kind: FaultKind
    retry_after: str = "1"
    seconds: float = 0.0
    accept: bool = False
    status: int = 422
    name: str = "validation_error"
    message: str = "The `to` field is invalid."


@dataclass
class Accepted:
    id: str
    idempotency_key: str | None
    params: dict[str, Any]
    at: float

    @property
    def tags(self) -> dict[str, str]:
        return {t["name"]: t.get("value", "") for t in self.params.get("tags") or []}

    @property
    def to(self) -> list[str]:
        to = self.params["to"]
        return [to] if isinstance(to, str) else list(to)


@dataclass
class Received:
    at: float
    path: str
    idempotency_key: str | None
    status: int = 0
    """0 while in progress, -1 for a dropped connection."""


@dataclass
class _Entry:
    digest: str
    ids: list[str]
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class WebhookDelivery:
    body: bytes
    headers: dict[str, str]


class FakeResend:
    def __init__(self) -> None:
        self.accepted: list[Accepted] = []
        self.requests: list[Received] = []
        self.webhook_secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        self._faults: list[Fault] = []
        self._keys: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-resend", daemon=True
        )

    @classmethod
    @contextmanager
    def running(cls) -> Iterator[FakeResend]:
        fake = cls()
        fake._thread.start()
        try:
            yield fake
        finally:
            fake.stop()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def fail_next(self, *faults: Fault) -> None:
        with self._lock:
            self._faults.extend(faults)

    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def requests_for(self, key: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.idempotency_key == key]

    def accepted_for(self, key: str) -> list[Accepted]:
        with self._lock:
            return [a for a in self.accepted if a.idempotency_key == key]

    # ----------------------------------------------------------------------------------------------
    # Webhooks, signed as Resend (Svix) signs them

    def webhook(
        self,
        event_type: str,
        email: Accepted,
        *,
        svix_id: str | None = None,
        timestamp: int | None = None,
        secret: str | None = None,
    ) -> WebhookDelivery:
        """A signed delivery of `event_type` about `email`, as Resend would POST it."""
        return signed(email_event(event_type, email), secret or self.webhook_secret, svix_id, timestamp)

    @staticmethod
    def post_webhook(url: str, delivery: WebhookDelivery) -> httpx.Response:
        return httpx.post(url, content=delivery.body, headers=delivery.headers, timeout=30, trust_env=False)

    # ----------------------------------------------------------------------------------------------
    # Request handling (called from the server's threads)

    def _next_fault(self) -> Fault | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes] | None:
        """(status, headers, body) to answer, or None to drop the connection."""
        key = headers.get("idempotency-key")
        received = Received(at=time.time(), path=path, idempotency_key=key)
        with self._lock:
            self.requests.append(received)
        answer = self._answer(path, headers, body, key)
        received.status = -1 if answer is None else answer[0]
        return answer

    def _answer(
        self, path: str, headers: dict[str, str], body: bytes, key: str | None
    ) -> tuple[int, dict[str, str], bytes] | None:
        if path not in ("/emails", "/emails/batch"):
            return _error(404, "not_found", "The requested endpoint does not exist.")
        if not headers.get("authorization", "").removeprefix("Bearer ").strip():
            return _error(401, "missing_api_key", "Missing API key in the authorization header.")
        fault = self._next_fault()
        if fault is not None and not fault.accept:
            if fault.kind == "slow":
                self._stopping.wait(min(fault.seconds, MAX_SLOW))
            return _fault_answer(fault)
        if key is not None and not 1 <= len(key) <= 256:
            return _error(400, "invalid_idempotency_key", "The key must be between 1-256 chars.")
        try:
            payload = json.loads(body)
        except ValueError:
            return _error(422, "validation_error", "The body is not valid JSON.")
        items = payload if path == "/emails/batch" else [payload]
        if not isinstance(items, list) or not 1 <= len(items) <= 100:
            return _error(422, "validation_error", "A batch holds 1 to 100 emails.")
        for item in items:
            if (problem := _invalid(item)) is not None:
                return _error(422, "validation_error", problem)

        entry, conflict = self._claim(path, key, hashlib.sha256(body).hexdigest(), items)
        if conflict is not None:
            return conflict
        if fault is not None:
            if fault.kind == "drop":
                entry.done.set()
                return None
            self._stopping.wait(min(fault.seconds, MAX_SLOW))
        entry.done.set()
        if path == "/emails":
            return _json(200, {"id": entry.ids[0]})
        return _json(200, {"data": [{"id": i} for i in entry.ids]})

    def _claim(
        self, path: str, key: str | None, digest: str, items: list[dict[str, Any]]
    ) -> tuple[_Entry, tuple[int, dict[str, str], bytes] | None]:
        with self._lock:
            existing = self._keys.get((path, key)) if key is not None else None
            if existing is not None:
                if existing.digest != digest:
                    problem = _error(
                        409, "invalid_idempotent_request", "Same idempotency key used with a different request payload."
                    )
                    return existing, problem
                if not existing.done.is_set():
                    problem = _error(
                        409,
                        "concurrent_idempotent_requests",
                        "Same idempotency key used while original is in progress.",
                    )
                    return existing, problem
                return existing, None
            now = time.time()
            entry = _Entry(digest=digest, ids=[str(uuid.uuid4()) for _ in items])
            for email_id, item in zip(entry.ids, items, strict=True):
                self.accepted.append(Accepted(id=email_id, idempotency_key=key, params=item, at=now))
            if key is not None:
                self._keys[(path, key)] = entry
            return entry, None


def email_event(event_type: str, email: Accepted) -> bytes:
    """The JSON body Resend sends for an event about one email (tags as a name → value object)."""
    data: dict[str, Any] = {
        "created_at": datetime.fromtimestamp(email.at, UTC).isoformat(),
        "email_id": email.id,
        "from": email.params["from"],
        "to": email.to,
        "subject": email.params["subject"],
        "message_id": f"<{email.id}@resend.fake>",
        "tags": email.tags,
    }
    if event_type == "email.bounced":
        data["bounce"] = {
            "message": f"The recipient's mail server rejected {email.to[0]}: mailbox does not exist.",
            "subType": "General",
            "type": "Permanent",
        }
    event = {"type": event_type, "created_at": datetime.now(UTC).isoformat(), "data": data}
    return json.dumps(event).encode()


def signed(body: bytes, secret: str, svix_id: str | None = None, timestamp: int | None = None) -> WebhookDelivery:
    """`body` with Svix headers signed by `secret` (`whsec_<base64>`), as Resend signs webhooks."""
    svix_id = svix_id or f"msg_{uuid.uuid4().hex}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signature = base64.b64encode(hmac.new(key, f"{svix_id}.{timestamp}.".encode() + body, hashlib.sha256).digest())
    headers = {
        "svix-id": svix_id,
        "svix-timestamp": str(timestamp),
        "svix-signature": f"v1,{signature.decode()}",
        "content-type": "application/json",
    }
    return WebhookDelivery(body=body, headers=headers)


def _invalid(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "Each email must be an object."
    for name in ("from", "to", "subject"):
        if not item.get(name):
            return f"Missing `{name}` field."
    if not (item.get("html") or item.get("text")):
        return "Missing `html` or `text` field."
    to = item["to"] if isinstance(item["to"], list) else [item["to"]]
    if len(to) > 50 or not all(isinstance(a, str) and _ADDRESS.match(a) for a in [*to, item["from"]]):
        return "Invalid `to` or `from` field. The email address needs to follow the `email@example.com` format."
    for tag in item.get("tags") or []:
        if not _TAG.match(str(tag.get("name", ""))) or not _TAG.match(str(tag.get("value", "x"))):
            return "Tags should only contain ASCII letters, numbers, underscores, or dashes."
    return None


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json", **(headers or {})}, json.dumps(payload).encode()


def _error(
    status: int, name: str, message: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return _json(status, {"statusCode": status, "name": name, "message": message}, headers)


def _fault_answer(fault: Fault) -> tuple[int, dict[str, str], bytes] | None:
    match fault.kind:
        case "rate_limit":
            limits = {"retry-after": fault.retry_after, "ratelimit-limit": "2", "ratelimit-remaining": "0"}
            return _error(
                429, "rate_limit_exceeded", "Too many requests. You can only make 2 requests per second.", limits
            )
        case "server_error":
            return _error(500, "application_error", "An unexpected error occurred.")
        case "bad_gateway":
            return 502, {"content-type": "text/html"}, b"<html><body>502 Bad Gateway</body></html>"
        case "reject":
            return _error(fault.status, fault.name, fault.message)
        case "drop":
            return None
        case "slow":
            return _error(500, "application_error", "An unexpected error occurred.")


def _handler_for(fake: FakeResend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if 0 < length <= 10_000_000 else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            answer = fake._handle(self.path, headers, body)
            if answer is None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            status, response_headers, payload = answer
            try:
                self.send_response(status)
                for name, value in response_headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
