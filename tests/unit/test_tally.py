"""The approval's state machine without Restate: votes, quorum, rounds, deadlines, verdicts, edits."""

from __future__ import annotations

import pytest
from support.records import approval_record

from countersign.approval import tally
from countersign.approval.deadlines import next_event
from countersign.approval.edits import EditRejected, apply_edits
from countersign.approval.verdict import Verdict, VerdictKind, state_of
from countersign.tools import default_registry
from countersign.tools.policy import ToolPolicy

TWO = ToolPolicy(gated=True, approvers=("a@example.com", "b@example.com"), quorum=2)


def vote(kind: VerdictKind, slot: int, *, round_: int = 1, source: str = "human", **more: object) -> Verdict:
    return Verdict.model_validate(
        {"kind": kind, "slot": slot, "round": round_, "digest": "d", "at": 1500.0, "source": source, **more}
    )


def test_approvals_count_towards_the_quorum_and_decide_only_when_it_is_reached() -> None:
    record = approval_record(quorum=2)
    assert tally.record_vote(record, vote("approve", 0, by="a@example.com")) is None
    assert tally.open_slots(record) == [1]
    final = tally.record_vote(record, vote("approve", 1, by="b@example.com"))
    assert final is not None and final.slot == 1 and state_of(final) == "approved"
    assert [v.slot for v in record.approvals_in_round()] == [0, 1]


def test_one_rejection_decides_a_quorum_approval_at_once() -> None:
    record = approval_record(quorum=2)
    tally.record_vote(record, vote("approve", 0))
    final = tally.record_vote(record, vote("reject", 1, reason="no"))
    assert final is not None and state_of(final) == "rejected" and final.reason == "no"


def test_a_system_verdict_on_no_slot_decides_without_being_a_vote() -> None:
    record = approval_record()
    final = tally.record_vote(record, vote("cancel", -1, source="system"))
    assert final is not None and state_of(final) == "cancelled" and record.votes == []


def test_an_undeliverable_slot_leaves_the_quorum_reachable_or_not() -> None:
    single_of_two = approval_record(quorum=1)
    tally.record_vote(single_of_two, vote("undeliverable", 0, source="system"))
    assert tally.quorum_reachable(single_of_two), "the other approver can still decide"
    both_needed = approval_record(quorum=2)
    tally.record_vote(both_needed, vote("undeliverable", 0, source="system"))
    assert not tally.quorum_reachable(both_needed), "two approvals can no longer be had"


def test_votes_of_an_earlier_round_do_not_count_in_the_next() -> None:
    record = approval_record(quorum=2)
    tally.record_vote(record, vote("approve", 0))
    tally.begin_round(record, "n2", 1600.0, note="escalated", keep_approvals=False)
    assert (record.round, record.nonce, record.round_started_at, record.change_note) == (2, "n2", 1600.0, "escalated")
    assert record.approvals_in_round() == [] and tally.open_slots(record) == [0, 1]


def test_a_reassignment_keeps_the_approvals_already_given() -> None:
    record = approval_record(quorum=2, reminders_sent=1)
    tally.record_vote(record, vote("approve", 0))
    tally.begin_round(record, "n2", 1600.0, note=None, keep_approvals=True)
    assert [v.slot for v in record.approvals_in_round()] == [0] and tally.open_slots(record) == [1]
    assert record.reminders_sent == 0 and record.state == "pending"


@pytest.mark.parametrize(
    ("outcome", "low_risk", "kind", "says"),
    [
        ("deny", False, "expire", "without a decision"),
        ("allow", True, "approve", "policy allows it"),
        ("fail", False, "expire", "policy fails the run"),
    ],
)
def test_the_deadline_means_what_the_policy_says(outcome: str, low_risk: bool, kind: str, says: str) -> None:
    policy = ToolPolicy.model_validate(
        {"gated": True, "approvers": ["a@example.com"], "timeout_outcome": outcome, "low_risk": low_risk}
    )
    ending = vote("expire", -1, source="system", reason="the deadline passed without a decision")
    final = tally.at_deadline(ending, policy)
    assert final.kind == kind and final.source == "deadline_default" and says in (final.reason or "")


def test_the_event_bound_covers_every_event_the_policy_allows() -> None:
    policy = ToolPolicy(
        gated=True,
        approvers=("a@example.com",),
        deadline_seconds=100,
        reminders_seconds=(10, 20),
        escalate_after_seconds=50,
        escalate_to=("b@example.com", "c@example.com"),
    )
    # 1 vote + 2 escalations + 3 rounds x (2 reminders + 1 deadline) + a cancel, with room to spare.
    assert tally.event_bound(policy) >= 1 + 2 + 3 * 3 + 1


def test_next_event_orders_reminder_escalation_and_deadline() -> None:
    policy = ToolPolicy(
        gated=True,
        approvers=("a@example.com",),
        deadline_seconds=1000,
        reminders_seconds=(100,),
        escalate_after_seconds=300,
        escalate_to=("b@example.com",),
    )
    record = approval_record(approvers=["a@example.com"], active_slots=[0])
    assert next_event(record, policy) == (1100.0, "reminder")
    record.reminders_sent = 1
    assert next_event(record, policy) == (1300.0, "escalate")
    record.escalations = 1
    assert next_event(record, policy) == (2000.0, "deadline")
    late = approval_record(approvers=["a@example.com"], active_slots=[0], deadline=1050.0)
    assert next_event(late, policy) == (1050.0, "deadline"), "nothing is scheduled after the deadline"


def test_edits_only_where_allowed_and_within_the_rule() -> None:
    refund = default_registry().get("issue_refund")
    assert refund is not None
    frozen = {"order_id": 1, "amount_usd": "600.00", "reason": "r"}
    executed, changed = apply_edits(refund, frozen, {"amount_usd": "450"})
    assert changed == {"amount_usd": "450.00"} and executed["order_id"] == 1
    assert frozen["amount_usd"] == "600.00", "the frozen arguments are never changed in place"
    assert apply_edits(refund, frozen, {"amount_usd": "600.00"})[1] == {}, "the same value is no edit"
    with pytest.raises(EditRejected, match="may only be lowered"):
        apply_edits(refund, frozen, {"amount_usd": "700"})
    with pytest.raises(EditRejected, match="reason cannot be edited"):
        apply_edits(refund, frozen, {"reason": "other"})
    with pytest.raises(EditRejected, match="not valid"):
        apply_edits(refund, frozen, {"amount_usd": "-3"})
