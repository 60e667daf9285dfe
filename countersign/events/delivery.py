"""Delivering one event to its endpoints: fan-out, signed POSTs with retries, and the outcome log.

Guarantee: `WebhookEvents.publish` (key `<tenant>:<subject>`, the subject being the approval, or the
run for `run.finished`) handles one subject's events one at a time, in the order they were sent, and
hands each to `WebhookDelivery.deliver` once per subscribed endpoint (key
`<tenant>:<endpoint>:<subject>`). That object, exclusive per key, delivers the subject's events to
its endpoint in order, so a receiver that is down holds back only its own deliveries of that
subject: other subjects and other endpoints go on. Each attempt is one journaled step that signs the
same body under the same `webhook-id` (with the attempt's own timestamp, as the spec asks); between
attempts a durable timer waits (exponential backoff, capped, with a jitter derived from the id), and
after COUNTERSIGN_WEBHOOK_ATTEMPTS attempts the delivery is given up. Delivered or given up, the
outcome goes to `WebhookLog` (key = run id). A handler killed during a POST runs that attempt again
on restart: a receiver may then see an id twice, which is what the `webhook-id` is for.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx
import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext, RunOptions, TerminalError
from standardwebhooks import Webhook

from countersign import retention
from countersign.errors import is_cancellation
from countersign.observability import metrics
from countersign.settings import WebhookEventType, get_settings

MAX_LOG = 500
_MAX_ERROR = 300
# An attempt's step is retried by Restate only if the code itself raised (never for a receiver's
# answer, which the step returns); those retries are few and quick, then the attempt counts as failed.
_ATTEMPT_STEP = RunOptions[Any](max_attempts=3, initial_retry_interval=timedelta(milliseconds=200))


class WebhookEvent(BaseModel):
    """One event, as the run that saw it sent it (input of `publish` and `deliver`)."""

    id: str = Field(pattern=r"^evt_[0-9a-f]{32}$")
    """The `webhook-id`: derived from what the event is about, so every send of it has the same one."""
    type: WebhookEventType
    tenant: str
    run_id: str
    subject: str
    """What the events are ordered by: the approval id, or the run id for `run.finished`."""
    at: float = 0.0
    """When it happened; 0 until `publish` stamps it (for an event whose run read no clock)."""
    data: dict[str, Any]

    def body(self) -> str:
        """The signed body: the same bytes on every attempt."""
        stamp = datetime.fromtimestamp(self.at, UTC).isoformat().replace("+00:00", "Z")
        return json.dumps(
            {"type": self.type, "timestamp": stamp, "data": self.data},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )


def event_id(tenant: str, about: str) -> str:
    return "evt_" + hashlib.sha256(f"{tenant}\x00{about}".encode()).hexdigest()[:32]


class Targets(BaseModel):
    endpoints: list[str]
    at: float


class Attempt(BaseModel):
    """What one POST got: delivered (2xx), or why not."""

    delivered: bool
    status: int = 0
    error: str = ""
    retry_after: float | None = None
    unknown_endpoint: bool = False


class RetryPlan(BaseModel):
    """The delivery's retry settings, journaled so that a replay waits the same way."""

    attempts: int
    delays: list[float]


DeliveryResult = Literal["delivered", "gave_up", "dropped"]


class DeliveryOutcome(BaseModel):
    """How one event's delivery to one endpoint ended (an entry of `WebhookLog`)."""

    webhook_id: str
    type: WebhookEventType
    tenant: str
    subject: str
    endpoint: str
    outcome: DeliveryResult
    attempts: int
    status: int = 0
    error: str = ""
    at: float


class WebhookLogState(BaseModel):
    outcomes: list[DeliveryOutcome] = Field(default_factory=list)


webhook_events = restate.VirtualObject(
    "WebhookEvents", description="Fans one subject's webhook events out to its endpoints, in order."
)
webhook_delivery = restate.VirtualObject(
    "WebhookDelivery", description="Delivers one subject's webhook events to one endpoint, in order, with retries."
)
webhook_log = restate.VirtualObject("WebhookLog", description="How each webhook delivery of one run ended.")


def _targets(tenant: str, type: WebhookEventType) -> Targets:
    endpoints = get_settings().webhook_endpoints(tenant)
    return Targets(endpoints=[e.id for e in endpoints if type in e.events], at=time.time())


# Private: events come only from the runs; from the ingress anyone could make us post anything.
@webhook_events.handler(name="publish", ingress_private=True, journal_retention=retention.NO_JOURNAL)
async def publish(ctx: ObjectContext, event: WebhookEvent) -> int:
    """Hand `event` to each endpoint of its tenant that subscribes to its type; how many there were."""
    targets = await ctx.run_typed("endpoints", _targets, tenant=event.tenant, type=event.type)
    if not event.at:
        event = event.model_copy(update={"at": targets.at})
    for endpoint in targets.endpoints:
        ctx.object_send(
            deliver,
            key=f"{event.tenant}:{endpoint}:{event.subject}",
            arg=event,
            idempotency_key=f"webhook/{event.id}/{endpoint}",
        )
    return len(targets.endpoints)


