"""The receipt to an approver after a decision was made with their link ("if this wasn't you…").

Guarantee: one receipt per (approval, round, approver slot), sent to that slot's approver about the
vote recorded for it, built only from its arguments and the settings, with no decision links. A
step body: call it through `ctx.run_typed(..., EMAIL_RETRIES, ...)`.
"""

from __future__ import annotations

from functools import partial

from countersign import textdiff
from countersign.contract import ApprovalRecord
from countersign.mail.deliver import deliver
from countersign.mail.intent import intent_key, tags_for
from countersign.mail.message import MailRejected, OutgoingEmail, SendReceipt
from countersign.mail.render import render
from countersign.settings import Settings

_VERBS = {"approve": ("approved", "approve"), "reject": ("rejected", "reject")}
_QUESTION_VERBS = {"approve": ("answered", "answer"), "reject": ("declined", "decline")}


def decision_receipt(
    record: ApprovalRecord, slot: int, client: str, settings: Settings, edits: dict[str, str] | None = None
) -> OutgoingEmail:
    """The receipt for the vote `slot` cast in the record's current round (approve or reject); an
    approval that changed a long text shows the diff of what the approver typed (`edits`), and a
    question's answer (or decline) the answer as its form took it."""
    votes = [v for v in record.votes if v.slot == slot and v.round == record.round and v.kind in _VERBS]
    if not votes or not 0 <= slot < len(record.approvers):
        raise MailRejected(f"approval {record.approval_id} has no decision by slot {slot} in round {record.round}")
    vote = votes[-1]
    question = record.kind == "question"
    verb, verdict_word = (_QUESTION_VERBS if question else _VERBS)[vote.kind]
    subject, text, html = render(
        "decision_receipt",
        record=record,
        vote=vote,
        verb=verb,
        verdict_word=verdict_word,
        client=client[:300],
        security_contact=settings.approvals_security_contact,
        goal="",
        approver=record.approvers[slot],
        now=vote.at,
        pending=False,
        changes=textdiff.changes(record.args, edits or {}) if vote.kind == "approve" and not question else [],
        answer=(edits or {}) if vote.kind == "approve" and question else {},
    )
    return OutgoingEmail(
        kind="receipt",
        to=[record.approvers[slot]],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=intent_key("receipt", record.approval_id, record.round, f"s{slot}"),
        sent_at=vote.at,
        tags=tags_for("receipt", record.run_id, record.approval_id, record.round, slot),
    )


def send_decision_receipt(
    record: ApprovalRecord, slot: int, client: str = "", edits: dict[str, str] | None = None
) -> SendReceipt:
    return deliver(partial(decision_receipt, record, slot, client, edits=edits))
