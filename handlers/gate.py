"""One approval round: freeze the action, email the approvers, wait, then act on the verdict.

Guarantee: the action is frozen (canonical JSON + SHA-256 digest) before anyone is asked; the only
thing that ends the wait is the approval's single decision promise (approve, reject, deadline,
cancel or undeliverable, whichever completes it first); and the frozen arguments run only on an
approve whose round and digest match the record, exactly once, under `<run_id>/<index>`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from datetime import timedelta
from typing import Any

import restate
from pydantic import BaseModel
from restate import RunOptions, TerminalError, WorkflowContext

from handlers import links
from handlers.contract import ActionRecord, ApprovalRecord, CancelRequest, Outcome
from handlers.execute import idempotency_key, run_tool
from handlers.llm.base import ToolCall
from handlers.mail.approval_email import send_approval_request
from handlers.policy import PolicyVerdict
from handlers.run_state import RunBook
from handlers.verdict import (
    CANCEL_PROMISE,
    STATE_OF,
    Verdict,
    VerdictKind,
    decision_promise,
    is_already_completed,
    is_cancellation,
)

_DIGEST_DOMAIN = b"countersign.action.v1\x00"
# 5xx/lost connections back off 0.5 s doubling to 10 min (about 1.6 h over 20 attempts); 429s wait
# Resend's retry-after; 6 h caps it all, far inside Resend's 24 h idempotency window.
EMAIL_RETRIES = RunOptions[Any](
    max_attempts=20,
    initial_retry_interval=timedelta(milliseconds=500),
    retry_interval_factor=2.0,
    max_retry_interval=timedelta(minutes=10),
    max_duration=timedelta(hours=6),
)


class Opening(BaseModel):
    """Journaled facts of a new round: a nonce from a cryptographic source, and the time."""

    nonce: str
    now: float


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def action_digest(run_id: str, index: int, tool: str, args: dict[str, Any]) -> str:
    frozen = canonical_json({"run": run_id, "index": index, "tool": tool, "args": args})
    return hashlib.sha256(_DIGEST_DOMAIN + frozen.encode()).hexdigest()


def _open_round() -> Opening:
    return Opening(nonce=secrets.token_urlsafe(16), now=time.time())


async def approval_round(
    book: RunBook, call: ToolCall, args: dict[str, Any], index: int, policy: PolicyVerdict, summary: str
) -> ActionRecord:
    ctx = book.ctx
    state = book.state
    opening = await ctx.run_typed(f"open approval #{index}", _open_round)
    record = ApprovalRecord(
        approval_id=links.approval_id(state.run_id, index),
        run_id=state.run_id,
        tenant=state.tenant,
        index=index,
        tool=call.name,
        args=args,
        digest=action_digest(state.run_id, index, call.name, args),
        summary=summary,
        why=call.why,
        policy=policy.rule,
        requester=state.requester,
        approvers=policy.approvers,
        nonce=opening.nonce,
        requested_at=opening.now,
        deadline=opening.now + policy.deadline_seconds,
    )
    state.approvals[record.approval_id] = record
    state.phase = "awaiting_approval"
    book.save()

    verdict = await _wait_for_verdict(ctx, record, await _notify(ctx, record, state.goal), opening.now)
    record.state = STATE_OF[verdict.kind]
    record.decided_by, record.decided_at, record.reason = verdict.by, verdict.at, verdict.reason
    state.phase = "acting"
    book.save()
    return await _act(ctx, record, verdict)


async def _notify(ctx: WorkflowContext, record: ApprovalRecord, goal: str) -> int:
    """Email every approver; returns how many sends were accepted by the mail backend."""
    delivered = 0
    for slot in range(len(record.approvers)):
        try:
            await ctx.run_typed(
                f"email approval #{record.index} round {record.round} slot {slot}",
                send_approval_request,
                EMAIL_RETRIES,
                record,
                slot,
                goal,
            )
            delivered += 1
        except TerminalError as exc:
            if is_cancellation(exc):
                raise
    return delivered


async def _wait_for_verdict(ctx: WorkflowContext, record: ApprovalRecord, delivered: int, now: float) -> Verdict:
    promise = ctx.promise(decision_promise(record.approval_id), type_hint=Verdict)
    closing: Verdict | None = None
    if delivered == 0:
        closing = _closing(record, "undeliverable", now, "no approval email could be delivered")
    elif await ctx.promise(CANCEL_PROMISE, type_hint=CancelRequest).peek() is not None:
        closing = _closing(record, "cancel", now, "the run was cancelled")
    else:
        match await restate.select(
            decision=promise.value(), deadline=ctx.sleep(timedelta(seconds=max(0.0, record.deadline - now)))
        ):
            case ["decision", verdict]:
                return verdict  # type: ignore[no-any-return]
            case _:
                closing = _closing(record, "expire", record.deadline, "the deadline passed without a decision")
    try:
        await promise.resolve(closing)
    except TerminalError as exc:
        if not is_already_completed(exc):
            raise
    return await promise.value()


def _closing(record: ApprovalRecord, kind: VerdictKind, at: float, reason: str) -> Verdict:
    return Verdict(kind=kind, by=None, reason=reason, at=at, round=record.round, digest=record.digest)


async def _act(ctx: WorkflowContext, record: ApprovalRecord, verdict: Verdict) -> ActionRecord:
    action = ActionRecord(
        index=record.index,
        tool=record.tool,
        proposed_args=record.args,
        outcome=Outcome(STATE_OF[verdict.kind]),
        approval_id=record.approval_id,
        reason=verdict.reason,
    )
    if verdict.kind != "approve":
        return action
    frozen_ok = action_digest(record.run_id, record.index, record.tool, record.args) == record.digest
    if not frozen_ok or verdict.digest != record.digest or verdict.round != record.round:
        action.outcome, action.reason = Outcome.FAILED, "the approval did not match the frozen action"
        return action
    run = await run_tool(ctx, record.tool, record.args, record.index)
    action.args = record.args
    action.approved_by = [verdict.by] if verdict.by else []
    action.idempotency_key = idempotency_key(record.run_id, record.index)
    action.result = run.result if run.ok else {"error": run.error}
    if not run.ok:
        action.outcome = Outcome.FAILED
    return action
