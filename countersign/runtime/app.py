"""The ASGI apps: the Restate endpoint under `/restate/`, and the public one (the approval pages, the
Resend webhook and `/healthz`); `create_app` serves both as one app, for platforms that give one port.
`create_app` and `restate_app` are public API: they also serve the user's own Restate services (see
countersign.runtime.services), so one endpoint and one registration carry both, and take the user's
tools as `Tool` objects (see countersign.tools for which tools a process serves).

Guarantee: any error a page handler did not expect becomes a uniform 500 page with no detail, every
page response carries the security headers, no page handler runs before its whole request body has
arrived (within PAGES_BODY_TIMEOUT_SECONDS), and the Restate endpoint is exactly the SDK's, with the
request identity keys and the journal cipher applied when configured (startup requires both outside
dev); the pages call Restate through a client that uses the same cipher.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Sequence
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

from countersign.observability import tracing
from countersign.runtime import h2_streams, startup
from countersign.runtime.services import RestateService, endpoint_services
from countersign.security.codec import journal_codec
from countersign.settings import Settings, get_settings
from countersign.tools import use_tools
from countersign.tools.registry import Tool
from countersign.web.api import ApproverApi
from countersign.web.grant_page import GrantPage
from countersign.web.hardening import RESTATE_PREFIX, BodyDeadline, SecurityHeaders, http_error
from countersign.web.inbox_page import InboxPage
from countersign.web.pages import ApprovalPages
from countersign.web.runs_client import runs_client
from countersign.web.slack import SlackInteractions
from countersign.web.views import notice
from countersign.web.webhooks import ResendWebhooks

log = logging.getLogger("countersign.app")


def restate_endpoint(
    settings: Settings, services: Sequence[RestateService] = (), tools: Iterable[Tool] | None = None
) -> RestateAppT:
    """Countersign's services, those named by COUNTERSIGN_SERVICES, then `services`; all of them under
    the same request identity keys and journal codec, serving the process's tools (`tools`, when
    given, become them: `countersign.tools.use_tools`). hypercorn, in this process, then schedules its
    HTTP/2 streams with `h2_streams` (a waiting invocation holds one open for minutes), and its
    handlers export spans when the OTEL settings ask for it (countersign.observability.tracing)."""
    use_tools(settings, tools, own_services=bool(services))
    h2_streams.install()
    tracing.configure(settings)
    return restate.app(
        services=endpoint_services(settings, services),
        identity_keys=settings.restate_identity_keys or None,
        journal_value_codec=journal_codec(settings),
    )


async def healthz(_: Request) -> Response:
    return PlainTextResponse("ok")


async def unexpected(_: Request, exc: Exception) -> Response:
    log.error("unexpected error in a page handler: %s", type(exc).__name__)
    return notice(500, "Something went wrong", "Nothing was decided. Please try again in a minute.")


def public_app(settings: Settings) -> Starlette:
    """The pages, the webhook and `/healthz` (what the public listener serves)."""

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
            *SlackInteractions(settings).routes(),
            *InboxPage(settings).routes(),
            *ApproverApi(settings).routes(),
            *GrantPage(settings).routes(),
        ],
        lifespan=lifespan,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(BodyDeadline, seconds=settings.pages_body_timeout_seconds),
        ],
        exception_handlers={HTTPException: http_error, Exception: unexpected},
    )
    # No redirects at all: Starlette would build the slash-redirect's Location from the Host header.
    pages.router.redirect_slashes = False
    return pages


def with_restate(endpoint: RestateAppT, rest: ASGIApp) -> ASGIApp:
    """`/restate/...` goes straight to the SDK, everything else (lifespan included) to `rest`.
    Mounted inside Starlette, every frame the SDK streams would pass through its middleware layers."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope["path"]).startswith(RESTATE_PREFIX + "/"):
            await endpoint({**scope, "root_path": scope.get("root_path", "") + RESTATE_PREFIX}, receive, send)
        else:
            await rest(scope, receive, send)

    return app


_ENDPOINT_ONLY = (
    f"not found: this listener serves the Restate endpoint only, under {RESTATE_PREFIX}/"
    f" (register its URL ending in {RESTATE_PREFIX})"
)


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":  # nothing to start or stop
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] == "websocket":
        await send({"type": "websocket.close"})
        return
    # restate-server quotes this body when a registration misses the prefix ("META0003 ... Body: ...").
    await PlainTextResponse(_ENDPOINT_ONLY, status_code=404)(scope, receive, send)


def restate_app(
    settings: Settings, services: Sequence[RestateService] = (), *, tools: Iterable[Tool] | None = None
) -> ASGIApp:
    """The Restate endpoint under `/restate/` and nothing else (what the Restate listener serves):
    Countersign's services, those named by COUNTERSIGN_SERVICES and `services` (Restate Services,
    VirtualObjects, Workflows), for COUNTERSIGN_TOOLS's tools and `tools` (`Tool` objects).
    A service that is not one of those, or a name served twice, raises ServicesError (a ValueError);
    tools that cannot be served, ToolsError or PolicyError; no tools and no services of your own
    outside dev, SettingsError naming COUNTERSIGN_TOOLS (all of them CountersignError)."""
    return with_restate(restate_endpoint(settings, services, tools), _not_found)


def create_app(
    settings: Settings | None = None, services: Sequence[RestateService] = (), *, tools: Iterable[Tool] | None = None
) -> ASGIApp:
    """Everything on one app (one port): `restate_app`'s endpoint under `/restate/`, the public app for
    the rest. `services`, `tools` and their errors as for `restate_app`. Without `settings`, they are
    read from the environment and checked as `serve` checks them before it serves (keys, model,
    outbox, tools, services): a CountersignError names the first problem."""
    if settings is None:
        settings = get_settings()
        if tools is not None or services:
            use_tools(settings, tools, own_services=bool(services))
        startup.check(settings)
    return with_restate(restate_endpoint(settings, services, tools), public_app(settings))
