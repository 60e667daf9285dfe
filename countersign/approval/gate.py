"""The gate: a gated call is frozen, put to its approvers, and acted on.

Guarantee: each action is frozen (canonical JSON + SHA-256 digest) before anyone is asked, by the
caller's own journaled step. Only an approval runs the frozen (or validated, edited) arguments, after
a fresh precondition check, exactly once under `<run_id>/<index>`; when the world moved meanwhile the
action is superseded (or asked again). The waiting and acting happen in the approval's own workflow
(`countersign.approval.workflow`), so the caller may be any kind of Restate handler.
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel
from restate import TerminalError

from countersign.approval import confirm, ledger, standing
from countersign.approval.edits import EditRejected, apply_edits
from countersign.approval.plan import apply_plan_edits
from countersign.approval.question import answer_of
from countersign.approval.rounds import Opening, closing, open_round
from countersign.approval.run_state import RunBook, RunFacts
from countersign.approval.verdict import Verdict, state_of
from countersign.approval.waiting import Waiter, send_step, wait_all
from countersign.contract import ActionRecord, ApprovalRecord, ApprovalState, Outcome, TrailStep
from countersign.errors import is_cancellation
from countersign.events import emit as events
from countersign.mail.deliver import deliver_each
from countersign.mail.outcome_email import NoticeOutcome, outcome_notice, send_outcome_notice
from countersign.mail.receipt_email import decision_receipt
from countersign.observability import metrics, tracing
from countersign.security import links
from countersign.tools import default_registry
from countersign.tools.context import ActionContext
from countersign.tools.execute import idempotency_key, recheck, run_tool
from countersign.tools.policy import PolicyVerdict
from countersign.tools.registry import Tool

_DIGEST_DOMAIN = b"countersign.action.v1\x00"
MAX_REAPPROVALS = 2
# The one mapping from how an approval ended to the outcome the caller (and the model) sees.
OUTCOME_OF: dict[ApprovalState, Outcome] = {
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


class GateResult(BaseModel):
    """How one approval ended: its final record, the action's record, whether the run must fail, and
    the deciding verdict (which a caller that acts on a deferred approval needs)."""

    record: ApprovalRecord
    action: ActionRecord
    fail_run: bool = False
    final: Verdict | None = None


Act = Literal["execute", "report", "defer"]
"""What the approval's workflow does once decided. `execute`: re-check the precondition and run the
effect (`gated_call`). `report`: nothing runs; the outcome is the approval's (`request_approval`).
`defer`: nothing runs and, if approved, the caller acts and records the outcome (the agent's batches,
which run only once every item of the turn is decided)."""


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def action_digest(run_id: str, index: int, tool: str, args: dict[str, Any]) -> str:
    frozen = canonical_json({"run": run_id, "index": index, "tool": tool, "args": args})
    return hashlib.sha256(_DIGEST_DOMAIN + frozen.encode()).hexdigest()


def _frozen(
    run: RunFacts, index: int, tool: str, args: dict[str, Any], verdict: PolicyVerdict, opening: Opening, **rest: Any
) -> ApprovalRecord:
    """An approval record's first round, as every kind of approval opens it (`rest`: its own fields)."""
    policy, now = verdict.policy, opening.now
    return ApprovalRecord(
        approval_id=links.approval_id(run.run_id, index),
        run_id=run.run_id,
        tenant=run.tenant,
        index=index,
        tool=tool,
        args=args,
        digest=action_digest(run.run_id, index, tool, args),
        policy=verdict.rule,
        requester=run.requester,
        approvers=list(policy.approvers),
        quorum=policy.quorum,
        active_slots=list(range(len(policy.approvers))),
        nonces=[opening.nonce],
        requested_at=now,
        round_started_at=now,
        deadline=now + policy.deadline_seconds,
        asked_by=run.asked_by,
        **rest,
    )


def freeze_asked(
    run: RunFacts,
    index: int,
    *,
    tool: str,
    kind: Literal["plan", "question"],
    args: dict[str, Any],
    summary: str,
    why: str,
    verdict: PolicyVerdict,
    opening: Opening,
    editable: dict[str, str],
) -> ApprovalRecord:
    """The approval record of what is not a tool call (a plan, a question), frozen and digested like
    one whose arguments are `args`."""
    return _frozen(run, index, tool, args, verdict, opening, kind=kind, summary=summary, why=why, editable=editable)


