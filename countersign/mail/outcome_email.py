"""The notice to the requester once their agent's gated action has an outcome.

Guarantee: one notice per (approval, round, outcome), built only from its arguments and the
settings, with no decision links (the requester cannot decide). A step body: call it through
`ctx.run_typed(..., EMAIL_RETRIES, ...)`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from countersign.contract import ApprovalRecord
from countersign.mail.deliver import deliver
from countersign.mail.intent import intent_key, tags_for
from countersign.mail.message import OutgoingEmail, SendReceipt
from countersign.mail.render import render
from countersign.settings import Settings

NoticeOutcome = Literal["approved", "rejected", "expired", "executed", "failed", "undeliverable", "superseded"]


def outcome_notice(
    record: ApprovalRecord,
    outcome: NoticeOutcome,
    settings: Settings,
    *,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> OutgoingEmail:
    """`record` as decided (state, decided_by, decided_at, reason, edits, decision_source); `result` or
    `error` of the tool run for `executed` / `failed`."""
    at = record.decided_at if record.decided_at is not None else record.deadline
    subject, text, html = render(
        "outcome",
        record=record,
        outcome=outcome,
        result=result,
        error=error,
        goal="",
        approver="",
        now=at,
        pending=False,
    )
    return OutgoingEmail(
        kind="outcome",
        to=[record.requester],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=intent_key("outcome", record.approval_id, record.round, outcome),
        sent_at=at,
        tags=tags_for("outcome", record.run_id, record.approval_id, record.round, None),
    )


def send_outcome_notice(
    record: ApprovalRecord,
    outcome: NoticeOutcome,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> SendReceipt:
    return deliver(partial(outcome_notice, record, outcome, result=result, error=error))
