"""`POST /webhooks/resend`: Resend's delivery events, verified, deduplicated and handed to Restate.

Guarantee: nothing is acted on unless Resend's own verifier (the `resend` SDK, Svix scheme) accepts
the raw body's signature under `RESEND_WEBHOOK_SECRET` within its ±5 min timestamp tolerance. A
verified webhook about one of our emails is handed, raw body and Svix headers as received, to
`ResendWebhook/receive` under the ingress idempotency key `resend-webhook/<svix-id>`, so a re-delivered
event is processed once; that handler verifies the signature again itself before anything reaches
`EmailDelivery.record` (which the ingress cannot call), so this route is a fast first check, not the
only one. The 200 is sent only after Restate has durably accepted the webhook, so Resend retries
anything we could not take. Bad requests get a 4xx with a reason; nothing here ever answers 500.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import resend
import restate
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from countersign.objects.resend_events import (
    MAX_PAYLOAD,
    SVIX_ID,
    WebhookDelivery,
    delivery_events,
    idempotency_key,
    receive,
)
from countersign.security.codec import journal_codec
from countersign.settings import Settings

log = logging.getLogger("countersign.webhooks")

MAX_BODY = MAX_PAYLOAD


def _answer(http_status: int, **body: str) -> JSONResponse:
    return JSONResponse(body, status_code=http_status, headers={"Cache-Control": "no-store"})


class ResendWebhooks:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # The same codec as every client of ours: the server journals a call's input as it arrives,
        # so without it each DeliveryEvent (email id, bounce detail) would sit there in plaintext.
        self.codec = journal_codec(settings)

    def routes(self) -> list[Route]:
        return [Route("/webhooks/resend", self.receive, methods=["POST"])]

    async def receive(self, request: Request) -> Response:
        secret = self.settings.resend_webhook_secret
        if not secret:
            return _answer(503, error="webhooks are not configured (RESEND_WEBHOOK_SECRET is not set)")
        body = await bounded_body(request)
        if body is None:
            return _answer(413, error=f"the body is larger than {MAX_BODY} bytes")
        svix = {name: request.headers.get(f"svix-{name}", "") for name in ("id", "timestamp", "signature")}
        if not all(svix.values()) or not SVIX_ID.fullmatch(svix["id"]):
            return _answer(400, error="svix-id, svix-timestamp and svix-signature headers are required")
        try:
            payload = body.decode("utf-8")
            verified: Any = resend.Webhooks.verify(
                {"payload": payload, "headers": svix, "webhook_secret": secret}  # type: ignore[typeddict-item]
            )
        except UnicodeDecodeError:
            return _answer(400, error="the body is not UTF-8")
        except ValueError as exc:
            return _answer(401, error=f"signature not accepted: {exc}")

        if not delivery_events(svix["id"], verified):
            return _answer(200, status="ignored")
        try:
            delivery = WebhookDelivery(
                svix_id=svix["id"], svix_timestamp=svix["timestamp"], svix_signature=svix["signature"], payload=payload
            )
        except ValidationError:
            return _answer(400, error="svix-timestamp must be a Unix time in seconds")
        try:
            codec = journal_codec(self.settings)
            async with restate.create_client(self.settings.restate_ingress_url, journal_value_codec=codec) as client:
                await client.service_send(receive, arg=delivery, idempotency_key=idempotency_key(svix["id"]))
        except (restate.HttpError, httpx.HTTPError) as exc:
            log.warning("could not hand a webhook event to Restate: %s", type(exc).__name__)
            return _answer(503, error="could not record the event now; retry later")
        return _answer(200, status="accepted")


async def bounded_body(request: Request) -> bytes | None:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