def freeze(
    run: RunFacts,
    tool: Tool,
    index: int,
    args: dict[str, Any],
    why: str,
    summary: str,
    verdict: PolicyVerdict,
    opening: Opening,
    batch: list[int] | None = None,
    *,
    context: ActionContext | None = None,
    trail: list[TrailStep] | None = None,
    confidence: float | None = None,
) -> ApprovalRecord:
    """The approval record of one gated call: pure, from the journaled policy answer and opening,
    the facts its tool read (`context`, journaled) and the run's earlier calls (`trail`)."""
    policy = verdict.policy
    return _frozen(
        run,
        index,
        tool.name,
        args,
        verdict,
        opening,
        summary=summary,
        why=why,
        editable={n: rule.describe() for n, rule in tool.editable.items()} if policy.quorum == 1 else {},
        confirm_field=confirm.field_for(tool, verdict),
        batch=batch or [],
        context=list(context.facts) if context else [],
        context_error=context.error if context else None,
        trail=trail or [],
        policy_version=verdict.version,
        stopped_because=list(verdict.stopped_because),
        confidence=confidence,
        webhooks=verdict.webhooks,
        # A batch's page decides its items together: a standing approval is offered on one call's page.
        grant_offer=None
        if len(batch or []) > 1
        else standing.offer(tool.name, verdict, args, requester=run.requester, tenant=run.tenant),
    )


async def decide_and_act(
    book: RunBook, record: ApprovalRecord, verdict: PolicyVerdict, *, act: Act, delivered: int | None
) -> GateResult:
    """Inside the approval's workflow: ask (unless the caller already sent a batch email, `delivered`
    of whose sends were accepted), wait for the decision, then act on it (or only report it)."""
    book.state.approvals[record.approval_id] = record
    book.state.phase = "awaiting_approval"
    book.save()
    waiter = Waiter(book, record, verdict.policy)
    # Executed here and then told: the deciding vote's receipt goes out in the outcome notice's step.
    waiter.holds_deciding_receipt = act == "execute"
    if delivered is None:
        ledger.requested(book, record)
        metrics.record_requested(record.tool, record.tenant, waiter.channels())
    [final] = await wait_all(book, [waiter], "request", delivered=None if delivered is None else [delivered])
    try:
        return await _on_decision(book, waiter, final, act)
    except TerminalError as exc:
        if is_cancellation(exc):  # a hard cancel while acting: the approver still hears of their vote
            await waiter.send_held_receipt()
        raise


async def _on_decision(book: RunBook, waiter: Waiter, final: Verdict, act: Act) -> GateResult:
    """`decide_and_act` once decided: a standing approval kept, the action run (or only reported),
    the requester told, the approval's records closed."""
    record = waiter.record
    _observe_decision(record, final, since=record.requested_at)
    if final.kind == "approve" and final.grant_seconds and record.grant_offer is not None and final.by:
        # The approver also gave a standing approval: kept before the action runs, told to them once.
        await standing.give(book.ctx, record, final.by, final.at, final.grant_seconds)
        ledger.note(book, standing.created_entry(record, final.by, final.at, final.grant_seconds))
    tool = default_registry().get(record.tool)
    if tool is None and final.kind == "approve" and record.kind == "action":  # the tool set changed meanwhile
        result = _finish(book, waiter, final, failure=f"tool {record.tool!r} is no longer loaded; nothing ran")
    elif act == "execute":
        assert tool is not None
        result = await _act(book, tool, waiter, final)
    elif final.kind == "approve" and act == "defer":
        # Approved, and the caller acts: it records the execution and the outcome in its own journal.
        _decided(book, record, final, state_of(final))
        ledger.flush(book)
        return GateResult(record=record, action=_action(record, final, record.state), final=final)
    else:
        result = _report(book, waiter, final)
    if act == "execute" or result.action.outcome not in (Outcome.APPROVED, Outcome.APPROVED_WITH_EDITS):
        # An approval that is only reported has not executed: the caller runs it and tells whom it likes.
        await _tell_requester(book, waiter, result.action)
    book.state.actions.append(result.action)
    book.state.phase = "completed"
    book.save()
    ledger.flush(book)
    return result


