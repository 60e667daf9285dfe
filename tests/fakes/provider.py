"""A scripted model provider over real HTTP: the base of the OpenAI and Anthropic fakes.

Guarantee: it binds 127.0.0.1 on a port the OS picks, records every request it receives (path,
headers, JSON body) before answering, routes by the request's `model` field to that model's script
of replies (so tests sharing one fake never see each other's traffic), and answers a request that
no script covers with a 400 the run reports, never a hang. A model `retire`d answers every later
request with the provider's own 404 "model not found", as a real provider does for a retired model.
`stop()` ends it; every wait is bounded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Reply:
    status: int
    body: JsonObject
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    """Seconds to hold the answer back (bounded by stop(): a stopping fake answers at once)."""


Step = Reply | Callable[[JsonObject], Reply]
"""A fixed reply, or a function of the request body (to react to what the model was told)."""


@dataclass(frozen=True)
class Seen:
    path: str
    headers: dict[str, str]
    body: JsonObject
    at: float
    """time.monotonic() when the request arrived."""


class FakeProvider:
    """Subclasses set `path` and implement `refuse_unauthorised` and `no_script` in the provider's shapes."""

    path = "/"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Step]] = {}
        self._seen: list[Seen] = []
        self._retired: set[str] = set()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=type(self).__name__, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def script(self, model: str, *steps: Step) -> None:
        """The replies to the next requests for `model`, in order."""
        with self._lock:
            self._scripts.setdefault(model, []).extend(steps)

    def retire(self, model: str) -> None:
        """From now on, every request for `model` gets the provider's 404 model-not-found answer."""
        with self._lock:
            self._retired.add(model)

    def model_gone(self, model: str) -> Reply:
        raise NotImplementedError

    def seen(self, model: str) -> list[Seen]:
        with self._lock:
            return [s for s in self._seen if s.body.get("model") == model]

    def refuse_unauthorised(self, headers: dict[str, str]) -> Reply | None:
        raise NotImplementedError

    def no_script(self, model: str, count: int) -> Reply:
        raise NotImplementedError

    def _answer(self, path: str, headers: dict[str, str], raw: bytes) -> Reply:
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"unparsed": raw.decode(errors="replace")}
        model = str(body.get("model", ""))
        with self._lock:
            self._seen.append(Seen(path, headers, body, time.monotonic()))
            count = sum(1 for s in self._seen if s.body.get("model") == model)
            if (refusal := self.refuse_unauthorised(headers)) is not None:
                return refusal
            if model in self._retired:
                return self.model_gone(model)
            script = self._scripts.get(model, [])
            step = script.pop(0) if path == self.path and script else None
        if step is None:
            return self.no_script(model, count)
        return step(body) if callable(step) else step

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = fake._answer(self.path.split("?")[0], headers, raw)
                if reply.delay:
                    fake._stopping.wait(reply.delay)
                payload = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): that is what a delayed reply tests

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
