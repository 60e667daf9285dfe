"""The value that completes an approver slot's decision promise, and the promise names.

Guarantee: every way a slot can end (approve, reject, deadline, cancel, escalation, undeliverable,
or closing after the approval was decided elsewhere) completes the *same* promise for that slot and
round, so the first completion wins and every later one is refused by Restate.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from restate import DurablePromise, WorkflowContext, WorkflowSharedContext

from countersign.compact import Compact
from countersign.contract import ApprovalState, CancelRequest, DecisionSource

CANCEL_PROMISE = "cancel"

VerdictKind = Literal["approve", "reject", "expire", "cancel", "escalate", "reassign", "undeliverable", "close"]


class Verdict(BaseModel):
    kind: VerdictKind
    slot: int
    round: int
    digest: str
    at: float
    by: str | None = None
    reason: str | None = None
    edits: dict[str, Any] | None = None
    source: DecisionSource = "human"
    client: str = ""
    via: str = "email"
    """The channel a person's verdict came through (`email`: the page; `slack`)."""
    closes_as: ApprovalState | None = None
    to: str | None = None
    asked_by: str | None = None
    """Who asked for a reassignment or a cancel (an operator); recorded in the audit trail, never a decider."""
    grant_seconds: int | None = None
    """An approval that also gives a standing approval for this long (checked against the record's offer)."""


def slot_promise(approval_id: str, round_: int, slot: int) -> str:
    return f"decision:{approval_id}:r{round_}:s{slot}"


def state_of(final: Verdict) -> ApprovalState:
    """The approval's state once `final` decided it."""
    if final.closes_as is not None:
        return final.closes_as
    match final.kind:
        case "approve":
            return "approved_with_edits" if final.edits else "approved"
        case "reject":
            return "rejected"
        case "expire":
            return "expired"
        case "cancel":
            return "cancelled"
        case _:
            return "undeliverable"


def cancel_promise(ctx: WorkflowContext | WorkflowSharedContext) -> DurablePromise[CancelRequest]:
    """The promise a cancel completes, of an approval or of a run. Its value is `cancel_value`'s."""
    return ctx.promise(CANCEL_PROMISE, serde=Compact(CancelRequest))


def cancel_value(request: CancelRequest) -> CancelRequest:
    """What a cancel promise holds: the reason only. A run still on an older deployment reads it with
    a model that refuses fields it does not know; who asked is in the cancelled slots' verdicts."""
    return CancelRequest(reason=request.reason)
