"""Hardening of every page response: the security headers, one error page for every error, and a
deadline on request bodies.

Guarantee: every HTTP response of the app outside the Restate endpoint (pages, notices, 404, 405,
408, 413, 500, `/healthz`) carries `SECURITY_HEADERS`, whoever produced it; errors that routing raises
(unknown path, wrong method) render the same notice page as the approval pages' own refusals, never a
stack trace or the framework's plain text. No page handler runs before its whole request body has
arrived: a body still incomplete `seconds` after the request started gets a 408 and its connection
is closed, whatever the listener's own timeouts are.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from countersign.web.views import SECURITY_HEADERS, notice

RESTATE_PREFIX = "/restate"
MAX_REQUEST_BODY = 1024 * 1024
"""Above every route's own limit (forms 64 KiB, webhooks 256 KiB): only what `BodyDeadline` buffers."""
_TITLES = {404: "Not found", 405: "Not allowed", 408: "Too slow", 413: "Too large"}
_MESSAGES = {
    404: "There is no page here. Open the link from your email again.",
    405: "This page only answers GET, HEAD and POST from its own form.",
    408: "The request did not arrive in time. Nothing was decided. Please try again.",
    413: "The request is larger than any form here sends. Nothing was decided.",
}


def _is_restate(scope: Scope) -> bool:
    path = str(scope.get("path", ""))
    return path == RESTATE_PREFIX or path.startswith(RESTATE_PREFIX + "/")


log = logging.getLogger("countersign.pages")


class SecurityHeaders:
    """Pure ASGI middleware (it must not buffer the Restate endpoint's streams, so it skips them)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _is_restate(scope):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self.headers if k not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyDeadline:
    """Pure ASGI middleware: read the whole request body (at most `max_bytes`) within `seconds` of the
    request's start, then hand it to the app; else answer 408 (413 if too large) and close.

    hypercorn has no body timeout: its idle timeout stops once a request's headers are in, and its
    read timeout only bounds the gap between two reads, so a client trickling a body would hold
    the connection and a handler for as long as it likes. Buffering first also means no handler
    ever waits on a client. The Restate endpoint is never wrapped (its streams last for minutes).
    """

    def __init__(self, app: ASGIApp, seconds: float, max_bytes: int = MAX_REQUEST_BODY) -> None:
        self.app = app
        self.seconds = seconds
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _is_restate(scope):
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(413, scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        # A closed tab or a dropped connection: nobody reads an answer, nothing failed.
                        log.info("a client disconnected before its form arrived; nothing was decided")
                        return
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_bytes:  # a body sent without its length (chunked) stops here
                        await _refuse(413, scope, receive, send)
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await _refuse(408, scope, receive, send)
            return
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            # The body once, then the client's own messages (a handler may wait for http.disconnect).
            nonlocal body
            if body is None:
                return await receive()
            message, body = body, None
            return message

        await self.app(scope, replay, send)


async def _refuse(status: int, scope: Scope, receive: Receive, send: Send) -> None:
    page = notice(status, _TITLES[status], _MESSAGES[status])
    if scope.get("http_version") in ("1.0", "1.1"):
        # The body was not read to its end, so the connection cannot carry another request (HTTP/2
        # forbids the header; there only this stream ends).
        page.headers["connection"] = "close"
    await page(scope, receive, send)


async def http_error(_: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    title = _TITLES.get(status, "Request refused")
    page = notice(status, title, _MESSAGES.get(status, "This request could not be handled. Nothing was decided."))
    if isinstance(exc, HTTPException) and exc.headers:
        page.headers.update(exc.headers)
    return page
