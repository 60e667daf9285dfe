"""The approvals' bookkeeping after the move to `Bookkeeping` shards: what an older version kept in
`ApprovalInbox`, `ApprovalAudit` and `ToolStats` themselves still shows in their views, beside what
this version keeps, and an approval whose trail began in the older object continues in its shard.

The older version is played by a service of the test's own, served beside Countersign's, that sends
exactly what that version's runs sent (to the objects' private handlers, which stay for them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.approver import submit, wait_for_email
from support.business import new_order
from support.processes import IsolatedStack, StackFactory, wait_until

from countersign.objects.audit import AuditLog, verify
from countersign.objects.shards import books_key, first_books_key

APPROVER, TOOL = "finance@example.com", "issue_refund"
OLDER = "older-run-a0"
OLDER_VERSION = """
import restate

from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntries, AuditEntry, append_all
from countersign.objects.inbox import InboxEntry, InboxEvent, apply
from countersign.objects.shards import first_books_key, shard_key
from countersign.objects.trust import OutcomeSample, record

older = restate.Service("OlderVersion")


def entry(approval_id: str, kind: str, entry_id: str, at: float) -> AuditEntry:
    return AuditEntry(
        entry_id=entry_id, approval_id=approval_id, run_id="older-run", tenant="default", kind=kind, at=at,
        actor="finance@example.com" if kind != "requested" else None, details={"tool": "issue_refund"},
    )


@older.handler()
async def wait_for_a_person(ctx: restate.Context, approval_id: str) -> None:
    # What the older version's run sent when it asked: the inbox entry on the approver's shard key,
    # the request in ApprovalAudit itself, and (after a rejection) the sample on the tool's shard key.
    waiting = InboxEntry(
        approval_id=approval_id, run_id="older-run", tenant="default", tool="issue_refund", summary="older",
        digest="0" * 64, round=1, requested_at=1.0, deadline=4102444800.0,
    )
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
    return InboxEntry(
        approval_id=approval_id, run_id="first-run", tenant="default", tool="issue_refund", summary="first",
        digest="0" * 64, round=1, requested_at=1.5, deadline=4102444800.0,
    )


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
"""


@pytest.fixture()
def stack(private_stacks: StackFactory, tmp_path: Path) -> IsolatedStack:
    package = tmp_path / "project" / "olderapp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "services.py").write_text(textwrap.dedent(OLDER_VERSION))
    env = {"COUNTERSIGN_SERVICES": "olderapp.services:older", "PYTHONPATH": str(package.parent)}
    return private_stacks(app_env=env)


def _pending(stack: IsolatedStack) -> set[str]:
    reply = stack.ingress.call("ApprovalInbox", APPROVER, "pending", None)
    reply.raise_for_status()
    return {item["approval_id"] for item in reply.json()["pending"]}


def _trail(stack: IsolatedStack, approval_id: str) -> AuditLog:
    return AuditLog.model_validate(stack.ingress.call("ApprovalAudit", approval_id, "entries", None).json())


def test_what_an_older_version_kept_shows_beside_what_this_one_keeps(stack: IsolatedStack) -> None:
    assert stack.ingress.call("OlderVersion", None, "wait_for_a_person", OLDER).status_code == 200
    refund = {
        "tool": TOOL,
        "args": {"order_id": new_order(stack.db_path, 100000), "amount_usd": "700.00", "reason": "r"},
    }
    stack.ingress.start_run("newer-run", {"goal": "refund", "requester": "alice@example.com", "script": [refund]})
    [mail] = wait_for_email(stack.outbox_dir, "newer-run")

    # The inbox gathers the older version's shard key and this version's bookkeeping shard.
    wait_until(lambda: {OLDER, "newer-run-a0"} <= _pending(stack), 30, "both waiting approvals in the inbox")

    # The older approval's trail: its chain in ApprovalAudit, then the one this version began in its
    # shard (a page view); each chain verifies on its own.
    assert stack.ingress.call("OlderVersion", None, "viewed_now", OLDER).status_code == 200
    trail = wait_until(lambda: t if len((t := _trail(stack, OLDER)).entries) == 2 else None, 30, "both chains")
    assert [(e.kind, e.seq) for e in trail.entries] == [("requested", 0), ("page_viewed", 0)]
    assert verify(trail.entries) == []

    # The figures count the older version's sample and this version's, once each.
    assert submit(mail.link, "approve").status_code == 200
    assert stack.ingress.wait_output("newer-run").json()["status"] == "completed"

    def both_counted() -> dict[str, int] | None:
        counts: dict[str, int] = stack.ingress.call("ToolStats", TOOL, "stats", None).json()["counts"]
        return counts if counts.get("approved") == 1 and counts.get("rejected") == 1 else None

    assert wait_until(both_counted, 30, "both samples in the figures") == {"approved": 1, "rejected": 1}
    wait_until(lambda: _pending(stack) == {OLDER}, 30, "the decided approval to leave the inbox")
    newer = _trail(stack, "newer-run-a0")
    kinds = [e.kind for e in newer.entries]
    assert kinds[0] == "requested" and kinds[-1] == "outcome" and "decided" in kinds, kinds
    assert [e.seq for e in newer.entries] == list(range(len(kinds))), "one chain, in the approval's shard"


def test_an_approval_the_first_bookkeeping_placed_by_its_id_keeps_its_inbox_entry_and_trail(
    stack: IsolatedStack,
) -> None:
    """The first `Bookkeeping` picked an approval's shard by the approval id; this one picks its run's.
    An approval that began before the upgrade stays in the inbox until its end, told to its run's
    shard, takes it off; its trail continues in its run's shard: both chains show, oldest first, and
    each verifies."""
    approval = next(a for a in (f"first-run-{n}-a0" for n in range(100)) if first_books_key(a) != books_key(a))
    assert stack.ingress.call("OlderVersion", None, "first_bookkeeping_asked", approval).status_code == 200
    wait_until(lambda: approval in _pending(stack), 30, "the approval in the approver's inbox")
    assert stack.ingress.call("OlderVersion", None, "viewed_now", approval).status_code == 200
    trail = wait_until(lambda: t if len((t := _trail(stack, approval)).entries) == 2 else None, 30, "both chains")
    assert [(e.kind, e.seq) for e in trail.entries] == [("requested", 0), ("page_viewed", 0)]
    assert verify(trail.entries) == []
    # Its end, told by this version to the run's shard, still takes it off the inbox.
    assert stack.ingress.call("OlderVersion", None, "this_version_decides", approval).status_code == 200
    wait_until(lambda: approval not in _pending(stack), 30, "the decided approval to leave the inbox")
