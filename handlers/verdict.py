"""The value that completes an approval's decision promise, and the promise names.

Guarantee: approve, reject, expire, cancel and undeliverable all complete the *same* promise, so
the first completion wins and every later one is refused by Restate.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from handlers.contract import ApprovalState

CANCEL_PROMISE = "cancel"

VerdictKind = Literal["approve", "reject", "expire", "cancel", "undeliverable"]
STATE_OF: dict[VerdictKind, ApprovalState] = {
    "approve": "approved",
    "reject": "rejected",
    "expire": "expired",
    "cancel": "cancelled",
    "undeliverable": "undeliverable",
}


class Verdict(BaseModel):
    kind: VerdictKind
    by: str | None = None
    reason: str | None = None
    at: float
    round: int
    digest: str
    client: str = ""


def decision_promise(approval_id: str) -> str:
    return f"decision:{approval_id}"


def is_already_completed(exc: Exception) -> bool:
    """Restate's answer to a second completion of a promise (as opposed to a cancellation)."""
    return getattr(exc, "status_code", None) == 409 and "already completed" in str(exc)


def is_cancellation(exc: Exception) -> bool:
    """A hard `restate invocations cancel`: must propagate, never be swallowed as a business error."""
    return getattr(exc, "status_code", None) == 409 and getattr(exc, "message", "") in ("cancelled", "killed")
