"""The library path: a user's own Restate workflow that gates a refund with `gated_call`.

Guarantee: `BenchLibrary.run` does the work of the bench's Countersign scenario without the agent:
`lookups` autonomous `lookup_order` calls, then one `issue_refund` the policy gates, all through the
public `gated_call` with `run_id` = the workflow key and `index` = the call's position, so the approval
email (`approval-request_<key>-a<index>_...`) and the refund row (`<key>/<index>`) are found exactly as
AgentRun's are. Served in Countersign's endpoint with
`COUNTERSIGN_SERVICES=bench.library_subject:services` (the bench package must be importable there).
"""

from __future__ import annotations

from typing import Literal

import restate
from pydantic import BaseModel, Field
from restate import WorkflowContext

from countersign import gated_call
from countersign.contract import EMAIL_PATTERN, ActionRecord, Outcome

SERVICE = "BenchLibrary"
SPEC = "bench.library_subject:services"


class LibraryTask(BaseModel):
    order_id: int
    amount_usd: str
    requester: str = Field(pattern=EMAIL_PATTERN)
    lookups: int = Field(default=0, ge=0, le=200)
    why: str = ""


class LibraryResult(BaseModel):
    """Shaped like AgentRun's result where the bench reads it (`status`, `actions[index].outcome`)."""

    status: Literal["completed", "failed"]
    actions: list[ActionRecord]


library = restate.Workflow(SERVICE, description="Bench: a user's own workflow calling the gate (gated_call).")


@library.main(name="run")
async def run(ctx: WorkflowContext, task: LibraryTask) -> LibraryResult:
    actions: list[ActionRecord] = []
    who, run_id, goal = task.requester, ctx.key(), f"Refund order {task.order_id}"
    for i in range(task.lookups):
        lookup = {"order_id": task.order_id}
        actions.append(
            await gated_call(ctx, tool="lookup_order", args=lookup, index=i, requester=who, run_id=run_id, goal=goal)
        )
    refund = {"order_id": task.order_id, "amount_usd": task.amount_usd, "reason": "bench"}
    actions.append(
        await gated_call(
            ctx,
            tool="issue_refund",
            args=refund,
            index=task.lookups,
            why=task.why,
            requester=who,
            run_id=run_id,
            goal=goal,
        )
    )
    ok = all(a.outcome in (Outcome.AUTONOMOUS, Outcome.APPROVED, Outcome.APPROVED_WITH_EDITS) for a in actions)
    return LibraryResult(status="completed" if ok else "failed", actions=actions)


services = [library]
