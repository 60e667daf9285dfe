"""`ApprovalInbox`: a Virtual Object per approver (key = email) listing what waits for them.

Guarantee: its entries change only through `apply`, which runs receive as journaled one-way sends on
every transition (requested, reminded, escalated, reassigned, decided, closed), so it converges on the
runs' own state; applying the same event twice changes nothing. `revoke_links` (the operator's
`inbox revoke`) moves the approver's revocation point to now: the inbox page refuses every inbox link
made before it; it only ever moves forward. `apply` is `ingress_private`: only the runs
can write an inbox; the ingress can read one (`pending`) and the operator can revoke its links.
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
    revoked_before_ms: int = Field(default=0, description="inbox links made before this are refused")


class InboxRevocation(BaseModel):
    approver: str
    revoked_before_ms: int


approval_inbox = restate.VirtualObject("ApprovalInbox", description="Pending approvals of one approver.")
_ENTRY = "entry:"
_REVOKED = "revoked_before_ms"


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
    revoked = await ctx.get(_REVOKED, type_hint=int) or 0
    return InboxView(approver=ctx.key(), pending=items, revoked_before_ms=revoked)


# Called only by the operator CLI (`python -m handlers inbox revoke EMAIL`) through the ingress, like
# AgentRun's reassign and cancel: it must stay reachable there, and no run ever calls it.
@approval_inbox.handler(name="revoke_links", journal_retention=retention.NO_JOURNAL)
async def revoke_links(ctx: ObjectContext) -> InboxRevocation:
    """Every inbox link made for this approver until now stops working; links made later work."""
    now_ms = int(await ctx.time() * 1000)
    revoked = max(now_ms, await ctx.get(_REVOKED, type_hint=int) or 0)
    ctx.set(_REVOKED, revoked)
    return InboxRevocation(approver=ctx.key(), revoked_before_ms=revoked)
