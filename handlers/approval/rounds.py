"""The journaled facts that open an approval round, and the system's own closing verdicts.

Guarantee: a round's nonce comes from a cryptographic source inside a journaled step (never
`ctx.uuid()`), so replays see the same nonce and no two rounds share one.
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from restate import RunOptions

from handlers.approval.verdict import Verdict, VerdictKind
from handlers.contract import ApprovalRecord, ApprovalState

# 5xx/lost connections back off 0.5 s doubling to 10 min (about 1.6 h over 20 attempts); 429s wait
# Resend's retry-after; 6 h caps it all, far inside Resend's 24 h idempotency window, so a retry
# never sends a second email.
EMAIL_RETRIES = RunOptions[Any](
    max_attempts=20,
    initial_retry_interval=timedelta(milliseconds=500),
    retry_interval_factor=2.0,
    max_retry_interval=timedelta(minutes=10),
    max_duration=timedelta(hours=6),
)


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
