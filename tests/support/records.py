"""An approval record for tests that need one: a complete baseline that each test overrides where it matters."""

from __future__ import annotations

from countersign.contract import ApprovalRecord

_BASELINE = ApprovalRecord(
    approval_id="run-1-a2",
    run_id="run-1",
    tenant="default",
    index=2,
    tool="issue_refund",
    args={"order_id": 1, "amount_usd": "600.00"},
    digest="d" * 64,
    summary="Refund",
    why="",
    policy="p",
    requester="r@example.com",
    approvers=["a@example.com", "b@example.com"],
    active_slots=[0, 1],
    nonces=["n1"],
    requested_at=1000.0,
    round_started_at=1000.0,
    deadline=2000.0,
)


def approval_record(**changes: object) -> ApprovalRecord:
    return _BASELINE.model_copy(update=changes, deep=True)
