"""What the runs tell the world about their approvals: inboxes, the audit trail, the trust ramp.

Guarantee: every notice reaches its run's `Bookkeeping` shard (countersign.objects.bookkeeping) by a
journaled one-way send (exactly-once delivery through Restate), with a deterministic audit entry id,
so replays and retries neither lose nor repeat one. Notices are held in the run's book and sent
together by `flush`, one call for all the run's approvals whatever they touch (their inbox entries,
audit trails, trust samples, and the entries of calls that ran alone), which the run calls before it
waits for a person, after each turn's approvals, when it ends or fails, on a hard cancel, and once
it holds `HELD_ENTRIES` audit entries (an email step still retrying holds back the notices since the
last flush). The shard is picked by the run, so no object that every run of one approver or one tool
shares is on their way.
"""

from __future__ import annotations

from typing import Any

from countersign.approval.run_state import RunBook
from countersign.approval.verdict import Verdict
from countersign.contract import ActionRecord, ApprovalRecord
from countersign.events import emit as events
from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntry, AuditKind
from countersign.objects.bookkeeping import InboxNotice, Notices
from countersign.objects.inbox import InboxChange, InboxEntry, InboxEvent
from countersign.objects.trust import OutcomeSample


def _entry(record_: ApprovalRecord) -> InboxEntry:
    return InboxEntry(
        approval_id=record_.approval_id,
        run_id=record_.run_id,
        tenant=record_.tenant,
        tool=record_.tool,
        summary=record_.summary,
        digest=record_.digest,
        round=record_.round,
        requested_at=record_.requested_at,
        deadline=record_.deadline,
        reminders=record_.reminders_sent,
    )


def _notices(book: RunBook, approval_id: str) -> Notices:
    """What `approval_id`'s bookkeeping has still to learn from this run."""
    return book.unsent.setdefault(approval_id, Notices(approval_id=approval_id))


def inbox(book: RunBook, record_: ApprovalRecord, change: InboxChange, slots: list[int], why: str = "") -> None:
    if not slots:
        return  # nobody's inbox changes, and `flush` must not send an empty call
    event = InboxEvent(change=change, entry=_entry(record_), why=why)
    notices = _notices(book, record_.approval_id)
    for person in sorted({record_.approvers[s] for s in slots}):
        notices.inbox.append(InboxNotice(approver=person, event=event))


def audit(
    book: RunBook,
    record_: ApprovalRecord,
    kind: AuditKind,
    at: float,
    entry_id: str,
    actor: str | None = None,
    **details: Any,
) -> None:
    entry = AuditEntry(
        entry_id=f"{kind}/{entry_id}",
        approval_id=record_.approval_id,
        run_id=record_.run_id,
        tenant=record_.tenant,
        kind=kind,
        at=at,
        actor=actor,
        details=details,
    )
    note(book, entry)


HELD_ENTRIES = 64
"""A run that calls tools alone for many turns sends their audit entries in calls of about this many
(each under 1 KB), not all at its end."""


def note(book: RunBook, entry: AuditEntry) -> None:
    """Hold `entry` for the run's next flush."""
    _notices(book, entry.approval_id).audit.append(entry)
    if sum(len(notices.audit) for notices in book.unsent.values()) >= HELD_ENTRIES:
        flush(book)


def flush(book: RunBook) -> None:
    """Send what is held so far: one call for the run's shard, each approval's parts in the order
    they happened."""
    if book.unsent:
        bookkeeping.send_run(book.ctx, list(book.unsent.values()))
    book.unsent.clear()


def requested(book: RunBook, record_: ApprovalRecord) -> None:
    inbox(book, record_, "add", record_.active_slots)
    events.approval_requested(book.ctx, record_)
    audit(
        book,
        record_,
        "requested",
        record_.round_started_at,
        f"r{record_.round}",
        summary=record_.summary,
        tool=record_.tool,
        args=record_.args,
        digest=record_.digest,
        why=record_.why,
        policy=record_.policy,
        approvers=[record_.approvers[s] for s in record_.active_slots],
        quorum=record_.quorum,
        deadline=record_.deadline,
        model=book.state.model,
        change_note=record_.change_note,
        policy_version=record_.policy_version,
        context=[f.model_dump() for f in record_.context],
        context_error=record_.context_error,
        trail=[t.model_dump() for t in record_.trail],
        # Post-plan gating: only when set, so an ordinary approval's entry keeps its content.
        **({"approval_kind": record_.kind} if record_.kind != "action" else {}),
        **({"deviation": record_.deviation} if record_.deviation else {}),
        **_checkpoints(record_),
    )


