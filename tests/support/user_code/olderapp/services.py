"""An older version of Countersign's own runs, played by a service served beside this version: `OlderVersion`
sends exactly what that version's runs sent to `ApprovalInbox`, `ApprovalAudit` and `ToolStats` (to the
objects' private handlers, which stay for them), what a run of the first `Bookkeeping` version sent, and
what this version sends when an approval begun there ends or its page is viewed.

Served with `COUNTERSIGN_SERVICES=olderapp.services:older` (tests/support/user_code on the app's
PYTHONPATH) by tests/integration/test_bookkeeping.py."""

import restate

from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntries, AuditEntry, AuditKind, append_all
from countersign.objects.inbox import InboxEntry, InboxEvent, apply
from countersign.objects.shards import first_books_key, shard_key
from countersign.objects.trust import OutcomeSample, record

older = restate.Service("OlderVersion")


def entry(approval_id: str, kind: AuditKind, entry_id: str, at: float) -> AuditEntry:
    return AuditEntry(
        entry_id=entry_id,
        approval_id=approval_id,
        run_id="older-run",
        tenant="default",
        kind=kind,
        at=at,
        actor="finance@example.com" if kind != "requested" else None,
        details={"tool": "issue_refund"},
    )


def waiting_entry(approval_id: str, run_id: str, *, summary: str, requested_at: float) -> InboxEntry:
    return InboxEntry(
        approval_id=approval_id,
        run_id=run_id,
        tenant="default",
        tool="issue_refund",
        summary=summary,
        digest="0" * 64,
        round=1,
        requested_at=requested_at,
        deadline=4102444800.0,
    )


@older.handler()
async def wait_for_a_person(ctx: restate.Context, approval_id: str) -> None:
    # What the older version's run sent when it asked: the inbox entry on the approver's shard key,
    # the request in ApprovalAudit itself, and (after a rejection) the sample on the tool's shard key.
    waiting = waiting_entry(approval_id, "older-run", summary="older", requested_at=1.0)
    inbox_shard = shard_key("finance@example.com", approval_id)
    ctx.object_send(apply, key=inbox_shard, arg=InboxEvent(change="add", entry=waiting))
    requested = entry(approval_id, "requested", "requested/r1", 1.0)
    ctx.object_send(append_all, key=approval_id, arg=AuditEntries(entries=[requested]))
    ctx.object_send(
        record,
        key=shard_key("issue_refund", approval_id),
        arg=OutcomeSample(approval_id="older-run-a9", outcome="rejected", human=True, seconds_to_decision=3.0),
    )


def first_waiting(approval_id: str) -> InboxEntry:
    return waiting_entry(approval_id, "first-run", summary="first", requested_at=1.5)


@older.handler()
async def first_bookkeeping_asked(ctx: restate.Context, approval_id: str) -> None:
    # What a run of the first `Bookkeeping` version sent when it asked: one call, to the shard that
    # version picked by the approval id.
    added = InboxEvent(change="add", entry=first_waiting(approval_id))
    notices = bookkeeping.Notices(
        approval_id=approval_id,
        audit=[entry(approval_id, "requested", "requested/r1", 1.5)],
        inbox=[bookkeeping.InboxNotice(approver="finance@example.com", event=added)],
    )
    ctx.object_send(bookkeeping.apply, key=first_books_key(approval_id), arg=notices)


@older.handler()
async def this_version_decides(ctx: restate.Context, approval_id: str) -> None:
    # What this version's `Approval.run` sends when that approval ends (its run asked on the first
    # version): the inbox removal, to the run's shard.
    removed = InboxEvent(change="remove", entry=first_waiting(approval_id), why="approve")
    notice = bookkeeping.InboxNotice(approver="finance@example.com", event=removed)
    bookkeeping.send_run(ctx, [bookkeeping.Notices(approval_id=approval_id, inbox=[notice])])


@older.handler()
async def viewed_now(ctx: restate.Context, approval_id: str) -> None:
    # This version's page, opened on the older approval: its page view goes to the approval's shard.
    bookkeeping.send_entry(ctx, entry(approval_id, "page_viewed", "page_viewed/r1/s0/m0", 2.0), once_per_entry=True)
