"""The receipt to an approver after a decision was made with their link ("if this wasn't you…").

Guarantee: one receipt per (approval, round, approver slot), sent to the approver the record names
as the decider, built only from its arguments and the settings, with no decision links. A step
body: call it through `ctx.run_typed(..., EMAIL_RETRIES, ...)`.
"""

from __future__ import annotations

from functools import partial

from handlers.contract import ApprovalRecord
from handlers.mail.deliver import deliver
from handlers.mail.intent import intent_key, tags_for
from handlers.mail.message import MailRejected, OutgoingEmail, SendReceipt
from handlers.mail.render import render
from handlers.settings import Settings

_VERBS = {"approved": ("approved", "approve"), "rejected": ("rejected", "reject")}


def decision_receipt(record: ApprovalRecord, client: str, settings: Settings) -> OutgoingEmail:
    """`record` as decided by a person (state approved/rejected, decided_by one of its approvers)."""
    if record.state not in _VERBS or record.decided_by not in record.approvers or record.decided_at is None:
        raise MailRejected(f"approval {record.approval_id} was not decided by one of its approvers")
    slot = record.approvers.index(record.decided_by)
    verb, verdict_word = _VERBS[record.state]
    subject, text, html = render(
        "decision_receipt",
        record=record,
        verb=verb,
        verdict_word=verdict_word,
        client=client[:300],
        security_contact=settings.approvals_security_contact,
        goal="",
        approver=record.decided_by,
        now=record.decided_at,
        pending=False,
    )
    return OutgoingEmail(
        kind="decision-receipt",
        to=[record.decided_by],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=intent_key("decision-receipt", record.approval_id, record.round, f"s{slot}"),
        sent_at=record.decided_at,
        tags=tags_for("decision-receipt", record.run_id, record.approval_id, record.round, slot),
    )


def send_decision_receipt(record: ApprovalRecord, client: str = "") -> SendReceipt:
    return deliver(partial(decision_receipt, record, client))