async def act_on_deferred(book: RunBook, deferred: GateResult, verdict: PolicyVerdict) -> GateResult:
    """The caller's half of a deferred approval: the same re-check, execution and records as
    `execute`, in the caller's journal. A precondition that changed meanwhile supersedes the action
    (the approval's workflow has ended, so it cannot be asked again)."""
    if deferred.final is None:
        return deferred
    waiter = Waiter(book, deferred.record, verdict.policy)
    tool = default_registry().get(deferred.record.tool)
    if tool is None:  # only if the tool set changed under a waiting approval
        return _finish(book, waiter, deferred.final, failure=f"tool {deferred.record.tool!r} is no longer loaded")
    result = await _act(book, tool, waiter, deferred.final, may_reapprove=False)
    await _tell_requester(book, waiter, result.action)
    return result


async def _tell_requester(book: RunBook, waiter: Waiter, action: ActionRecord) -> None:
    """The outcome notice to the person who asked for the run (none when the run was cancelled),
    in one step with the deciding vote's receipt when the waiter held it back."""
    record = waiter.record
    # A question's outcome is the asking code's to tell: `ask_person` returns it, and a model that
    # asked reads it as its tool's answer. Only actions end with a notice to their requester.
    outcome = _NOTICE.get(action.outcome) if record.kind != "question" else None
    if outcome is None:
        await waiter.send_held_receipt()
        return
    error = (action.result or {}).get("error") or action.reason
    held, waiter.held_receipt = waiter.held_receipt, None
    if held is None:
        await send_step(
            book.ctx, f"email outcome #{record.index}", send_outcome_notice, record, outcome, action.result, error
        )
        return
    receipt = partial(decision_receipt, record, held.slot, held.client, edits=held.edits)
    notice = partial(outcome_notice, record, outcome, result=action.result, error=error)
    await send_step(book.ctx, f"email receipt and outcome #{record.index}", deliver_each, receipt, notice)


async def _act(book: RunBook, tool: Tool, waiter: Waiter, final: Verdict, *, may_reapprove: bool = True) -> GateResult:
    record, policy = waiter.record, waiter.policy
    for attempt in range(MAX_REAPPROVALS + 1):
        if final.kind != "approve":
            return _finish(book, waiter, final)
        try:
            executed, changed = apply_edits(tool, record.args, final.edits or {})
        except EditRejected as exc:
            return _finish(book, waiter, final, failure=f"the approved edits are no longer valid: {exc}")
        change = (
            await recheck(
                book.ctx,
                record.tool,
                executed,
                record.index,
                run_id=record.run_id,
                tenant=record.tenant,
                requester=record.requester,
                approval_id=record.approval_id,
                edits=changed or None,
            )
            if tool.precondition
            else None
        )
        if change is None:
            return await _execute(book, waiter, final, executed, changed)
        if policy.on_superseded == "tell_model" or attempt == MAX_REAPPROVALS or not may_reapprove:
            return _finish(book, waiter, closing(record, "close", final.at, change, "superseded"))
        await waiter.send_held_receipt()  # the approver hears of their vote before the approval waits again
        opening = await book.ctx.run_typed(f"reopen approval #{record.index}", open_round)
        record.deadline = opening.now + policy.deadline_seconds
        waiter.start_round(opening.nonce, opening.now, note=change)
        ledger.requested(book, record)
        metrics.record_requested(record.tool, record.tenant, waiter.channels())
        [final] = await wait_all(book, [waiter], "reapproval")
        _observe_decision(record, final, since=opening.now)
    raise AssertionError("unreachable: the last attempt always returns")


def _observe_decision(record: ApprovalRecord, final: Verdict, since: float) -> None:
    """Count (and trace, as a span from the request to the decision) how a wait ended; nothing when
    this is a replay of a wait an earlier attempt saw end."""
    state = state_of(final)
    metrics.record_decided(record.tool, state, final.source, final.at - since)
    values = {"tool": record.tool, "approval_id": record.approval_id, "run_id": record.run_id, "tenant": record.tenant}
    tracing.since("decision", since, verdict=state, source=final.source, **values)


