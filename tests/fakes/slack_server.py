"""A local fake of Slack's Web API for tests, reached by the real `slack_sdk` (`SLACK_API_BASE`),
and the signed interactivity payloads Slack would send when a person clicks.

Guarantee: a small Starlette app served by hypercorn on 127.0.0.1 (a free port) in a thread of the
test process; `stop` (or leaving `running()`) shuts it down and joins it. It implements the methods
Countersign calls (users.lookupByEmail, users.info, conversations.open, conversations.history,
chat.postMessage, chat.update, chat.postEphemeral, views.open), refuses a request without the bot
token, records every request, every posted message (with its updates) and every ephemeral message
and opened view. `fail("chat.postMessage", ...)` makes a method answer 429 with `Retry-After` or a
5xx until `heal()`, or for the next N calls (faults given one after the other apply in that order);
with `about=` only the requests whose parameters contain that text (an approval id: one test's
messages), so tests can share one fake. The look-ups
take `about` too (a message's metadata, a request's parameters); a view is found by the message
clicked, an ephemeral message by the user told. A person may have several user ids (`add_user`,
e.g. one per test, so what Slack tells that id is the test's own); an email finds the first.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx
from hypercorn.asyncio import serve
from hypercorn.config import Config
from slack_sdk.signature import SignatureVerifier
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from support.processes import free_port, wait_until

BOT_TOKEN = "xoxb-test-" + "t" * 24
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    metadata: dict[str, Any] | None
    updates: list[dict[str, Any]] = field(default_factory=list)

    @property
    def current(self) -> dict[str, Any]:
        """The message as it reads now (after its last update)."""
        return self.updates[-1] if self.updates else {"text": self.text, "blocks": self.blocks}

    @property
    def shown(self) -> str:
        """Every text in the current blocks, joined (to assert on what a person reads)."""
        return json.dumps(self.current["blocks"], ensure_ascii=False)

    @property
    def buttons(self) -> list[dict[str, Any]]:
        return [e for b in self.current["blocks"] if b.get("type") == "actions" for e in b["elements"]]


@dataclass
class Fault:
    status: int
    retry_after: str | None
    remaining: int | None
    """None: until healed."""
    about: str | None = None
    """Only requests whose parameters contain this text; None: every request of the method."""


@dataclass
class Seen:
    method: str
    at: float
    status: int
    params: str = ""
    """The request's parameters as JSON (what `about` is looked for in)."""


