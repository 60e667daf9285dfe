"""The gate: a model turn's gated calls are frozen, put to the approvers, and acted on.

Guarantee: each action is frozen (canonical JSON + SHA-256 digest) before anyone is asked, and the
calls of one turn are asked together (one email and one page per approver). Only an approval runs
the frozen (or validated, edited) arguments, after a fresh precondition check, exactly once under
`<run_id>/<index>`; when the world moved meanwhile the action is superseded (or asked again).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from handlers import confirm, ledger, links
from handlers.contract import ActionRecord, ApprovalRecord, ApprovalState, Outcome
from handlers.edits import EditRejected, apply_edits
from handlers.execute import idempotency_key, recheck, run_tool
from handlers.llm.base import ToolCall
from handlers.mail.outcome_email import NoticeOutcome, send_outcome_notice
from handlers.policy import PolicyVerdict
from handlers.rounds import Opening, closing, open_round
from handlers.run_state import RunBook
from handlers.tools.registry import Tool
from handlers.verdict import Verdict, state_of
from handlers.waiting import Waiter, send_step, wait_all

_DIGEST_DOMAIN = b"countersign.action.v1\x00"
MAX_REAPPROVALS = 2
_OUTCOME_OF: dict[ApprovalState, Outcome] = {
    "approved": Outcome.APPROVED,
    "approved_with_edits": Outcome.APPROVED_WITH_EDITS,
    "rejected": Outcome.REJECTED,
    "expired": Outcome.EXPIRED,
    "cancelled": Outcome.CANCELLED,
    "superseded": Outcome.SUPERSEDED,
    "undeliverable": Outcome.UNDELIVERABLE,
    "failed": Outcome.FAILED,
}


_NOTICE: dict[Outcome, NoticeOutcome] = {
    Outcome.APPROVED: "executed",
    Outcome.APPROVED_WITH_EDITS: "executed",
    Outcome.FAILED: "failed",
    Outcome.REJECTED: "rejected",
    Outcome.EXPIRED: "expired",
    Outcome.UNDELIVERABLE: "undeliverable",
    Outcome.SUPERSEDED: "superseded",
}


@dataclass(frozen=True)
class GatedCall:
    tool: Tool
    call: ToolCall
    args: dict[str, Any]
    index: int
    policy: PolicyVerdict
    summary: str
    opening: Opening


@dataclass
class GateResult:
    action: ActionRecord
    fail_run: bool = False


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def action_digest(run_id: str, index: int, tool: str, args: dict[str, Any]) -> str:
    frozen = canonical_json({"run": run_id, "index": index, "tool": tool, "args": args})
    return hashlib.sha256(_DIGEST_DOMAIN + frozen.encode()).hexdigest()


async def approve_and_act(book: RunBook, calls: list[GatedCall]) -> list[GateResult]:
    """Ask about every call of one turn together, then act on each verdict in order."""
    batch = [c.index for c in calls] if len(calls) > 1 else []
    now = calls[-1].opening.now
    waiters = []
    for gated in calls:
        record = _freeze(book, gated, gated.opening.nonce, now, batch)
        book.state.approvals[record.approval_id] = record
        waiters.append(Waiter(book, record, gated.policy.policy))
    book.state.phase = "awaiting_approval"
    book.save()
    for waiter in waiters:
        ledger.requested(book, waiter.record)
    finals = await wait_all(book, waiters, "request")
    results = []
    for gated, waiter, final in zip(calls, waiters, finals, strict=True):
        result = await _act(book, gated, waiter, final)
        await _tell_requester(book, waiter.record, result.action)
        results.append(result)
    ledger.flush(book)
    return results


async def _tell_requester(book: RunBook, record: ApprovalRecord, action: ActionRecord) -> None:
    """The outcome notice to the person who asked for the run (none when the run was cancelled)."""
    outcome = _NOTICE.get(action.outcome)
    if outcome is None:
        return
    error = (action.result or {}).get("error") or action.reason
    name = f"email outcome #{record.index}"
    await send_step(book.ctx, name, send_outcome_notice, record, outcome, action.result, error)


def _freeze(book: RunBook, gated: GatedCall, nonce: str, now: float, batch: list[int]) -> ApprovalRecord:
    state, policy = book.state, gated.policy.policy
    return ApprovalRecord(
        approval_id=links.approval_id(state.run_id, gated.index),
        run_id=state.run_id,
        tenant=state.tenant,
        index=gated.index,
        tool=gated.call.name,
        args=gated.args,
        digest=action_digest(state.run_id, gated.index, gated.call.name, gated.args),
        summary=gated.summary,
        why=gated.call.why,
        policy=gated.policy.rule,
        requester=state.requester,
        approvers=list(policy.approvers),
        quorum=policy.quorum,
        active_slots=list(range(len(policy.approvers))),
        nonces=[nonce],
        requested_at=now,
        round_started_at=now,
        deadline=now + policy.deadline_seconds,
        editable={n: rule.describe() for n, rule in gated.tool.editable.items()} if policy.quorum == 1 else {},
        confirm_field=confirm.field_for(gated.tool, gated.policy),
        batch=batch,
    )


async def _act(book: RunBook, gated: GatedCall, waiter: Waiter, final: Verdict) -> GateResult:
    record, policy = waiter.record, gated.policy.policy
    for attempt in range(MAX_REAPPROVALS + 1):
        if final.kind != "approve":
            return _finish(book, waiter, final)
        try:
            executed, changed = apply_edits(gated.tool, record.args, final.edits or {})
        except EditRejected as exc:
            return _finish(book, waiter, final, failure=f"the approved edits are no longer valid: {exc}")
        change = (
            await recheck(
                book.ctx,
                record.tool,
                executed,
                record.index,
                tenant=record.tenant,
                requester=record.requester,
                approval_id=record.approval_id,
                edits=changed or None,
            )
            if gated.tool.precondition
            else None
        )
        if change is None:
            return await _execute(book, waiter, final, executed, changed)
        if policy.on_superseded == "tell_model" or attempt == MAX_REAPPROVALS:
            return _finish(book, waiter, closing(record, "close", final.at, change, "superseded"))
        opening = await book.ctx.run_typed(f"reopen approval #{record.index}", open_round)
        record.deadline = opening.now + policy.deadline_seconds
        waiter.start_round(opening.nonce, opening.now, note=change)
        ledger.requested(book, record)
        [final] = await wait_all(book, [waiter], "reapproval")
    raise AssertionError("unreachable: the last attempt always returns")


def _decided(book: RunBook, record: ApprovalRecord, final: Verdict, state: ApprovalState) -> None:
    record.state = state
    record.decision_source = final.source
    record.decided_at = final.at
    record.reason = final.reason
    record.approved_by = sorted({v.by for v in record.approvals_in_round() if v.by})
    record.decided_by = ", ".join(record.approved_by) if final.kind == "approve" and final.by else final.by
    book.state.phase = "acting"
    book.save()


def _finish(book: RunBook, waiter: Waiter, final: Verdict, failure: str | None = None) -> GateResult:
    record = waiter.record
    state: ApprovalState = "failed" if failure else state_of(final)
    _decided(book, record, final, state)
    action = ActionRecord(
        index=record.index,
        tool=record.tool,
        proposed_args=record.args,
        outcome=_OUTCOME_OF[state],
        decision_source=final.source,
        approval_id=record.approval_id,
        approved_by=record.approved_by,
        reason=failure or final.reason,
    )
    ledger.finished(book, record, action, final.at)
    return GateResult(action, fail_run=final.kind == "expire" and waiter.policy.timeout_outcome == "fail")


async def _execute(
    book: RunBook, waiter: Waiter, final: Verdict, executed: dict[str, Any], changed: dict[str, Any]
) -> GateResult:
    record = waiter.record
    frozen_ok = action_digest(record.run_id, record.index, record.tool, record.args) == record.digest
    if not frozen_ok or final.digest != record.digest:
        return _finish(book, waiter, final, failure="the approval did not match the frozen action")
    record.edits = changed or None
    _decided(book, record, final, "approved_with_edits" if changed else "approved")
    run = await run_tool(
        book.ctx,
        record.tool,
        executed,
        record.index,
        tenant=record.tenant,
        requester=record.requester,
        approval_id=record.approval_id,
        approved_by=record.approved_by,
        edits=record.edits,
    )
    action = ActionRecord(
        index=record.index,
        tool=record.tool,
        proposed_args=record.args,
        args=executed,
        edits=record.edits,
        outcome=(Outcome.APPROVED_WITH_EDITS if changed else Outcome.APPROVED) if run.ok else Outcome.FAILED,
        decision_source=final.source,
        approval_id=record.approval_id,
        approved_by=record.approved_by,
        reason=final.reason,
        idempotency_key=idempotency_key(record.run_id, record.index),
        result=run.result if run.ok else {"error": run.error},
    )
    ledger.finished(book, record, action, final.at)
    return GateResult(action)