def _report(book: RunBook, waiter: Waiter, final: Verdict) -> GateResult:
    """Decide-only: the verdict and the arguments it approves; nothing runs here (so the audit trail
    records the approval's outcome and no execution)."""
    record = waiter.record
    if final.kind != "approve":
        return _finish(book, waiter, final)
    try:
        approved, changed = _approved_args(record, final)
    except EditRejected as exc:
        return _finish(book, waiter, final, failure=f"the approved edits are no longer valid: {exc}")
    record.edits = changed or None
    # A question's answer is its approving verdict's edits: answered, not "approved with edits".
    state: ApprovalState = "approved_with_edits" if changed and record.kind != "question" else "approved"
    _decided(book, record, final, state)
    action = _action(record, final, state)
    ledger.finished(book, record, action, final.at)
    action.args = approved
    return GateResult(record=record, action=action, final=final)


def _approved_args(record: ApprovalRecord, final: Verdict) -> tuple[dict[str, Any], dict[str, Any]]:
    """The approved arguments (a plan's or a tool call's) with the approver's edits, and those edits."""
    if record.kind == "plan":
        return apply_plan_edits(record.args, final.edits or {})
    if record.kind == "question":  # the answer, checked again against the frozen form
        answer = answer_of(record.args, final.edits, defaulted=final.source == "deadline_default")
        return answer, answer
    tool = default_registry().get(record.tool)
    assert tool is not None  # decide_and_act ends an approval whose tool is gone before reporting it
    return apply_edits(tool, record.args, final.edits or {})


def _decided(book: RunBook, record: ApprovalRecord, final: Verdict, state: ApprovalState) -> None:
    record.state = state
    record.decision_source = final.source
    record.decided_at = final.at
    record.decided_via = final.via if final.source == "human" else None
    record.reason = final.reason
    record.approved_by = sorted({v.by for v in record.approvals_in_round() if v.by})
    # A cancel names who asked for it (an operator), never a decider of the action.
    record.decided_by = (
        ", ".join(record.approved_by) if final.kind == "approve" and final.by else final.by or final.asked_by
    )
    events.approval_decided(book.ctx, record)
    book.state.phase = "acting"
    book.save()


def _action(
    record: ApprovalRecord, final: Verdict, state: ApprovalState, *, args: dict[str, Any] | None = None
) -> ActionRecord:
    return ActionRecord(
        index=record.index,
        tool=record.tool,
        proposed_args=record.args,
        args=args,
        edits=record.edits,
        outcome=OUTCOME_OF[state],
        decision_source=final.source,
        approval_id=record.approval_id,
        approved_by=record.approved_by,
        reason=final.reason,
    )


def _finish(book: RunBook, waiter: Waiter, final: Verdict, failure: str | None = None) -> GateResult:
    record = waiter.record
    state: ApprovalState = "failed" if failure else state_of(final)
    _decided(book, record, final, state)
    action = _action(record, final, state)
    if failure:
        action.reason = failure
    ledger.finished(book, record, action, final.at)
    fail_run = final.kind == "expire" and waiter.policy.timeout_outcome == "fail"
    return GateResult(record=record, action=action, fail_run=fail_run)


async def _execute(
    book: RunBook, waiter: Waiter, final: Verdict, executed: dict[str, Any], changed: dict[str, Any]
) -> GateResult:
    record = waiter.record
    frozen_ok = action_digest(record.run_id, record.index, record.tool, record.args) == record.digest
    if not frozen_ok or final.digest != record.digest:
        return _finish(book, waiter, final, failure="the approval did not match the frozen action")
    record.edits = changed or None
    state: ApprovalState = "approved_with_edits" if changed else "approved"
    _decided(book, record, final, state)
    run = await run_tool(
        book.ctx,
        record.tool,
        executed,
        record.index,
        run_id=record.run_id,
        tenant=record.tenant,
        requester=record.requester,
        approval_id=record.approval_id,
        approved_by=record.approved_by,
        edits=record.edits,
    )
    action = _action(record, final, state if run.ok else "failed", args=executed)
    action.idempotency_key = idempotency_key(record.run_id, record.index)
    action.result = run.result if run.ok else {"error": run.error}
    events.action_executed(book.ctx, record, action, run.at or final.at)
    ledger.finished(book, record, action, final.at)
    return GateResult(record=record, action=action)
