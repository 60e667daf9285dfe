"""`Bookkeeping`: one call per run and phase keeps its approvals' inboxes, audit trails and trust samples.

Guarantee: what a run's approvals (and its autonomous calls) tell the world at one point of its life
(requested and emailed; voted, decided, executed; reminded, escalated, reassigned; run alone) reaches
the run's shard of this object as one journaled one-way send (`apply_run`), so bookkeeping costs one
invocation per phase, however many approvals, approvers, entries and figures it touches. Each part
is applied as its own object applies it: audit entries chained in order and never twice
(countersign.objects.audit), inbox events idempotent with an older round never overwriting a newer one
(countersign.objects.inbox), a trust sample counted once per approval (countersign.objects.trust). A shard
is picked by the run (countersign.objects.shards), so approvals of one approver or one tool spread over
`SHARDS` keys and no key is shared by every run of one approver or one tool. Its state is read
lazily, key by key (a shard holds many approvals' trails), and never listed; a call asks for the few
values it reads (the approvals' chains, each approver's index, each tool's ring head) at once, in one
round trip. The first version picked the shard by the approval id: an inbox entry it booked there is
changed there (`_booked_first`), and the views read both places, so an upgrade loses nothing.

Only Countersign's own services write here (`apply_run` and `apply` are `ingress_private`), and the
readers are private too: the ingress reads the views that gather them, `ApprovalInbox/<email>/pending`,
`ApprovalAudit/<approval id>/entries` and `ToolStats/<tool>/stats`.
"""

from __future__ import annotations

import functools
import logging

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext

from countersign import retention
from countersign.objects.audit import AuditEntry, AuditLog, append_loaded, asks_again
from countersign.objects.inbox import (
    InboxEntries,
    InboxEvent,
    InboxIndex,
    book_event,
    booked_entries,
    booked_key,
    save_index,
)
from countersign.objects.shards import BOOKS_SERVICE, books_key, first_books_key
from countersign.objects.trust import OutcomeSample, RingHead, Samples, book_sample, booked_head, booked_samples

logger = logging.getLogger("countersign.bookkeeping")

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


class RunNotices(BaseModel):
    """What several approvals of one run tell their shard at once, each approval's in order."""

    notices: list[Notices]


# Only the approvals' own services send here (journaled sends); from the ingress anyone could write
# a predictable audit entry, an inbox entry, or a sample that skews the trust ramp.
@bookkeeping.handler(
    name="apply_run", enable_lazy_state=True, journal_retention=retention.NO_JOURNAL, ingress_private=True
)
async def apply_run(ctx: ObjectContext, batch: RunNotices) -> None:
    """Apply a run's notices. Each part is idempotent but the sample, which each approval sends
    once (see countersign.objects.trust)."""
    await _apply(ctx, batch.notices)


# One approval's notices: an entry sent on its own (`send_entry`, with an idempotency key), and what
# the first version of this object was sent (runs still waiting on it send here).
@bookkeeping.handler(name="apply", enable_lazy_state=True, journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def apply(ctx: ObjectContext, notices: Notices) -> None:
    """Apply one approval's notices, as `apply_run` does."""
    await _apply(ctx, [notices])


async def _apply(ctx: ObjectContext, batch: list[Notices]) -> None:
    # Not this shard's approval: only a bug of ours could send it here. The first version's senders
    # picked the shard by the approval id (countersign.objects.shards), and their runs may still send.
    mine = [n for n in batch if ctx.key() in (books_key(n.approval_id), first_books_key(n.approval_id))]
    # Every value this call reads is asked for before any is awaited: one round trip for them all.
    trails = sorted({n.approval_id for n in mine if n.audit})
    chains = {a: ctx.get(audit_key(a), type_hint=AuditLog) for a in trails}
    approvers = sorted({notice.approver for n in mine for notice in n.inbox})
    indexes = {approver: ctx.get(booked_key(approver), type_hint=InboxIndex) for approver in approvers}
    tools = sorted({n.tool for n in mine if n.sample and n.tool})
    heads = {tool: ctx.get(booked_head(tool), type_hint=RingHead) for tool in tools}
    logs = {approval_id: await chain or AuditLog(approval_id=approval_id) for approval_id, chain in chains.items()}
    # A placement is asked once: a caller asking again at a used run id and index sends its request's
    # notices before the approval's workflow refuses it (countersign.approval.calls). Its entries would
    # put a second request in the trail (which `verify` reports as forged) and its inbox event would
    # list an approval nobody asked, so all it sent is dropped here. (Two callers racing at one
    # placement both send before either learns which won: the trail keeps the request that came first.)
    again = {n.approval_id for n in mine if n.audit and asks_again(logs[n.approval_id], n.audit)}
    for approval_id in sorted(again):
        logger.warning("%s was asked again at its placement; the second ask is ignored", approval_id)
    mine = [n for n in mine if n.approval_id not in again]
    for approval_id, log in logs.items():
        entries = [entry for n in mine if n.approval_id == approval_id for entry in n.audit]
        append_loaded(ctx, audit_key(approval_id), log, entries)
    elsewhere: dict[str, list[InboxNotice]] = {}
    for approver, asked_index in indexes.items():
        index = await asked_index or InboxIndex()
        changed = False
        for n in mine:
            for notice in (x for x in n.inbox if x.approver == approver):
                if _booked_first(ctx, n.approval_id, notice, index):
                    elsewhere.setdefault(n.approval_id, []).append(notice)
                elif book_event(ctx, approver, notice.event, index):
                    changed = True
        if changed:
            save_index(ctx, approver, index)
    for approval_id, notices in elsewhere.items():
        ctx.object_send(apply, key=first_books_key(approval_id), arg=Notices(approval_id=approval_id, inbox=notices))
    for tool, asked_head in heads.items():
        head = await asked_head or RingHead()
        for n in mine:
            if n.sample is not None and n.tool == tool:
                book_sample(ctx, tool, head, n.sample)


def _booked_first(ctx: ObjectContext, approval_id: str, notice: InboxNotice, index: InboxIndex) -> bool:
    """Whether `notice` changes an inbox entry that the first version of this object booked in the
    approval's other shard (by the approval id): a run still on that version asked, and this one's
    `Approval.run` ends it. `_apply` passes such a notice on to that shard, where it applies."""
    return (
        notice.event.change != "add" and approval_id not in index.rounds and first_books_key(approval_id) != ctx.key()
    )


def send(ctx: restate.Context, notices: Notices, *, idempotency_key: str | None = None) -> None:
    """Send one approval's notices to its shard (a journaled one-way send)."""
    ctx.object_send(apply, key=books_key(notices.approval_id), arg=notices, idempotency_key=idempotency_key)


def send_run(ctx: restate.Context, batch: list[Notices]) -> None:
    """Send approvals' notices, one call per shard (a run's approvals share one), in their order."""
    by_key: dict[str, list[Notices]] = {}
    for notices in batch:
        by_key.setdefault(books_key(notices.approval_id), []).append(notices)
    for key, notices_of_key in by_key.items():
        ctx.object_send(apply_run, key=key, arg=RunNotices(notices=notices_of_key))


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
