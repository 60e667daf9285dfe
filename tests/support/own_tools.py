"""Tools of "your own" for the integration test of COUNTERSIGN_TOOLS=tests.support.own_tools:TOOLS.

`pay_invoice` is an `async def` effect calling a payments API (PAYMENTS_API_URL, a fake in the test)
with the call's idempotency key in a header; its policy is given in code: a CEL condition and the
approvers named by a callable (the requester's manager).
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from countersign import ApproverContext, EffectContext, Tool, ToolError, ToolPolicy


class Vendor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    country: str = Field(pattern=r"^[A-Z]{2}$")


class PayInvoiceArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invoice: str = Field(pattern=r"^inv_[0-9]{1,9}$")
    amount: Decimal = Field(gt=0, le=1_000_000, decimal_places=2)
    vendor: Vendor


def manager_of(context: ApproverContext) -> list[str]:
    return [f"manager-of-{context.requester.split('@')[0]}@example.com"]


async def pay_invoice(args: PayInvoiceArgs, ctx: EffectContext) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=os.environ["PAYMENTS_API_URL"], timeout=10) as client:
        response = await client.post(
            "/payments",
            json={"invoice": args.invoice, "amount": str(args.amount), "vendor": args.vendor.name},
            headers={"Idempotency-Key": ctx.idempotency_key},
        )
    if response.status_code == 422:
        raise ToolError(response.json()["error"])
    response.raise_for_status()
    return {
        "payment_id": response.json()["id"],
        "run_id": ctx.run_id,
        "tenant": ctx.tenant,
        "requester": ctx.requester,
        "approval_id": ctx.approval_id,
        "approved_by": list(ctx.approved_by),
        "edits": ctx.edits,
    }


TOOLS = [
    Tool(
        name="pay_invoice",
        description="Pay a vendor's invoice.",
        args_model=PayInvoiceArgs,
        effect=pay_invoice,
        policy=ToolPolicy(gated=True, when='amount > 500 || vendor.country != "DE"', approvers_from=manager_of),
    )
]
