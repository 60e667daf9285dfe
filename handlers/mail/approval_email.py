"""The approval-request email for one approver of one approval round.

Guarantee: runs inside a journaled step; its idempotency key is derived from approval id, round and
approver slot, and its content from the journaled record, so a retry re-sends the same message
under the same key.
"""

from __future__ import annotations

import re
from typing import Literal

from handlers import links
from handlers.contract import ApprovalRecord
from handlers.mail import mailer_for
from handlers.mail.message import OutgoingEmail, SendReceipt
from handlers.mail.render import render
from handlers.settings import get_settings


def _tag(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", value)[:256]


MailKind = Literal["request", "reminder", "escalation", "reapproval"]


def idempotency_key(record: ApprovalRecord, slot: int, kind: MailKind) -> str:
    key = f"approval-{kind}/{record.approval_id}/r{record.round}/s{slot}"
    return f"{key}/n{record.reminders_sent + 1}" if kind == "reminder" else key


def send_approval_request(
    record: ApprovalRecord, slot: int, goal: str, kind: MailKind = "request", sent_at: float | None = None
) -> SendReceipt:
    settings = get_settings()
    token = links.mint(record, slot, settings.approvals_signing_keys, settings.signing_kid)
    url = f"{settings.approvals_public_url}/approvals/{token}"
    inbox = links.inbox_token(
        record.approvers[slot],
        settings.approvals_signing_keys,
        settings.signing_kid,
        int(record.round_started_at) + links.INBOX_LINK_DAYS * 86400,
    )
    subject, text, html = render(
        "approval_request",
        inbox_url=f"{settings.approvals_public_url}/inbox/{inbox}",
        record=record,
        goal=goal,
        approver=record.approvers[slot],
        kind=kind,
        approve_url=f"{url}?intent=approve",
        reject_url=f"{url}?intent=reject",
    )
    email = OutgoingEmail(
        to=[record.approvers[slot]],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=idempotency_key(record, slot, kind),
        sent_at=sent_at if sent_at is not None else record.round_started_at,
        tags={"run_id": _tag(record.run_id), "approval_id": _tag(record.approval_id)},
        log_links=[url],
    )
    return mailer_for(settings).send(email)


def send_batch_request(records: list[ApprovalRecord], slots: list[int], goal: str) -> SendReceipt:
    """One email to one approver about several actions proposed together; one link, one page."""
    settings = get_settings()
    first, approver = records[0], records[0].approvers[slots[0]]
    token = links.mint(first, slots[0], settings.approvals_signing_keys, settings.signing_kid)
    url = f"{settings.approvals_public_url}/approvals/{token}"
    subject, text, html = render("approval_batch", records=records, goal=goal, approver=approver, url=url)
    email = OutgoingEmail(
        to=[approver],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=f"approval-batch/{first.approval_id}/r{first.round}/{approver}",
        sent_at=first.round_started_at,
        tags={"run_id": _tag(first.run_id), "approval_id": _tag(first.approval_id)},
        log_links=[url],
    )
    return mailer_for(settings).send(email)
