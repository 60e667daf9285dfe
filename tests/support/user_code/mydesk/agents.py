"""A user's refund desk whose own handler reports the model's confidence and what it looked up:
`CheckedDesk.refund` looks an order up with `gated_call`, then asks to refund one (the same order unless
`looked_up` says another) with `confidence=` and `results=[the lookup]`, for the policy's checkpoints.

Served with `COUNTERSIGN_SERVICES=mydesk.agents:served` (tests/support/user_code on the app's PYTHONPATH)
by tests/integration/test_checkpoints.py."""

from typing import Any

import restate
from pydantic import BaseModel

from countersign import gated_call


class Ask(BaseModel):
    run_id: str
    order_id: int
    amount_usd: str
    confidence: float | None = None
    looked_up: int | None = None  # the order looked up first (default: the one refunded)


desk = restate.Service("CheckedDesk")


@desk.handler()
async def refund(ctx: restate.Context, ask: Ask) -> dict[str, Any]:
    looked = await gated_call(
        ctx,
        tool="lookup_order",
        args={"order_id": ask.looked_up or ask.order_id},
        requester="alice@example.com",
        run_id=ask.run_id,
    )
    record = await gated_call(
        ctx,
        tool="issue_refund",
        args={"order_id": ask.order_id, "amount_usd": ask.amount_usd, "reason": "damaged"},
        requester="alice@example.com",
        run_id=ask.run_id,
        confidence=ask.confidence,
        results=[looked],
    )
    return record.model_dump(mode="json")


served = [desk]
