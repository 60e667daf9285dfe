"""`ApprovalInbox`: a Virtual Object per approver (key = email) listing what waits for them.

Guarantee: its entries change only through `apply`, which runs receive as journaled one-way sends on
every transition (requested, reminded, escalated, reassigned, decided, closed), so it converges on the
runs' own state; applying the same event twice changes nothing. The entries live in the approver's
shards (`email#00` … `email#15`, see handlers.objects.shards), an approval always in the same one,
so the bookkeeping of many runs of one approver does not queue behind one object; `pending` on the
approver's own key gathers every shard (and entries an older version kept on that key). `revoke_links` (the operator's
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
from handlers.objects.shards import is_shard, shard_key, shard_keys

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


class InboxEntries(BaseModel):
    entries: list[InboxEntry] = Field(default_factory=list)


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


def inbox_key(approver: str, approval_id: str) -> str:
    """Where `apply` events of this approval for this approver go: the approver's shard of it."""
    return shard_key(approver, approval_id)


async def _own_entries(ctx: ObjectSharedContext) -> list[InboxEntry]:
    found = [await ctx.get(key, type_hint=InboxEntry) for key in await ctx.state_keys() if key.startswith(_ENTRY)]
    return [e for e in found if e is not None]


# Private: `pending` gathers the shards; through the ingress, `pending` is the one way to read an inbox.
@approval_inbox.handler(name="entries", kind="shared", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def entries(ctx: ObjectSharedContext) -> InboxEntries:
    """The entries this key itself holds (one shard's share of an approver's inbox)."""
    return InboxEntries(entries=await _own_entries(ctx))


@approval_inbox.handler(name="pending", kind="shared", journal_retention=retention.NO_JOURNAL)
async def pending(ctx: ObjectSharedContext) -> InboxView:
    """What waits for this approver, oldest first, with age and time left."""
    found = await _own_entries(ctx)
    if not is_shard(ctx.key()):
        calls = [ctx.object_call(entries, key=shard, arg=None) for shard in shard_keys(ctx.key())]
        for part in await restate.gather(*calls):
            found.extend((await part).entries)
    now = await ctx.time()
    items = [
        InboxItem(**e.model_dump(), age_seconds=round(now - e.requested_at, 1), left_seconds=round(e.deadline - now, 1))
        for e in sorted(found, key=lambda e: e.requested_at)
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