def _plan(webhook_id: str) -> RetryPlan:
    settings = get_settings()
    first, cap = settings.countersign_webhook_backoff_seconds, settings.countersign_webhook_backoff_max_seconds
    delays = []
    for n in range(settings.countersign_webhook_attempts - 1):
        base = min(first * 2**n, cap)
        # +-20 %, the same for one id and attempt on every replay, different across events so that a
        # receiver coming back up is not hit by every waiting delivery at the same instant.
        spread = int(hashlib.sha256(f"{webhook_id}/{n}".encode()).hexdigest()[:4], 16) / 0xFFFF
        delays.append(round(base * (0.8 + 0.4 * spread), 3))
    return RetryPlan(attempts=settings.countersign_webhook_attempts, delays=delays)


async def _post(tenant: str, endpoint_id: str, event: WebhookEvent) -> Attempt:
    """One signed POST of `event` to the endpoint; every answer and transport error is a result."""
    settings = get_settings()
    endpoint = next((e for e in settings.webhook_endpoints(tenant) if e.id == endpoint_id), None)
    if endpoint is None:
        return Attempt(delivered=False, unknown_endpoint=True, error="the endpoint is no longer configured")
    body = event.body()
    now = datetime.now(UTC)
    signature = Webhook(endpoint.secret.get_secret_value()).sign(event.id, now, body)
    headers = {
        "content-type": "application/json",
        "webhook-id": event.id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
        "user-agent": "Countersign-Webhooks/1",
    }
    try:
        async with httpx.AsyncClient(timeout=settings.countersign_webhook_timeout_seconds) as client:
            # No redirects: a receiver that moved is given up on, not followed to wherever it points.
            response = await client.post(endpoint.url, content=body.encode(), headers=headers, follow_redirects=False)
    except httpx.HTTPError as exc:
        # The outcome is readable through the ingress; an endpoint's URL may carry a token of its own.
        reason = str(exc).replace(endpoint.url, "<endpoint>")
        return Attempt(delivered=False, error=f"{type(exc).__name__}: {reason}"[:_MAX_ERROR])
    if 200 <= response.status_code < 300:
        return Attempt(delivered=True, status=response.status_code)
    return Attempt(
        delivered=False,
        status=response.status_code,
        error=f"HTTP {response.status_code}",
        retry_after=_retry_after(response.headers.get("retry-after")),
    )


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


# Private: only `publish` hands events here.
@webhook_delivery.handler(name="deliver", ingress_private=True, journal_retention=retention.NO_JOURNAL)
async def deliver(ctx: ObjectContext, event: WebhookEvent) -> DeliveryOutcome:
    """POST `event` to this key's endpoint until it answers 2xx or the attempts run out."""
    tenant, endpoint, _ = ctx.key().split(":", 2)
    plan = await ctx.run_typed("retry plan", _plan, webhook_id=event.id)
    attempt = Attempt(delivered=False)
    count = 0
    for count in range(1, plan.attempts + 1):
        try:
            attempt = await ctx.run_typed(
                f"POST attempt {count}", _post, _ATTEMPT_STEP, tenant=tenant, endpoint_id=endpoint, event=event
            )
        except TerminalError as exc:
            if is_cancellation(exc):
                raise
            attempt = Attempt(delivered=False, error=f"could not attempt: {exc.message}"[:_MAX_ERROR])
        if attempt.delivered or attempt.unknown_endpoint or count == plan.attempts:
            break
        delay = plan.delays[count - 1]
        if attempt.retry_after is not None:  # the receiver's own ask, within our bounds
            delay = min(max(delay, attempt.retry_after), plan.delays[-1] * 1.2)
        await ctx.sleep(timedelta(seconds=delay), name=f"backoff {count}")
    outcome = DeliveryOutcome(
        webhook_id=event.id,
        type=event.type,
        tenant=tenant,
        subject=event.subject,
        endpoint=endpoint,
        outcome="delivered" if attempt.delivered else "dropped" if attempt.unknown_endpoint else "gave_up",
        attempts=count,
        status=attempt.status,
        error=attempt.error,
        at=await ctx.time(),
    )
    ctx.object_send(record, key=event.run_id, arg=outcome, idempotency_key=f"webhook-log/{event.id}/{endpoint}")
    if outcome.outcome != "delivered":
        metrics.record_webhook_failed(outcome.outcome)
    return outcome


@webhook_log.handler(name="record", ingress_private=True, journal_retention=retention.NO_JOURNAL)
async def record(ctx: ObjectContext, outcome: DeliveryOutcome) -> None:
    log = await ctx.get("log", type_hint=WebhookLogState) or WebhookLogState()
    log.outcomes = [*log.outcomes, outcome][-MAX_LOG:]
    ctx.set("log", log)


@webhook_log.handler(name="outcomes", kind="shared", journal_retention=retention.NO_JOURNAL)
async def outcomes(ctx: ObjectSharedContext) -> WebhookLogState:
    """Every delivery of this run's events that ended, oldest first."""
    return await ctx.get("log", type_hint=WebhookLogState) or WebhookLogState()
