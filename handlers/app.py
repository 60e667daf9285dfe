"""The one ASGI app: the Restate endpoint under `/restate`, the approval pages, the Resend webhook and
`/healthz`.

Guarantee: any error a page handler did not expect becomes a uniform 500 page with no detail, and
the Restate endpoint is exactly the SDK's (request identity keys applied when configured).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import restate
from restate.server_types import RestateAppT
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route

from handlers.agent_run import agent_run
from handlers.delivery import email_delivery
from handlers.settings import Settings
from handlers.web.pages import ApprovalPages
from handlers.web.runs_client import runs_client
from handlers.web.views import notice
from handlers.web.webhooks import ResendWebhooks

log = logging.getLogger("countersign.app")


def restate_endpoint(settings: Settings) -> RestateAppT:
    return restate.app(services=[agent_run, email_delivery], identity_keys=settings.restate_identity_keys or None)


async def healthz(_: Request) -> Response:
    return PlainTextResponse("ok")


async def unexpected(_: Request, exc: Exception) -> Response:
    log.error("unexpected error in a page handler: %s", type(exc).__name__)
    return notice(500, "Something went wrong", "Nothing was decided. Please try again in a minute.")


def create_app(settings: Settings) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with runs_client(settings.restate_ingress_url) as client:
            app.state.runs = client
            yield

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            *ApprovalPages(settings).routes(),
            *ResendWebhooks(settings).routes(),
            Mount("/restate", app=restate_endpoint(settings)),
        ],
        lifespan=lifespan,
        exception_handlers={Exception: unexpected},
    )
