"""`ResendWebhook.receive`: the one public way into `EmailDelivery`, for Resend's signed webhooks.

Guarantee: `EmailDelivery.record` is `ingress_private`, so a provider event reaches it only through
this handler, which re-verifies the Svix signature over the raw body with `RESEND_WEBHOOK_SECRET`
itself (as `AgentRun.decide` re-verifies link tokens): whoever can reach the ingress cannot forge a
bounce. The web route (`countersign/web/webhooks.py`) checks the same signature and the ±5 min freshness
first and answers Resend; this handler, which may run later than that (Restate accepted the event
durably, the handler may have been down), accepts a signed timestamp up to `WEBHOOK_RETENTION` old,
the window in which the ingress idempotency key and `EmailDelivery`'s event-id dedupe fold a replayed
delivery into the original one. Each event is forwarded once per approval it is about.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from typing import Any

import restate
from pydantic import BaseModel, Field, ValidationError
from restate import Context, RunOptions, TerminalError

from countersign.contract import Strict
from countersign.inputs import Body
from countersign.mail.intent import from_tag_value
from countersign.mail.resend_backend import scrub
from countersign.objects.delivery import WEBHOOK_RETENTION, DeliveryEvent, record
from countersign.security.links import approval_id
from countersign.security.redact import clean_failures
from countersign.settings import get_settings

MAX_PAYLOAD = 256 * 1024
FUTURE_TOLERANCE_SECONDS = 300
SVIX_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
_ITEMS = re.compile(r"(\d{1,6})s(\d{1,3})")


class WebhookDelivery(Strict):
    """Input of `ResendWebhook.receive`: the webhook exactly as Resend sent it (headers and raw body)."""

    svix_id: str = Field(pattern=SVIX_ID.pattern)
    svix_timestamp: str = Field(pattern=r"^\d{1,12}$")
    svix_signature: str = Field(min_length=1, max_length=2000)
    payload: str = Field(min_length=1, max_length=MAX_PAYLOAD)


class VerifiedEvents(BaseModel):
    """The journaled answer of the signature check: the events to record, or why none are."""

    problem: str = ""
    events: list[DeliveryEvent] = Field(default_factory=list)


class WebhookAck(BaseModel):
    forwarded: int


def signature_problem(delivery: WebhookDelivery, secret: str, now: float, max_age: float) -> str | None:
    """Why the Svix signature (`v1,<base64 HMAC-SHA256 of id.timestamp.body>`) does not hold, or None.

    Written here rather than taken from the `resend` SDK because the SDK's verifier fixes its timestamp
    window at ±5 min, which a durably queued event may be past by the time this handler runs."""
    age = now - int(delivery.svix_timestamp)
    if age > max_age or age < -FUTURE_TOLERANCE_SECONDS:
        return f"signed timestamp outside the accepted window ({int(age)} s old)"
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        return "RESEND_WEBHOOK_SECRET is not base64"
    signed = f"{delivery.svix_id}.{delivery.svix_timestamp}.{delivery.payload}".encode()
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for candidate in delivery.svix_signature.split(" "):
        version, _, signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return None
    return "no matching signature"


def delivery_events(event_id: str, verified: Any) -> list[DeliveryEvent]:
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


def idempotency_key(svix_id: str, approval: str | None = None) -> str:
    """The ingress idempotency key of one webhook (and of its event for one approval)."""
    return f"resend-webhook/{svix_id}" if approval is None else f"resend-webhook/{svix_id}/{approval}"


def _verify(delivery: WebhookDelivery) -> VerifiedEvents:
    secret = get_settings().resend_webhook_secret
    if not secret:
        return VerifiedEvents(problem="webhooks are not configured (RESEND_WEBHOOK_SECRET is not set)")
    problem = signature_problem(delivery, secret, time.time(), WEBHOOK_RETENTION.total_seconds())
    if problem is not None:
        return VerifiedEvents(problem=f"signature not accepted: {problem}")
    try:
        verified = json.loads(delivery.payload)
    except ValueError:
        return VerifiedEvents(problem="the body is not JSON")
    return VerifiedEvents(events=delivery_events(delivery.svix_id, verified))


resend_webhook = restate.Service(
    "ResendWebhook",
    description="Resend's signed delivery events, re-verified.",
    invocation_context_managers=[clean_failures],
)


@resend_webhook.handler(name="receive", input_serde=Body(WebhookDelivery), idempotency_retention=WEBHOOK_RETENTION)
async def receive(ctx: Context, delivery: WebhookDelivery) -> WebhookAck:
    """Re-verify one webhook's signature, then hand each of its events to `EmailDelivery.record`."""
    # Journaled: the clock and the secret decide the branch, and a replay must take the same one.
    checked = await ctx.run_typed("verify webhook signature", _verify, RunOptions(max_attempts=1), delivery=delivery)
    if checked.problem:
        raise TerminalError(checked.problem, 401)
    for event in checked.events:
        ctx.object_send(
            record,
            key=event.approval_id,
            arg=event,
            idempotency_key=idempotency_key(delivery.svix_id, event.approval_id),
        )
    return WebhookAck(forwarded=len(checked.events))
