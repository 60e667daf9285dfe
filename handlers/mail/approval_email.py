"""The emails that ask an approver to decide: the request, its reminders, and an escalation.

Guarantee: each is built only from its arguments (journaled values) and the settings, so a step
retry re-sends the same bytes under the same idempotency key; each carries two distinct links
(approve, reject) to the confirmation page, signed for exactly this record, approver slot and round.
The `send_*` functions are step bodies: call them through `ctx.run_typed(..., EMAIL_RETRIES, ...)`.
"""

from __future__ import annotations

from functools import partial

from handlers import links
from handlers.contract import ApprovalRecord
from handlers.mail.deliver import deliver
from handlers.mail.intent import MessageKind, intent_key, tags_for
from handlers.mail.message import MailRejected, OutgoingEmail, SendReceipt
from handlers.mail.render import render
from handlers.settings import Settings


def approval_request(record: ApprovalRecord, slot: int, goal: str, settings: Settings) -> OutgoingEmail:
    return _to_approver("approval-request", f"s{slot}", record, slot, goal, record.requested_at, settings)


def reminder(record: ApprovalRecord, slot: int, goal: str, number: int, at: float, settings: Settings) -> OutgoingEmail:
    """Reminder `number` (1, 2, …) of this round, sent at `at` (a journaled time)."""
    return _to_approver("reminder", f"s{slot}/n{number}", record, slot, goal, at, settings, number=number)


def escalation(
    record: ApprovalRecord, slot: int, goal: str, reason: str, previous: list[str], settings: Settings
) -> OutgoingEmail:
    """The first email of an escalated round: `record` is the new round (new approvers, round, nonce)."""
    return _to_approver(
        "escalation",
        f"s{slot}",
        record,
        slot,
        goal,
        record.requested_at,
        settings,
        escalation_reason=reason,
        previous=previous,
    )


def send_approval_request(record: ApprovalRecord, slot: int, goal: str) -> SendReceipt:
    return deliver(partial(approval_request, record, slot, goal))


def send_reminder(record: ApprovalRecord, slot: int, goal: str, number: int, at: float) -> SendReceipt:
    return deliver(partial(reminder, record, slot, goal, number, at))


def send_escalation(record: ApprovalRecord, slot: int, goal: str, reason: str, previous: list[str]) -> SendReceipt:
    return deliver(partial(escalation, record, slot, goal, reason, previous))


def _to_approver(
    kind: MessageKind,
    part: str,
    record: ApprovalRecord,
    slot: int,
    goal: str,
    at: float,
    settings: Settings,
    **extra: object,
) -> OutgoingEmail:
    if not 0 <= slot < len(record.approvers):
        raise MailRejected(f"approval {record.approval_id} has no approver slot {slot}")
    token = links.mint(record, slot, settings.approvals_signing_keys, settings.signing_kid)
    url = f"{settings.approvals_public_url}/approvals/{token}"
    subject, text, html = render(
        kind.replace("-", "_"),
        record=record,
        goal=goal,
        approver=record.approvers[slot],
        approve_url=f"{url}?intent=approve",
        reject_url=f"{url}?intent=reject",
        now=at,
        pending=True,
        **extra,
    )
    return OutgoingEmail(
        kind=kind,
        to=[record.approvers[slot]],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=intent_key(kind, record.approval_id, record.round, part),
        sent_at=at,
        tags=tags_for(kind, record.run_id, record.approval_id, record.round, slot),
        log_links=[url],
    )
