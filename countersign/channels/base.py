"""The channel interface: one approval request (record, approver slot, goal, kind) sent one way.

Guarantee: `Channel.deliver` is called from the approval's workflow with journaled values only and
does its external work inside named journaled steps (or hands it, as a one-way Restate send with an
idempotency key, to an object that does), so a replay neither repeats nor loses a delivery.
"""

from __future__ import annotations

from typing import Literal, Protocol

import restate
from pydantic import BaseModel

from countersign.contract import ApprovalRecord

RequestKind = Literal["request", "reminder", "escalation", "reapproval"]


class ChannelRequest(BaseModel):
    """What one delivery says: the approval as frozen, whom (slot) and why now (kind)."""

    record: ApprovalRecord
    slot: int
    goal: str
    kind: RequestKind
    at: float
    reason: str | None = None
    step: str
    """The journaled step's name (unique per approval, round, slot, kind and reminder)."""
    key: str
    """The delivery's idempotency key (the email's: `approval-<kind>/<approval id>/r<round>/s<slot>`)."""
    confirm_label: str | None = None
    """High stakes: what the approver retypes, and the value shown to type (Slack's modal)."""
    confirm_value: str | None = None


class Channel(Protocol):
    name: str

    async def deliver(self, ctx: restate.Context, request: ChannelRequest) -> str | None:
        """Send the request; the provider's id of the message, or None if it could not be sent
        (the approval goes on through the other channels, or escalates as for a bounce)."""
        ...
