"""The emails that ask an approver to decide: the request, reminders, an escalation, a re-approval
after something changed, and one email about several actions proposed together (a batch).

Guarantee: each is built only from its arguments (journaled values) and the settings, so a step
retry re-sends the same bytes under the same idempotency key; each carries links to the
confirmation page signed for exactly this record, approver slot and round (distinct Approve and
Reject links; one link to the batch page for a batch). The `send_*` functions are step bodies: call
them through `ctx.run_typed(..., EMAIL_RETRIES, ...)`.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

from countersign.contract import ApprovalRecord
from countersign.mail.deliver import deliver
from countersign.mail.intent import intent_key, tags_for
from countersign.mail.message import MailRejected, OutgoingEmail, SendReceipt
from countersign.mail.render import render
from countersign.security import links
from countersign.settings import Settings

MailKind = Literal["request", "reminder", "escalation", "reapproval"]
_TEMPLATE: dict[MailKind, str] = {
    "request": "approval_request",
    "reminder": "reminder",
    "escalation": "escalation",
    "reapproval": "reapproval",
}
DEFAULT_ESCALATION_REASON = "the previous approver did not decide in time"
QUESTION_ESCALATION_REASON = "the person asked before you did not answer in time"


def idempotency_key(record: ApprovalRecord, slot: int, kind: MailKind) -> str:
    """`approval-<kind>/<approval id>/r<round>/s<slot>`; a reminder adds `/n<record.reminders_sent>`
    (callers count the reminder before sending it)."""
    part = f"s{slot}/n{record.reminders_sent}" if kind == "reminder" else f"s{slot}"
    return intent_key(kind, record.approval_id, record.round, part)


def page_url(record: ApprovalRecord, slot: int, settings: Settings) -> str:
    """The signed link to the approval's page for the approver in `slot` (the email's, and Slack's for a question)."""
    token = links.mint(record, slot, settings.approvals_signing_keys, settings.signing_kid)
    return f"{settings.approvals_public_url}/approvals/{token}"


def approval_request(
    record: ApprovalRecord,
    slot: int,
    goal: str,
    settings: Settings,
    kind: MailKind = "request",
    sent_at: float | None = None,
    reason: str | None = None,
) -> OutgoingEmail:
    """`sent_at` defaults to the round's start; `reason` says why an escalation came (optional)."""
    if not 0 <= slot < len(record.approvers):
        raise MailRejected(f"approval {record.approval_id} has no approver slot {slot}")
    at = record.round_started_at if sent_at is None else sent_at
    url = page_url(record, slot, settings)
    subject, text, html = render(
        _TEMPLATE[kind],
        record=record,
        goal=goal,
        approver=record.approvers[slot],
        approve_url=f"{url}?intent=approve",
        reject_url=f"{url}?intent=reject",
        inbox_url=_inbox_url(record.approvers[slot], record, settings, at),
        now=at,
        pending=True,
        number=max(1, record.reminders_sent),
        escalation_reason=reason
        or (QUESTION_ESCALATION_REASON if record.kind == "question" else DEFAULT_ESCALATION_REASON),
        previous=[a for s, a in enumerate(record.approvers) if s not in record.active_slots],
    )
    return OutgoingEmail(
        kind=kind,
        to=[record.approvers[slot]],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=idempotency_key(record, slot, kind),
        sent_at=at,
        tags=tags_for(kind, record.run_id, record.approval_id, record.round, slot),
        log_links=[url],
    )


def batch_request(records: list[ApprovalRecord], slots: list[int], goal: str, settings: Settings) -> OutgoingEmail:
    """One email to one approver about several actions proposed in one turn; `slots[i]` is this
    approver's slot in `records[i]`. One link: the batch page, entered through the first item."""
    if not records or len(records) != len(slots):
        raise MailRejected("a batch email needs one approver slot per action")
    first, slot = records[0], slots[0]
    approver = first.approvers[slot]
    token = links.mint(first, slot, settings.approvals_signing_keys, settings.signing_kid)
    url = f"{settings.approvals_public_url}/approvals/{token}"
    subject, text, html = render(
        "approval_batch",
        records=records,
        record=first,
        goal=goal,
        approver=approver,
        url=url,
        inbox_url=_inbox_url(approver, first, settings, first.round_started_at),
        now=first.round_started_at,
    )
    tags = tags_for("batch", first.run_id, first.approval_id, first.round, slot)
    items = "-".join(f"{r.index}s{s}" for r, s in zip(records, slots, strict=True))
    if len(items) <= 256:  # Resend's limit; past it a bounce is recorded for the first action only
        tags["items"] = items
    return OutgoingEmail(
        kind="batch",
        to=[approver],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=intent_key("batch", first.approval_id, first.round, f"s{slot}"),
        sent_at=first.round_started_at,
        tags=tags,
        log_links=[url],
    )


def _inbox_url(approver: str, record: ApprovalRecord, settings: Settings, sent_at: float) -> str:
    """The approver's own page of everything waiting for them (expiry from the round: deterministic;
    made at `sent_at`, which is what a revocation, `inbox revoke`, compares against)."""
    expires = int(record.round_started_at) + links.INBOX_LINK_DAYS * 86400
    keys, kid = settings.approvals_signing_keys, settings.signing_kid
    token = links.inbox_token(approver, keys, kid, expires, issued_ms=int(sent_at * 1000))
    return f"{settings.approvals_public_url}/inbox/{token}"


def send_approval_request(
    record: ApprovalRecord,
    slot: int,
    goal: str,
    kind: MailKind = "request",
    sent_at: float | None = None,
    reason: str | None = None,
) -> SendReceipt:
    return deliver(lambda settings: approval_request(record, slot, goal, settings, kind, sent_at, reason))


def send_batch_request(records: list[ApprovalRecord], slots: list[int], goal: str) -> SendReceipt:
    return deliver(partial(batch_request, records, slots, goal))
