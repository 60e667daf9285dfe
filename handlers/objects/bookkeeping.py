"""`Bookkeeping`: one call per approval and phase keeps its inboxes, audit trail and trust sample.

Guarantee: what an approval tells the world at one point of its life (requested and emailed; voted,
decided, executed; reminded, escalated, reassigned) reaches its shard of this object as one journaled
one-way send (`apply`), so the bookkeeping of an approval costs one invocation per phase, however
many approvers, entries and figures it touches. Each part is applied as its own object applies it:
audit entries chained in order and never twice (handlers.objects.audit), inbox events idempotent
with an older round never overwriting a newer one (handlers.objects.inbox), a trust sample counted
once per approval (handlers.objects.trust). A shard is picked by the approval id alone
(handlers.objects.shards), so approvals of one approver or one tool spread over `SHARDS` keys and no
key is shared by every run of one approver or one tool. Its state is read lazily, key by key (a
shard holds many approvals' trails), and never listed; a call asks for the few values it reads
(the approval's chain, each approver's index, the tool's ring head) at once, in one round trip.

Only Countersign's own services write here (`apply` is `ingress_private`), and the readers are
private too: the ingress reads the views that gather them, `ApprovalInbox/<email>/pending`,
`ApprovalAudit/<approval id>/entries` and `ToolStats/<tool>/stats`.
"""

from __future__ import annotations

import functools

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext

from handlers import retention
from handlers.objects.audit import AuditEntry, AuditLog, append_loaded
from handlers.objects.inbox import (
    InboxEntries,
    InboxEvent,
    InboxIndex,
    book_event,
    booked_entries,
    booked_key,
    save_index,
)
from handlers.objects.shards import BOOKS_SERVICE, books_key
from handlers.objects.trust import OutcomeSample, RingHead, Samples, book_sample, booked_head, booked_samples

bookkeeping = restate.VirtualObject(
    BOOKS_SERVICE, description="Inbox entries, audit trails and trust samples of the approvals of one shard."
)


class InboxNotice(BaseModel):
    """One inbox event for one approver."""

    approver: str
    event: InboxEvent


class Notices(BaseModel):
    """Everything one approval tells its bookkeeping at one point of its life, applied in this order:
    its audit entries, its inbox events, its trust sample (of `tool`)."""

    approval_id: str
    audit: list[AuditEntry] = Field(default_factory=list)
    inbox: list[InboxNotice] = Field(default_factory=list)
    sample: OutcomeSample | None = None
    tool: str = ""


def audit_key(approval_id: str) -> str:
    """The state key of an approval's audit chain in its shard."""
    return f"audit:{approval_id}"


# Only the approvals' own services send here (journaled sends); from the ingress anyone could write
# a predictable audit entry, an inbox entry, or a sample that skews the trust ramp.
@bookkeeping.handler(name="apply", enable_lazy_state=True, journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def apply(ctx: ObjectContext, notices: Notices) -> None:
    """Apply one approval's notices. Each part is idempotent but the sample, which each approval
    sends once (see handlers.objects.trust)."""
    approval_id = notices.approval_id
    if books_key(approval_id) != ctx.key():
        return  # not this shard's approval: only a bug of ours could send it here
    # Every value this call reads is asked for before any is awaited: one round trip for them all.
    chain = ctx.get(audit_key(approval_id), type_hint=AuditLog) if notices.audit else None
    approvers = sorted({notice.approver for notice in notices.inbox})
    indexes = {approver: ctx.get(booked_key(approver), type_hint=InboxIndex) for approver in approvers}
    head = ctx.get(booked_head(notices.tool), type_hint=RingHead) if notices.sample and notices.tool else None
    if chain is not None:
        log = await chain or AuditLog(approval_id=approval_id)
        append_loaded(ctx, audit_key(approval_id), log, notices.audit)
    for approver in approvers:
        index = await indexes[approver] or InboxIndex()
        changed = [book_event(ctx, approver, n.event, index) for n in notices.inbox if n.approver == approver]
        if any(changed):
            save_index(ctx, approver, index)
    if head is not None and notices.sample is not None:
        book_sample(ctx, notices.tool, await head or RingHead(), notices.sample)


def send(ctx: restate.Context, notices: Notices, *, idempotency_key: str | None = None) -> None:
    """Send one approval's notices to its shard (a journaled one-way send)."""
    ctx.object_send(apply, key=books_key(notices.approval_id), arg=notices, idempotency_key=idempotency_key)


def send_entry(ctx: restate.Context, entry: AuditEntry, *, once_per_entry: bool = False) -> None:
    """One audit entry on its own (a page view, a Slack post, a call that no approval waited for).
    `once_per_entry`: sends of an entry id already sent are dropped by Restate (its idempotency key)."""
    key = f"audit/{entry.approval_id}/{entry.entry_id}" if once_per_entry else None
    send(ctx, Notices(approval_id=entry.approval_id, audit=[entry]), idempotency_key=key)


# The readers: shared, private (the ingress reads the views that gather them), and lazy, since a shard
# holds many approvals' trails and a reader needs a few keys of them.
_reader = functools.partial(
    bookkeeping.handler,
    kind="shared",
    enable_lazy_state=True,
    journal_retention=retention.NO_JOURNAL,
    ingress_private=True,
)


@_reader(name="audit")
async def audit(ctx: ObjectSharedContext, approval_id: str) -> AuditLog:
    """The audit chain of `approval_id` in this shard."""
    return await ctx.get(audit_key(approval_id), type_hint=AuditLog) or AuditLog(approval_id=approval_id)


@_reader(name="inbox")
async def inbox(ctx: ObjectSharedContext, approver: str) -> InboxEntries:
    """What waits for `approver` among this shard's approvals."""
    return await booked_entries(ctx, approver)


@_reader(name="samples")
async def samples(ctx: ObjectSharedContext, tool: str) -> Samples:
    """`tool`'s samples and counts among this shard's approvals."""
    return await booked_samples(ctx, tool)
