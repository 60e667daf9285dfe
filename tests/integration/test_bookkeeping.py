"""The approvals' bookkeeping after the move to `Bookkeeping` shards: what an older version kept in
`ApprovalInbox`, `ApprovalAudit` and `ToolStats` themselves still shows in their views, beside what
this version keeps, and an approval whose trail began in the older object continues in its shard.

The older version is played by a service of the test's own, served beside Countersign's, that sends
exactly what that version's runs sent (to the objects' private handlers, which stay for them):
`olderapp.services` in tests/support/user_code."""

from __future__ import annotations

import pytest
from support.approver import submit, wait_for_email
from support.business import new_order
from support.processes import IsolatedStack, StackFactory, user_services, wait_until

from countersign.objects.audit import AuditLog, verify
from countersign.objects.shards import books_key, first_books_key

APPROVER, TOOL = "finance@example.com", "issue_refund"
OLDER = "older-run-a0"


@pytest.fixture()
def stack(private_stacks: StackFactory) -> IsolatedStack:
    return private_stacks(app_env=user_services("olderapp.services:older"))


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
