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
from countersign.approval.verdict import cancel_promise
from countersign.approval.workflow import cancel_approval
from countersign.contract import ApprovalRecord


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
