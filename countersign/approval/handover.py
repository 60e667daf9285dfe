"""A run's wait on the approvals it handed over to their own workflows, and its cancel.

Guarantee: while an agent run waits for approvals it has started (`Approval.run`, awaited with
`ctx.workflow_call`), a cancel of the run is passed on to each of them, whenever the run's cancel
promise is completed: before the run started them or after, and whatever `AgentRun.cancel` found
in the run's state. So a cancel never waits, lost, for the approvers or the deadline.

Why the run does this itself: `AgentRun.cancel` is a shared handler and reads the run's state as
of its own start. A cancel that starts while the model is still answering finds no approval to
close; if it completes the run's promise only after the run last looked at it, only a run that
keeps listening hears it.
"""

from __future__ import annotations

from collections.abc import Sequence

import restate
from restate import WorkflowContext

from countersign.approval.gate import GateResult
from countersign.approval.run_state import RunBook
from countersign.approval.verdict import cancel_promise
from countersign.approval.workflow import ApprovalRequest, cancel_approval
from countersign.approval.workflow import run as approval_run
from countersign.contract import ApprovalRecord


async def asked_alone(ctx: restate.Context, request: ApprovalRequest, book: RunBook | None = None) -> GateResult:
    """One approval that is not a tool call of the run (a plan, a question) asked in its own workflow
    and awaited. With `book` (an agent run), the run's status lists it while it waits, a cancel of
    the run is passed on to it (`results_or_cancel`), and the run keeps its final record."""
    record = request.record
    if book is not None:
        book.state.approvals[record.approval_id] = record
        book.state.phase = "awaiting_approval"
        book.save()
    called = ctx.workflow_call(approval_run, key=record.approval_id, arg=request)
    if book is None:
        return await called
    book.hand_over([record.approval_id])
    [result] = await results_or_cancel(book.ctx, [record], [called])
    book.state.approvals[record.approval_id] = result.record
    book.save()
    return result


async def results_or_cancel(
    ctx: WorkflowContext,
    records: Sequence[ApprovalRecord],
    calls: Sequence[restate.RestateDurableCallFuture[GateResult]],
) -> list[GateResult]:
    """The result of each handed-over approval (`calls[i]` runs `records[i]`), in order. If the
    run is cancelled meanwhile, every one of them is cancelled (a decided one refuses it and keeps
    its result) and the results are awaited as they end."""
    cancelled = cancel_promise(ctx).value()
    passed_on = False
    results: list[GateResult] = []
    for call in calls:
        if passed_on:
            results.append(await call)
            continue
        name, value = await restate.select(result=call, cancel=cancelled)
        if name == "result":
            results.append(value)
            continue
        passed_on = True
        for record in records:
            await cancel_approval(ctx, record.approval_id, record, value)
        results.append(await call)
    return results