class FakeSlack:
    def __init__(self, users: dict[str, str]) -> None:
        """`users`: Slack user id -> email."""
        self.users = dict(users)
        self.messages: list[Message] = []
        self.ephemeral: list[dict[str, Any]] = []
        self.views: list[dict[str, Any]] = []
        self.seen: list[Seen] = []
        self.faults: list[tuple[str, Fault]] = []
        """(method, fault), in the order given: the first that applies to a request answers it."""
        self._lock = threading.Lock()
        self._clock = 1_700_000_000.0
        self.port = free_port()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, name="FakeSlack", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.url}/api/"

    # -- test controls -----------------------------------------------------------------------
    def add_user(self, uid: str, email: str) -> None:
        with self._lock:
            self.users[uid] = email

    def fail(
        self,
        method: str,
        status: int,
        *,
        retry_after: str | None = None,
        times: int | None = None,
        about: str | None = None,
    ) -> None:
        """Answer `method` with `status` (for the next `times` calls, else until healed), after the
        faults given before it for the same requests are used up."""
        with self._lock:
            self.faults.append((method, Fault(status, retry_after, times, about)))

    def heal(self, about: str | None = None) -> None:
        """Ends the faults given with this `about` (None: every fault)."""
        with self._lock:
            self.faults = [(m, f) for m, f in self.faults if about is not None and f.about != about]

    def calls(self, method: str, about: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.method == method and (about is None or about in s.params)]

    def messages_about(self, about: str | None = None) -> list[Message]:
        """The messages posted, or those whose metadata contains `about` (an approval id)."""
        with self._lock:
            return [m for m in self.messages if about is None or about in json.dumps(m.metadata)]

    def wait_message(self, count: int = 1, timeout: float = 60, about: str | None = None) -> list[Message]:
        def posted() -> list[Message] | None:
            found = self.messages_about(about)
            return found if len(found) >= count else None

        return wait_until(posted, timeout, "slack posts")

    def views_for(self, message: Message) -> list[dict[str, Any]]:
        """The modals opened from a click on `message` (by its trigger id, as `click` makes it)."""
        with self._lock:
            return [v for v in self.views if str(v.get("trigger_id", "")).endswith(f"-{message.ts}")]

    def told(self, user: str) -> list[dict[str, Any]]:
        """The ephemeral messages sent to `user`, oldest first."""
        with self._lock:
            return [e for e in self.ephemeral if e["user"] == user]

    # -- the Web API ---------------------------------------------------------------------------
    def _ts(self) -> str:
        self._clock += 1
        return f"{self._clock:.6f}"

    def _answer(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        shown = json.dumps(params)
        fault = next((f for name, f in self.faults if name == method and (f.about or "") in shown), None)
        if fault is not None:
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self.faults.remove((method, fault))
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            error = "ratelimited" if fault.status == 429 else "internal_error"
            return fault.status, {"ok": False, "error": error}, headers
        by_email: dict[str, str] = {}
        for user_id, email in self.users.items():
            by_email.setdefault(email, user_id)
        match method:
            case "users.lookupByEmail":
                uid = by_email.get(str(params.get("email", "")).lower())
                return (
                    (200, {"ok": True, "user": {"id": uid}}, {})
                    if uid
                    else (200, {"ok": False, "error": "users_not_found"}, {})
                )
            case "users.info":
                uid = str(params.get("user", ""))
                if uid not in self.users:
                    return 200, {"ok": False, "error": "user_not_found"}, {}
                return 200, {"ok": True, "user": {"id": uid, "profile": {"email": self.users[uid]}}}, {}
            case "conversations.open":
                return 200, {"ok": True, "channel": {"id": "D" + str(params.get("users", ""))}}, {}
            case "conversations.history":
                channel = str(params.get("channel", ""))
                found = [
                    {"ts": m.ts, "text": m.text, "metadata": m.metadata}
                    for m in reversed(self.messages)
                    if m.channel == channel
                ]
                return 200, {"ok": True, "messages": found[: int(params.get("limit", 100))]}, {}
            case "chat.postMessage":
                message = Message(
                    channel=str(params["channel"]),
                    ts=self._ts(),
                    text=str(params.get("text", "")),
                    blocks=list(params.get("blocks") or []),
                    metadata=params.get("metadata"),
                )
                self.messages.append(message)
                return 200, {"ok": True, "channel": message.channel, "ts": message.ts}, {}
            case "chat.update":
                for m in self.messages:
                    if m.channel == params.get("channel") and m.ts == params.get("ts"):
                        m.updates.append({"text": params.get("text", ""), "blocks": list(params.get("blocks") or [])})
                        return 200, {"ok": True, "channel": m.channel, "ts": m.ts}, {}
                return 200, {"ok": False, "error": "message_not_found"}, {}
            case "chat.postEphemeral":
                self.ephemeral.append(dict(params))
                return 200, {"ok": True, "message_ts": self._ts()}, {}
            case "views.open":
                self.views.append(dict(params))
                return 200, {"ok": True, "view": {"id": f"V{len(self.views)}", **params.get("view", {})}}, {}
        return 200, {"ok": False, "error": "unknown_method"}, {}

    async def _api(self, request: Request) -> JSONResponse:
        method = request.path_params["method"]
        if request.headers.get("authorization") != f"Bearer {BOT_TOKEN}":
            return JSONResponse({"ok": False, "error": "invalid_auth"})
        raw = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            params = json.loads(raw or b"{}")
        else:
            params = dict((await request.form()).items())
        with self._lock:
            status, body, headers = self._answer(method, params)
            self.seen.append(Seen(method, time.monotonic(), status, json.dumps(params)))
        return JSONResponse(body, status_code=status, headers=headers)

    # -- lifecycle -------------------------------------------------------------------------------
    def _serve(self) -> None:
        app = Starlette(routes=[Route("/api/{method}", self._api, methods=["POST"])])
        config = Config()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.accesslog = None
        config.errorlog = None

        async def main() -> None:
            self._stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            await serve(app, config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        asyncio.run(main())

    def start(self) -> FakeSlack:
        self._thread.start()

        def up() -> bool:
            try:
                httpx.post(f"{self.api_base}api.test", timeout=1)
            except httpx.HTTPError:
                return False
            return True

        wait_until(up, 15, "the fake Slack API to listen")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


@contextmanager
def running(fake: FakeSlack) -> Iterator[FakeSlack]:
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def slack_env(fake: FakeSlack) -> dict[str, str]:
    return {"SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET, "SLACK_API_BASE": fake.api_base}


# -- what Slack sends when a person clicks ---------------------------------------------------------
def signed(
    payload: dict[str, Any], *, secret: str = SIGNING_SECRET, at: float | None = None
) -> tuple[str, dict[str, str]]:
    """The form body and headers Slack sends for `payload`, signed with `secret` at time `at`."""
    body = urlencode({"payload": json.dumps(payload)})
    timestamp = str(int(time.time() if at is None else at))
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": timestamp,
        "x-slack-signature": signature or "",
    }
    return body, headers


def click(message: Message, user: str, action: str = "countersign_approve") -> dict[str, Any]:
    """The `block_actions` payload of `user` pressing a button of `message`."""
    [button] = [b for b in message.buttons if b["action_id"] == action]
    return {
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": f"trigger-{user}-{message.ts}",
        "container": {"type": "message", "channel_id": message.channel, "message_ts": message.ts},
        "channel": {"id": message.channel},
        "message": {"text": message.text, "ts": message.ts},
        "actions": [{"action_id": action, "value": button["value"], "type": "button"}],
    }


def submit(
    view: dict[str, Any],
    user: str,
    *,
    reason: str = "",
    confirm: str | None = None,
    view_id: str = "V1",
    grant: str | None = None,
) -> dict[str, Any]:
    """The `view_submission` payload of `user` submitting the modal `view` (as opened); `grant` the
    value of the standing approval's option they chose."""
    values: dict[str, Any] = {"reason": {"reason_input": {"type": "plain_text_input", "value": reason}}}
    if confirm is not None:
        values["confirm"] = {"confirm_input": {"type": "plain_text_input", "value": confirm}}
    if grant is not None:
        values["grant"] = {"grant_input": {"type": "static_select", "selected_option": {"value": grant}}}
    return {
        "type": "view_submission",
        "user": {"id": user},
        "view": {
            "id": view_id,
            "callback_id": view["callback_id"],
            "private_metadata": view["private_metadata"],
            "state": {"values": values},
        },
    }
