"""The receipt to an approver who gave a standing approval, with the link that revokes it.

Guarantee: one receipt per standing approval (its idempotency key is the approval's, round and
`grant`), sent to the person who gave it, built only from its arguments and the settings; its link
only opens a page (GET changes nothing), and revoking takes that page's POST. A step body: call it
through `ctx.run_typed(..., EMAIL_RETRIES, ...)`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from countersign.contract import ApprovalRecord
from countersign.mail.deliver import deliver
from countersign.mail.intent import intent_key, tags_for
from countersign.mail.message import OutgoingEmail, SendReceipt
from countersign.mail.render import render
from countersign.security import links
from countersign.settings import Settings

REVOKE_LINK_GRACE = 24 * 3600
"""How long after a grant expires its revoke link still opens its page (which then says it expired)."""


def revoke_url(settings: Settings, grant: dict[str, Any]) -> str:
    exp = int(grant["expires_at"]) + REVOKE_LINK_GRACE
    keys, kid = settings.approvals_signing_keys, settings.signing_kid
    token = links.grant_token(str(grant["key"]), str(grant["grant_id"]), keys, kid, exp)
    return f"{settings.approvals_public_url}/grants/{token}"


def grant_receipt(record: ApprovalRecord, grant: dict[str, Any], settings: Settings) -> OutgoingEmail:
    """`grant` is the standing approval's JSON (with its `key`), given with `record`'s approval."""
    subject, text, html = render(
        "grant_receipt",
        record=record,
        grant=grant,
        revoke_url=revoke_url(settings, grant),
        security_contact=settings.approvals_security_contact,
    )
    return OutgoingEmail(
        kind="grant",
        to=[str(grant["granted_by"])],
        subject=subject,
        text=text,
        html=html,
        idempotency_key=intent_key("grant", record.approval_id, record.round, "grant"),
        sent_at=float(grant["granted_at"]),
        tags=tags_for("grant", record.run_id, record.approval_id, record.round, None),
    )


def send_grant_receipt(record: ApprovalRecord, grant: dict[str, Any]) -> SendReceipt:
    return deliver(partial(grant_receipt, record, grant))
