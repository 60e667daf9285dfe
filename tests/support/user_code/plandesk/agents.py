"""A user's refund desk that has a plan approved once and then follows it in its own loop: `PlanDesk.refund_all`
asks `request_plan_approval` for at most two refunds of at most $800 over a batch's orders, then calls
`gated_call(plan=...)` for each refund of the batch.

Served with `COUNTERSIGN_SERVICES=plandesk.agents:served` (tests/support/user_code on the app's PYTHONPATH)
by tests/integration/test_plan_flow.py, whose policy file refuses a call outside the plan."""

from typing import Any

import restate
from pydantic import BaseModel

from countersign import gated_call, request_plan_approval


class Batch(BaseModel):
    run_id: str
    orders: list[int]
    amounts: list[str]


desk = restate.Service("PlanDesk")


@desk.handler()
async def refund_all(ctx: restate.Context, batch: Batch) -> dict[str, Any]:
    plan = await request_plan_approval(
        ctx,
        plan={
            "steps": [
                {
                    "tool": "issue_refund",
                    "one_of": {"order_id": batch.orders},
                    "at_most": {"amount_usd": 800},
                    "calls": 2,
                }
            ]
        },
        requester="alice@example.com",
        run_id=batch.run_id,
        index=0,
        why="the damaged orders of one shipment",
    )
    records = []
    for i, (order, amount) in enumerate(zip(batch.orders, batch.amounts, strict=True)):
        args = {"order_id": order, "amount_usd": amount, "reason": "damaged in transit"}
        record = await gated_call(
            ctx,
            tool="issue_refund",
            args=args,
            requester="alice@example.com",
            run_id=batch.run_id,
            index=i + 1,
            plan=plan,
        )
        records.append(record.model_dump(mode="json"))
    return {"plan": plan.model_dump(mode="json"), "records": records}


served = [desk]
