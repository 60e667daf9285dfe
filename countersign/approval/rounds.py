"""The journaled facts that open an approval round, and the system's own closing verdicts.

Guarantee: a round's nonce comes from a cryptographic source inside a journaled step (never
`ctx.uuid()`), so replays see the same nonce and no two rounds share one.
"""

from __future__ import annotations

import secrets
import time

from pydantic import BaseModel

from countersign.approval.verdict import Verdict, VerdictKind
from countersign.contract import ApprovalRecord, ApprovalState
from countersign.mail.deliver import EMAIL_RETRIES

__all__ = ["EMAIL_RETRIES", "Opening", "closing", "open_round"]


class Opening(BaseModel):
    nonce: str
    now: float


def open_round() -> Opening:
    return Opening(nonce=secrets.token_urlsafe(16), now=time.time())


def closing(
    record: ApprovalRecord, kind: VerdictKind, at: float, reason: str, closes_as: ApprovalState | None = None
) -> Verdict:
    """A verdict the system (not a person) completes a slot with."""
    return Verdict(
        kind=kind,
        slot=-1,
        round=record.round,
        digest=record.digest,
        at=at,
        reason=reason,
        source="system",
        closes_as=closes_as,
    )
