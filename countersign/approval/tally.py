"""The approval's state machine as pure functions of its record: votes, quorum, rounds, deadlines.

Guarantee: nothing here touches Restate or the clock; the waiting loop (`countersign.approval.waiting`) journals
and sends what these functions decide, so every replay takes the same transitions.

The states of one round: every active slot is open until its promise completes with a verdict.
A person's approval counts towards the quorum; any other verdict on a slot (a person's rejection, a
veto, the deadline, a cancel) decides the approval at once, except `undeliverable`, which only takes
that slot out while the others can still reach the quorum. A new round (escalation, reassignment,
re-approval) reopens the active slots with a fresh nonce, so older links stop working.
"""

from __future__ import annotations

from countersign.approval.verdict import Verdict
from countersign.contract import ApprovalRecord, Vote
from countersign.objects.delivery import DeliveryFailure
from countersign.tools.policy import ToolPolicy


def open_slots(record: ApprovalRecord) -> list[int]:
    """The active slots of this round that have no verdict yet."""
    voted = {v.slot for v in record.votes if v.round == record.round}
    return [s for s in record.active_slots if s not in voted]


def record_vote(record: ApprovalRecord, verdict: Verdict) -> Verdict | None:
    """Count one slot's verdict (system verdicts on no slot, slot -1, are not votes); the deciding
    verdict if the approval is now decided, else None (an approval short of its quorum)."""
    if verdict.slot >= 0:
        record.votes.append(
            Vote(
                slot=verdict.slot,
                round=verdict.round,
                kind=verdict.kind,
                by=verdict.by,
                at=verdict.at,
                reason=verdict.reason,
            )
        )
    if verdict.kind == "approve" and verdict.source == "human":
        return verdict if len(record.approvals_in_round()) >= record.quorum else None
    return verdict


def quorum_reachable(record: ApprovalRecord) -> bool:
    """Whether the approvals given plus the slots still open can reach the quorum."""
    return len(record.approvals_in_round()) + len(open_slots(record)) >= record.quorum


def begin_round(record: ApprovalRecord, nonce: str, now: float, note: str | None, keep_approvals: bool) -> None:
    """Open the next round: fresh nonce and clock, no reminders yet; a reassignment keeps the
    approvals already given (they count again in the new round), an escalation does not."""
    if keep_approvals:
        record.votes += [v.model_copy(update={"round": record.round + 1}) for v in record.approvals_in_round()]
    record.round += 1
    record.nonces.append(nonce)
    record.round_started_at = now
    record.reminders_sent = 0
    record.change_note = note
    record.state = "pending"


def at_deadline(ending: Verdict, policy: ToolPolicy) -> Verdict:
    """What an unanswered deadline means under the tool's `timeout_outcome`: deny (expired), allow
    (approved, for low-risk tools only) or fail (expired, and the run fails); never from a person."""
    final = ending.model_copy(update={"source": "deadline_default"})
    if policy.timeout_outcome == "allow":
        return final.model_copy(update={"kind": "approve", "reason": "the deadline passed; policy allows it"})
    if policy.timeout_outcome == "fail":
        return final.model_copy(update={"reason": "the deadline passed; policy fails the run"})
    return final


def event_bound(policy: ToolPolicy) -> int:
    """An upper bound on the events one approval can see (votes, reminders, escalations, the
    deadline and the cancel), which bounds the waiting loop."""
    rounds = 1 + len(policy.escalate_to)
    return 2 + len(policy.approvers) + len(policy.escalate_to) + rounds * (1 + len(policy.reminders_seconds))


def slot_verdict(record: ApprovalRecord, failure: DeliveryFailure, now: float) -> Verdict | None:
    """What `Approval.delivery_failed` completes the failed slot's decision promise with: that approver
    cannot decide (`undeliverable`, from the system). The waiting loop then escalates, waits for the
    other approvers, or resolves the approval as `undeliverable` when nobody is left. None when the
    failure is stale: another round, a decided approval, or a slot that is no longer asked or already voted."""
    if record.approval_id != failure.approval_id or record.state != "pending" or failure.round != record.round:
        return None
    voted = {v.slot for v in record.votes if v.round == record.round}
    if failure.slot not in record.active_slots or failure.slot in voted:
        return None
    return undeliverable(failure, record.digest, now)


def undeliverable(failure: DeliveryFailure, digest: str, now: float) -> Verdict:
    """The `undeliverable` verdict of the slot a failed delivery was for."""
    what = failure.event.removeprefix("email.")
    return Verdict(
        kind="undeliverable",
        slot=failure.slot,
        round=failure.round,
        digest=digest,
        at=now,
        reason=f"the approval email could not be delivered ({what}{': ' + failure.detail if failure.detail else ''})",
        source="system",
    )