def _checkpoints(record_: ApprovalRecord) -> dict[str, Any]:
    """Why a call was stopped, in the `requested` entry only when a checkpoint stopped it (older
    entries keep their shape)."""
    found: dict[str, Any] = {}
    if record_.stopped_because:
        found["stopped_because"] = [s.model_dump() for s in record_.stopped_because]
    if record_.confidence is not None:
        found["confidence"] = record_.confidence
    return found


def voted(book: RunBook, record_: ApprovalRecord, verdict: Verdict) -> None:
    inbox(book, record_, "remove", [verdict.slot], why=verdict.kind)
    audit(
        book,
        record_,
        "decided",
        verdict.at,
        f"r{verdict.round}/s{verdict.slot}",
        actor=verdict.by or verdict.asked_by,
        verdict=verdict.kind,
        reason=verdict.reason,
        edits=verdict.edits,
        client=verdict.client,
        source=verdict.source,
    )


def handed_over(
    book: RunBook,
    record_: ApprovalRecord,
    old_slots: list[int],
    kind: AuditKind,
    at: float,
    actor: str | None = None,
    **details: Any,
) -> None:
    """After an escalation or a reassignment opened a new round: old approvers out, new ones in.
    `actor` is who asked for a reassignment."""
    inbox(book, record_, "remove", [s for s in old_slots if s not in record_.active_slots], why=kind)
    audit(
        book,
        record_,
        kind,
        at,
        f"r{record_.round}",
        actor=actor,
        previous=[record_.approvers[s] for s in old_slots],
        now=[record_.approvers[s] for s in record_.active_slots],
        **details,
    )
    requested(book, record_)


def reminded(book: RunBook, record_: ApprovalRecord, slots: list[int], at: float) -> None:
    inbox(book, record_, "remind", slots)
    audit(book, record_, "reminded", at, f"r{record_.round}/n{record_.reminders_sent}")


def emailed(book: RunBook, record_: ApprovalRecord, slot: int, kind: str, provider_id: str, at: float) -> None:
    audit(
        book,
        record_,
        "email_accepted",
        at,
        f"{kind}/r{record_.round}/s{slot}/n{record_.reminders_sent}",
        to=record_.approvers[slot],
        email=kind,
        provider_id=provider_id,
    )


def closed(book: RunBook, record_: ApprovalRecord, slots: list[int], why: str) -> None:
    """Off the inboxes of those still deciding (`voted` already took off those who decided)."""
    decided = {v.slot for v in record_.votes if v.round == record_.round and v.kind in ("approve", "reject")}
    inbox(book, record_, "remove", [s for s in slots if s not in decided], why=why)


def finished(book: RunBook, record_: ApprovalRecord, action: ActionRecord, at: float) -> None:
    """The action's end: executed (if it ran), the final outcome, and a trust-ramp sample."""
    if action.args is not None:
        audit(
            book,
            record_,
            "executed",
            at,
            "0",
            result=action.result,
            args=action.args,
            idempotency_key=action.idempotency_key,
        )
    audit(
        book,
        record_,
        "outcome",
        at,
        "0",
        actor=record_.decided_by,
        outcome=action.outcome.value,
        source=action.decision_source,
        reason=action.reason,
        approved_by=action.approved_by,
    )
    human = action.decision_source == "human"
    sample = OutcomeSample(
        approval_id=record_.approval_id,
        outcome=action.outcome.value,
        human=human,
        seconds_to_decision=round(record_.decided_at - record_.requested_at, 3)
        if human and record_.decided_at
        else None,
        edited=bool(action.edits),
        triggers=sorted({s.kind for s in record_.stopped_because}),
    )
    notices = _notices(book, record_.approval_id)
    notices.sample, notices.tool = sample, record_.tool
