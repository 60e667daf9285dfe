"""`POST /webhooks/resend`: Resend's delivery events, verified, deduplicated and handed to Restate.

Guarantee: nothing is acted on unless Resend's own verifier (the `resend` SDK, Svix scheme) accepts
the raw body's signature under `RESEND_WEBHOOK_SECRET` within its ±5 min timestamp tolerance. A
verified event about one of our emails is handed to `EmailDelivery/<approval id>/record` (once per
approval a batch email covered) under the ingress idempotency key `resend-webhook/<svix-id>/<approval
id>`, so a re-delivered event is processed once; the
200 is sent only after Restate has durably accepted it, so Resend retries anything we could not take.
Bad requests get a 4xx with a reason; nothing here ever answers 500.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import resend
import restate
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from handlers.codec import journal_codec
from handlers.delivery import DeliveryEvent, record
from handlers.links import approval_id
from handlers.mail.intent import from_tag_value
from handlers.mail.resend_backend import scrub
from handlers.settings import Settings

log = logging.getLogger("countersign.webhooks")

MAX_BODY = 256 * 1024
_SVIX_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
_ITEMS = re.compile(r"(\d{1,6})s(\d{1,3})")


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
        body = await _bounded_body(request)
        if body is None:
            return _answer(413, error=f"the body is larger than {MAX_BODY} bytes")
        svix = {name: request.headers.get(f"svix-{name}", "") for name in ("id", "timestamp", "signature")}
        if not all(svix.values()) or not _SVIX_ID.match(svix["id"]):
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

        events = _delivery_events(svix["id"], verified)
        if not events:
            return _answer(200, status="ignored")
        try:
            ingress = self.settings.restate_ingress_url
            async with restate.create_client(ingress, journal_value_codec=self.codec) as client:
                for event in events:
                    key = f"resend-webhook/{svix['id']}/{event.approval_id}"
                    await client.object_send(record, key=event.approval_id, arg=event, idempotency_key=key)
        except (restate.HttpError, httpx.HTTPError) as exc:
            log.warning("could not hand a webhook event to Restate: %s", type(exc).__name__)
            return _answer(503, error="could not record the event now; retry later")
        return _answer(200, status="accepted")


async def _bounded_body(request: Request) -> bytes | None:
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


def _delivery_events(event_id: str, verified: Any) -> list[DeliveryEvent]:
    """The event as `EmailDelivery` records it, once per approval the email was about (a batch email
    names several); empty if it is not about one of our emails."""
    if not isinstance(verified, dict) or not isinstance(verified.get("data"), dict):
        return []
    data = verified["data"]
    tags = data.get("tags")
    if not isinstance(tags, dict):
        return []
    try:
        run_id = from_tag_value(str(tags.get("run_id", "")))
        first = DeliveryEvent.model_validate(
            {
                "event_id": event_id,
                "type": str(verified.get("type", "")),
                "email_id": str(data.get("email_id", "")),
                "kind": tags.get("kind"),
                "run_id": run_id,
                "approval_id": from_tag_value(str(tags.get("approval_id", ""))),
                "round": tags.get("round"),
                "slot": tags.get("slot"),
                "occurred_at": str(verified.get("created_at", ""))[:64],
                "detail": _detail(data),
            }
        )
    except (ValidationError, ValueError):
        return []
    items = _ITEMS.findall(str(tags.get("items", "")))
    if first.kind != "batch" or not items:
        return [first]
    return [
        first.model_copy(update={"approval_id": approval_id(run_id, int(index)), "slot": int(slot)})
        for index, slot in items
    ]


def _detail(data: dict[str, Any]) -> str:
    for name in ("bounce", "failed", "suppressed"):
        part = data.get(name)
        if isinstance(part, dict):
            kind = " ".join(str(part.get(k, "")) for k in ("type", "subType") if part.get(k))
            message = str(part.get("message") or part.get("reason") or "")
            return scrub(f"{kind}: {message}" if kind else message)
    return ""
