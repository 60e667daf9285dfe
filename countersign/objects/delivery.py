"""`EmailDelivery`: what the mail provider reported about the emails of one approval (Virtual Object,
key = approval id).

Guarantee: `record` is `ingress_private`: a provider event reaches it only from
`ResendWebhook.receive` (countersign/objects/resend_events.py), after the Svix signature was verified there.
Each provider event is recorded once, however often the provider re-delivers it (dedupe by event
id, on top of the idempotency key it is sent with); an email that
carried decision links (request, reminder, escalation) and did not reach its approver (bounced,
complained, failed, suppressed) is forwarded once per round and approver slot to the approval as a
`DeliveryFailure` through `Approval.delivery_failed` (same key), which decides what the approval does
about it (escalate, or `undeliverable`: see `countersign.approval.tally.slot_verdict`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext

from countersign.contract import Strict
from countersign.mail.intent import APPROVER_KINDS, MessageKind
from countersign.observability import metrics

STATE_KEY = "log"
APPROVAL_SERVICE = "Approval"
APPROVAL_HANDLER = "delivery_failed"
MAX_EVENTS = 200
# Resend re-delivers a webhook for about 28 h; keep the ingress idempotency keys comfortably longer.
WEBHOOK_RETENTION = timedelta(days=3)

FailureEvent = Literal["email.bounced", "email.complained", "email.failed", "email.suppressed"]
FAILURE_EVENTS: frozenset[str] = frozenset({"email.bounced", "email.complained", "email.failed", "email.suppressed"})


class DeliveryEvent(Strict):
    """One verified provider event about one of our emails (input of `EmailDelivery.record`)."""

    event_id: str = Field(min_length=1, max_length=200)
    type: str = Field(pattern=r"^email\.[a-z_]{1,40}$")
    email_id: str = Field(min_length=1, max_length=200)
    kind: MessageKind
    run_id: str = Field(min_length=1, max_length=128)
    approval_id: str = Field(min_length=1, max_length=200)
    round: int = Field(ge=1)
    slot: int | None = Field(default=None, ge=0)
    occurred_at: str = Field(default="", max_length=64)
    detail: str = Field(default="", max_length=300)


class DeliveryFailure(BaseModel):
    """An email with decision links that did not reach its approver (input of `AgentRun.delivery_failed`).

    `failed_slots` are all approver slots of this round whose emails failed so far, this one included.
    """

    run_id: str
    approval_id: str
    round: int
    slot: int
    kind: MessageKind
    event: FailureEvent
    email_id: str
    detail: str
    failed_slots: list[int]


class DeliveryLog(BaseModel):
    """The object's state: recent events (oldest first) and the failures forwarded to the run."""

    events: list[DeliveryEvent] = Field(default_factory=list)
    failures: list[DeliveryFailure] = Field(default_factory=list)
    seen: list[str] = Field(default_factory=list)


class DeliveryAck(BaseModel):
    recorded: bool
    forwarded: bool = False


email_delivery = restate.VirtualObject(
    "EmailDelivery", description="What the mail provider reported about the emails of one approval."
)


# Private: events arrive only from `ResendWebhook.receive`, which re-verifies the provider's signature;
# from the ingress anyone could report a bounce that takes an approver out.
@email_delivery.handler(name="record", idempotency_retention=WEBHOOK_RETENTION, ingress_private=True)
async def record(ctx: ObjectContext, event: DeliveryEvent) -> DeliveryAck:
    """Record one provider event; forward a failed approver email to the run."""
    log = await ctx.get(STATE_KEY, type_hint=DeliveryLog) or DeliveryLog()
    if event.event_id in log.seen or event.approval_id != ctx.key():
        return DeliveryAck(recorded=False)
    log.seen = [*log.seen, event.event_id][-MAX_EVENTS:]
    log.events = [*log.events, event][-MAX_EVENTS:]
    failure = _failure(log, event)
    forwarded = False
    if failure is not None:
        log.failures.append(failure)
        # By name, not by handler object: the approval workflow imports this module.
        ctx.generic_send(
            APPROVAL_SERVICE,
            APPROVAL_HANDLER,
            failure.model_dump_json().encode(),
            key=event.approval_id,
            idempotency_key=f"delivery-failed/{event.approval_id}/{event.event_id}",
            headers={"content-type": "application/json"},
        )
        forwarded = True
        metrics.record_delivery_failed("email", failure.event.removeprefix("email."))
    ctx.set(STATE_KEY, log)
    return DeliveryAck(recorded=True, forwarded=forwarded)


@email_delivery.handler(name="log", kind="shared")
async def delivery_log(ctx: ObjectSharedContext) -> DeliveryLog:
    """Everything recorded for this approval's emails."""
    return await ctx.get(STATE_KEY, type_hint=DeliveryLog) or DeliveryLog()


def _failure(log: DeliveryLog, event: DeliveryEvent) -> DeliveryFailure | None:
    if event.type not in FAILURE_EVENTS or event.kind not in APPROVER_KINDS or event.slot is None:
        return None
    earlier = {f.slot for f in log.failures if f.round == event.round}
    if event.slot in earlier:
        return None
    return DeliveryFailure(
        run_id=event.run_id,
        approval_id=event.approval_id,
        round=event.round,
        slot=event.slot,
        kind=event.kind,
        event=event.type,  # type: ignore[arg-type]
        email_id=event.email_id,
        detail=event.detail,
        failed_slots=sorted(earlier | {event.slot}),
    )
