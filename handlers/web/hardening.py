"""Hardening of every page response: the security headers, and one error page for every error.

Guarantee: every HTTP response of the app outside the Restate endpoint (pages, notices, 404, 405,
500, `/healthz`) carries `SECURITY_HEADERS`, whoever produced it; errors that routing raises (unknown
path, wrong method) render the same notice page as the approval pages' own refusals, never a stack
trace or the framework's plain text.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handlers.web.views import SECURITY_HEADERS, notice

RESTATE_PREFIX = "/restate"
_TITLES = {404: "Not found", 405: "Not allowed"}
_MESSAGES = {
    404: "There is no page here. Open the link from your email again.",
    405: "This page only answers GET, HEAD and POST from its own form.",
}


class SecurityHeaders:
    """Pure ASGI middleware (it must not buffer the Restate endpoint's streams, so it skips them)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or path == RESTATE_PREFIX or path.startswith(RESTATE_PREFIX + "/"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self.headers if k not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


async def http_error(_: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    title = _TITLES.get(status, "Request refused")
    page = notice(status, title, _MESSAGES.get(status, "This request could not be handled. Nothing was decided."))
    if isinstance(exc, HTTPException) and exc.headers:
        page.headers.update(exc.headers)
    return page
