"""Asking the approvers of gated calls from the caller's journal, and the agent's batch of them.

Guarantee: the request emails go out from the caller's own journal before the approvals' workflows
start (so the approval's start is not on the path to the email), one email per approver for a
batch; each approval is then decided in its own `Approval` workflow, and a batch's calls run in
order, in the caller's journal, only once every one of them is decided.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from countersign.approval import ledger
from countersign.approval.gate import GateResult, act_on_deferred, freeze
from countersign.approval.handover import results_or_cancel
from countersign.approval.rounds import Opening
from countersign.approval.run_state import RunBook
from countersign.approval.trail import trail_of
from countersign.approval.waiting import Waiter, notify_batch
from countersign.approval.workflow import ApprovalRequest
from countersign.approval.workflow import run as approval_run
from countersign.observability import metrics
from countersign.tools import default_registry
from countersign.tools.context import ActionContext, read_context
from countersign.tools.policy import PolicyVerdict


async def ask_people(book: RunBook, waiters: list[Waiter]) -> list[int]:
    """Email the approvers of these approvals from the caller's journal (one email per approver for
    a batch), and send what the audit trail and inboxes learn; the accepted sends per approval.
    The caller then starts each approval's workflow with that count, and the workflow only waits."""
    for waiter in waiters:
        ledger.requested(book, waiter.record)
        metrics.record_requested(waiter.record.tool, waiter.record.tenant, waiter.channels())
    if len(waiters) > 1:
        sent = await notify_batch(book, waiters)
        delivered = [sent[i] for i in range(len(waiters))]
    else:
        delivered = [await waiters[0].notify("request", waiters[0].open_slots())]
    # The caller's audit entries (the request and its emails) reach the trail before the approval's.
    ledger.flush(book)
    return delivered


class GatedCall(BaseModel):
    """One of a model turn's calls that the policy gates, with its journaled answer."""

    tool: str
    index: int
    args: dict[str, Any]
    why: str
    summary: str
    verdict: PolicyVerdict
    opening: Opening
    deviation: str | None = None
    """How the call departs from the run's approved plan (shown to the approver)."""
    confidence: float | None = None
    context: ActionContext | None = None
    """The tool's facts, if read in the model turn's step (else read here, when it is frozen)."""
    grant_missed: str | None = None
    """Why a standing approval of the tool did not cover the call (shown to the approver)."""


async def approve_and_act(book: RunBook, calls: list[GatedCall]) -> list[GateResult]:
    """The gated calls of one of the agent's turns: frozen here, asked together (one email and one
    page per approver when there are several), each decided in its own `Approval` workflow. A single
    call is acted on there, as `gated_call` does; the calls of a batch run here, in order, once every
    one of them is decided. The results in the order of `calls`."""
    batch = [c.index for c in calls] if len(calls) > 1 else []
    now = calls[-1].opening.now
    records = []
    state = book.state
    trail = trail_of(state.actions)
    for call in calls:
        tool = default_registry().get(call.tool)
        assert tool is not None  # the turn validated every gated call against the loaded tools
        opening = Opening(nonce=call.opening.nonce, now=now)
        context = call.context
        if context is None:  # not read in the turn's step (see countersign.tools.context)
            context = await read_context(
                book.ctx,
                call.tool,
                call.args,
                call.index,
                run_id=state.run_id,
                tenant=state.tenant,
                requester=state.requester,
            )
        records.append(
            freeze(
                state,
                tool,
                call.index,
                call.args,
                call.why,
                call.summary,
                call.verdict,
                opening,
                batch,
                context=context,
                trail=trail,
                confidence=call.confidence,
            )
        )
        records[-1].deviation = call.deviation
        records[-1].grant_missed = call.grant_missed
    for record in records:
        book.state.approvals[record.approval_id] = record
    book.state.phase = "awaiting_approval"
    book.save()
    delivered = await ask_people(book, [Waiter(book, r, c.verdict.policy) for r, c in zip(records, calls, strict=True)])
    futures = [
        book.ctx.workflow_call(
            approval_run,
            key=record.approval_id,
            arg=ApprovalRequest(
                record=record,
                policy=call.verdict,
                goal=book.state.goal,
                model=book.state.model,
                act="defer" if batch else "execute",
                delivered=sent_,
            ),
        )
        for record, call, sent_ in zip(records, calls, delivered, strict=True)
    ]
    book.hand_over(record.approval_id for record in records)
    # A cancel of the run that came after its turn last checked for one (while the model was still
    # answering, say) may have found none of these approvals to close: the run passes it on.
    decided = await results_or_cancel(book.ctx, records, futures)
    for result in decided:
        book.state.approvals[result.record.approval_id] = result.record
    book.save()
    results = [await act_on_deferred(book, result, call.verdict) for result, call in zip(decided, calls, strict=True)]
    ledger.flush(book)
    return results
