"""Unit tests: the approval pages' words (deadline, state pages, next steps) and the email's deadline."""

from __future__ import annotations

import pytest

from countersign.contract import ActionRecord, ApprovalRecord, Outcome
from countersign.mail.render import environment
from countersign.timewords import duration
from countersign.web import wording

NOW = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "less than a minute"),
        (59, "less than a minute"),
        (60, "1 minute"),
        (45 * 60 + 30, "45 minutes"),
        (3600, "1 hour"),
        (5 * 3600 + 12 * 60, "5 hours 12 minutes"),
        (24 * 3600, "1 day"),
        (24 * 3600 - 1, "23 hours 59 minutes"),
        (2 * 86400 + 3 * 3600 + 59 * 60, "2 days 3 hours"),
        (7 * 86400, "7 days"),
    ],
)
def test_durations_read_as_plain_words_and_match_the_email(seconds: int, words: str) -> None:
    assert duration(seconds) == words
    assert environment().filters["duration"](seconds) == words


def test_deadline_is_relative_and_absolute() -> None:
    ahead = wording.deadline(NOW + 90 * 60, NOW)
    assert ahead.relative == "in 1 hour 30 minutes" and not ahead.passed
    assert ahead.absolute.text == "2026-09-21 15:43 UTC" and ahead.absolute.iso == "2026-09-21T15:43:20Z"
    gone = wording.deadline(NOW - 1, NOW)
    assert gone.relative == "passed" and gone.passed


def _record() -> ApprovalRecord:
    return ApprovalRecord(
        approval_id="r-a1",
        run_id="r",
        tenant="default",
        index=1,
        tool="issue_refund",
        args={"order_id": 1042, "amount_usd": "612.40"},
        digest="d" * 64,
        summary="Refund $612.40 to order 1042",
        why="",
        policy="p",
        requester="alice@example.com",
        approvers=["finance@example.com"],
        active_slots=[0],
        nonces=["n"],
        requested_at=NOW,
        round_started_at=NOW,
        deadline=NOW + 3600,
    )


def _action(outcome: Outcome, result: dict[str, object] | None) -> ActionRecord:
    return ActionRecord(
        index=1, tool="issue_refund", proposed_args={}, outcome=outcome, approval_id="r-a1", result=result
    )


def test_an_approved_action_says_only_what_the_history_shows() -> None:
    record = _record()
    running = wording.closed_state("approved", "finance@example.com", NOW, None, None)
    assert running.title == "Already approved"
    assert running.headline == "This action was approved by finance@example.com at 2026-09-21 14:13 UTC."
    assert "has run" not in running.consequence
    ran = wording.action_of([_action(Outcome.APPROVED, {"refund_id": 7})], record)
    edited = wording.closed_state("approved_with_edits", "f@example.com", NOW, "lowered", ran)
    assert edited.headline.startswith("This action was approved with edits by f@example.com")
    assert edited.reason == "lowered"
    assert wording.closed_state("approved", "f@example.com", NOW, None, ran).consequence == (
        "It has run, once. Result: refund_id 7."
    )
    failed = _action(Outcome.FAILED, {"error": "order 1042 has only $0.00 left to refund"})
    words = wording.closed_state("approved", "f@example.com", NOW, None, failed).consequence
    assert "did not complete: order 1042 has only $0.00 left to refund" in words
    assert wording.action_of([_action(Outcome.APPROVED, None).model_copy(update={"approval_id": "x"})], record) is None


@pytest.mark.parametrize(
    ("state", "title", "reason_shown"),
    [
        ("rejected", "Already rejected", True),
        ("expired", "Expired", False),
        ("cancelled", "Cancelled", True),
        ("undeliverable", "Not delivered", False),
        ("superseded", "Superseded", True),
        ("failed", "Approved but not run", True),
        ("escalated", "Handed on", False),
        ("something_new", "No longer waiting", False),
    ],
)
def test_every_closed_state_says_the_action_did_not_run(state: str, title: str, reason_shown: bool) -> None:
    closed = wording.closed_state(state, None, NOW, "the stated reason", None)
    assert closed.title == title
    assert (closed.reason == "the stated reason") is reason_shown
    honest = ("did not run", "Nothing was changed", "no longer decides", "can no longer be decided")
    assert any(words in closed.consequence for words in honest)
    assert "has run" not in closed.consequence
    assert "2026-09-21 14:13 UTC" in closed.headline


def test_next_steps_and_notice_hints() -> None:
    assert "issue_refund with exactly the arguments you saw (fingerprint abc), once" in wording.next_steps(
        "approved", "issue_refund", "abc"
    )
    assert wording.next_steps("rejected", "issue_refund", "abc").startswith("The action will not run.")
    assert "with your edited arguments, once" in wording.next_steps("approved_with_edits", "issue_refund", "abc")
    waiting = wording.next_steps("approved", "issue_refund", "abc", quorum=2)
    assert "runs only once 2 approvers have approved" in waiting and "now runs" not in waiting
    assert wording.notice_hint(403, "This link is not valid.").startswith("Nothing was decided.")
    assert not wording.notice_hint(400, "Too long. Nothing was decided.").startswith("Nothing was decided.")
    assert wording.notice_hint(503, "busy") == ""
