"""`ApprovalInbox`: a Virtual Object per approver (key = email) listing what waits for them.

Guarantee: it changes only through `apply`, which runs receive as journaled one-way sends on every
transition (requested, reminded, escalated, reassigned, decided, closed), so it converges on the
runs' own state; applying the same event twice changes nothing. `apply` is `ingress_private`: only
the runs can write an inbox; the ingress can only read one (`pending`).
"""

from __future__ import annotations

from typing import Literal

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext

from handlers import retention

InboxChange = Literal["add", "remind", "remove"]


class InboxEntry(BaseModel):
    approval_id: str
    run_id: str
    tenant: str
    tool: str
    summary: str
    digest: str
    round: int
    requested_at: float
    deadline: float
    reminders: int = 0


class InboxEvent(BaseModel):
    change: InboxChange
    entry: InboxEntry
    why: str = ""


class InboxItem(InboxEntry):
    age_seconds: float
    left_seconds: float


class InboxView(BaseModel):
    approver: str
    pending: list[InboxItem] = Field(default_factory=list)


approval_inbox = restate.VirtualObject("ApprovalInbox", description="Pending approvals of one approver.")
_ENTRY = "entry:"


# One state key per entry, read lazily: an event touches only its own entry, so its cost (and what it
# journals) does not grow with the number of approvals waiting for the same person.
# Only the runs call `apply` (journaled sends); through the ingress anyone could add or remove entries.
@approval_inbox.handler(
    name="apply", enable_lazy_state=True, journal_retention=retention.NO_JOURNAL, ingress_private=True
)
async def apply(ctx: ObjectContext, event: InboxEvent) -> None:
    """Apply one transition from a run. Idempotent: an older round never overwrites a newer one."""
    key = _ENTRY + event.entry.approval_id
    current = await ctx.get(key, type_hint=InboxEntry)
    if current is not None and current.round > event.entry.round:
        return
    if event.change == "remove":
        ctx.clear(key)
    elif event.change == "remind" and current is not None:
        current.reminders = max(current.reminders, event.entry.reminders)
        ctx.set(key, current)
    else:
        ctx.set(key, event.entry)


@approval_inbox.handler(name="pending", kind="shared", journal_retention=retention.NO_JOURNAL)
async def pending(ctx: ObjectSharedContext) -> InboxView:
    """What waits for this approver, oldest first, with age and time left."""
    entries = [await ctx.get(key, type_hint=InboxEntry) for key in await ctx.state_keys() if key.startswith(_ENTRY)]
    now = await ctx.time()
    items = [
        InboxItem(**e.model_dump(), age_seconds=round(now - e.requested_at, 1), left_seconds=round(e.deadline - now, 1))
        for e in sorted((e for e in entries if e is not None), key=lambda e: e.requested_at)
    ]
    return InboxView(approver=ctx.key(), pending=items)
