"""The one ASGI app: the Restate endpoint under `/restate/`, the approval pages, the Resend webhook and
`/healthz`.

Guarantee: any error a page handler did not expect becomes a uniform 500 page with no detail, every
page response carries the security headers, and the Restate endpoint is exactly the SDK's, with the
request identity keys and the journal cipher applied when configured (startup requires both outside
dev); the pages call Restate through a client that uses the same cipher.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import restate
from restate.server_types import RestateAppT
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from handlers.agent_run import agent_run
from handlers.audit import approval_audit
from handlers.codec import journal_codec
from handlers.delivery import email_delivery
from handlers.inbox import approval_inbox
from handlers.resend_events import resend_webhook
from handlers.settings import Settings
from handlers.trust import tool_stats, trust_ramp
from handlers.web.hardening import RESTATE_PREFIX, SecurityHeaders, http_error
from handlers.web.inbox_page import InboxPage
from handlers.web.pages import ApprovalPages
from handlers.web.runs_client import runs_client
from handlers.web.views import notice
from handlers.web.webhooks import ResendWebhooks

log = logging.getLogger("countersign.app")


def restate_endpoint(settings: Settings) -> RestateAppT:
    services: list[restate.Service | restate.VirtualObject | restate.Workflow] = [
        agent_run,
        approval_inbox,
        approval_audit,
        tool_stats,
        trust_ramp,
        email_delivery,
        resend_webhook,
    ]
    return restate.app(
        services=services,
        identity_keys=settings.restate_identity_keys or None,
        journal_value_codec=journal_codec(settings),
    )


async def healthz(_: Request) -> Response:
    return PlainTextResponse("ok")


async def unexpected(_: Request, exc: Exception) -> Response:
    log.error("unexpected error in a page handler: %s", type(exc).__name__)
    return notice(500, "Something went wrong", "Nothing was decided. Please try again in a minute.")


def create_app(settings: Settings) -> ASGIApp:
    """`/restate/...` goes straight to the SDK; Starlette (pages, webhook, health) gets the rest.
    Mounted inside Starlette, every frame the SDK streams would pass through its middleware layers."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with runs_client(settings.restate_ingress_url, journal_codec(settings)) as client:
            app.state.runs = client
            yield

    pages = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            *ApprovalPages(settings).routes(),
            *ResendWebhooks(settings).routes(),
            *InboxPage(settings).routes(),
        ],
        lifespan=lifespan,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={HTTPException: http_error, Exception: unexpected},
    )
    # No redirects at all: Starlette would build the slash-redirect's Location from the Host header.
    pages.router.redirect_slashes = False
    endpoint = restate_endpoint(settings)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope["path"]).startswith(RESTATE_PREFIX + "/"):
            await endpoint({**scope, "root_path": scope.get("root_path", "") + RESTATE_PREFIX}, receive, send)
        else:
            await pages(scope, receive, send)

    return app
