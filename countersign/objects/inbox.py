"""`ApprovalInbox`: what waits for one approver (`ApprovalInbox/<email>/pending`).

Guarantee: an inbox changes only through the events the approvals send on every transition
(requested, reminded, escalated, reassigned, decided, closed), so it converges on their own state;
applying the same event twice changes nothing, and an older round never overwrites a newer one.
The entries live in the run's shard of `Bookkeeping` (countersign.objects.bookkeeping), which
takes them in the same call as the approval's audit entries and trust sample, under the approver's
address hashed (`booked_key`: a key name is not sealed like a value, so the address is not spelled
out in it; the hash only hides it from a casual look, it is not a secret); `pending` on the
approver's own key gathers every shard, and what an older version kept in this object (on the
approver's key, and on its shard keys `email#00` … `email#15`, whose `apply` stays for runs still
waiting on that version). `revoke_links` (the operator's `inbox revoke`) moves the approver's
revocation point to now: the inbox page refuses every inbox link made before it; it only ever
moves forward. Only the approvals can write an inbox; the ingress can read one (`pending`) and the
operator can revoke its links.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext

from countersign import retention
from countersign.objects.shards import ask_books, books_keys, is_shard, shard_keys

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


_BOOKED = "inbox:"


class InboxIndex(BaseModel):
    """An approver's entries in one `Bookkeeping` shard: approval id -> the round of its entry (the
    shard holds other keys too, so its entries are never found by listing them)."""

    rounds: dict[str, int] = Field(default_factory=dict)


def booked_key(approver: str) -> str:
    """The state key, in a `Bookkeeping` shard, of `approver`'s index; each of their entries is under
    this key, `:`, and its approval id."""
    return _BOOKED + hashlib.sha256(approver.encode()).hexdigest()[:32]


def book_event(ctx: ObjectContext, approver: str, event: InboxEvent, index: InboxIndex) -> bool:
    """Apply one transition to `approver`'s entry in this `Bookkeeping` shard, given their `index` as
    read (updated here; True when it changed and must be saved). An older round never overwrites a
    newer one, a reminder only touches an entry that is there, and applying the same event twice
    changes nothing: the entry is written, never read."""
    approval_id, round_ = event.entry.approval_id, event.entry.round
    key = f"{booked_key(approver)}:{approval_id}"
    held = index.rounds.get(approval_id)
    if held is not None and held > round_:
        return False
    if event.change == "remove":
        if held is not None:
            ctx.clear(key)
            del index.rounds[approval_id]
        return held is not None
    if event.change == "remind":
        if held is not None:  # the event carries the entry as it is now, reminders counted
            ctx.set(key, event.entry)
        return False
    ctx.set(key, event.entry)
    index.rounds[approval_id] = round_
    return held != round_


def save_index(ctx: ObjectContext, approver: str, index: InboxIndex) -> None:
    if index.rounds:
        ctx.set(booked_key(approver), index)
    else:
        ctx.clear(booked_key(approver))


async def booked_entries(ctx: ObjectSharedContext, approver: str) -> InboxEntries:
    """`approver`'s entries in this `Bookkeeping` shard; every entry is asked for before any is
    awaited (one round trip)."""
    index = await ctx.get(booked_key(approver), type_hint=InboxIndex) or InboxIndex()
    asked = [ctx.get(f"{booked_key(approver)}:{approval_id}", type_hint=InboxEntry) for approval_id in index.rounds]
    found = [await a for a in asked]
    return InboxEntries(entries=[e for e in found if e is not None])


# What an older version sent: runs still waiting on it apply their events here, on the approver's
# shard keys. Never the ingress, where anyone could add or remove entries.
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
        # Every call is made before any answer is awaited: the shards answer side by side.
        older = [ctx.object_call(entries, key=shard, arg=None) for shard in shard_keys(ctx.key())]
        booked = [ask_books(ctx, "inbox", key, ctx.key(), InboxEntries) for key in books_keys()]
        for part in [*older, *booked]:
            found.extend((await part).entries)
    now = await ctx.time()
    items = [
        InboxItem(**e.model_dump(), age_seconds=round(now - e.requested_at, 1), left_seconds=round(e.deadline - now, 1))
        for e in sorted(found, key=lambda e: e.requested_at)
    ]
    revoked = await ctx.get(_REVOKED, type_hint=int) or 0
    return InboxView(approver=ctx.key(), pending=items, revoked_before_ms=revoked)


# Called only by the operator CLI (`python -m countersign inbox revoke EMAIL`) through the ingress, like
# AgentRun's reassign and cancel: it must stay reachable there, and no run ever calls it.
@approval_inbox.handler(name="revoke_links", journal_retention=retention.NO_JOURNAL)
async def revoke_links(ctx: ObjectContext) -> InboxRevocation:
    """Every inbox link made for this approver until now stops working; links made later work."""
    now_ms = int(await ctx.time() * 1000)
    revoked = max(now_ms, await ctx.get(_REVOKED, type_hint=int) or 0)
    ctx.set(_REVOKED, revoked)
    return InboxRevocation(approver=ctx.key(), revoked_before_ms=revoked)
