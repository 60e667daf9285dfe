"""Acme Billing's own Restate workflow, served beside Countersign with
`COUNTERSIGN_SERVICES=examples.billing.workflow:services`.

`InvoiceCollection` (key = invoice id) looks the invoice up and charges what is due. The charge goes
through `gated_call`: the policy decides whether a person must approve it (here: over $250, by the
tenant's account manager, at most lowered), the approval waits durably in its own workflow, and the
approved charge runs exactly once under the idempotency key `<invoice>/1`.
"""

from __future__ import annotations

from typing import Any

import restate
from pydantic import BaseModel, Field

from countersign import gated_call


class Collect(BaseModel):
    requester: str = Field(description="Who asks for the collection (told of the outcome)")
    tenant: str = "default"


class Collected(BaseModel):
    invoice_id: str
    outcome: str
    charged_usd: str | None = None
    approved_by: list[str] = Field(default_factory=list)
    detail: dict[str, Any] | None = None


collection = restate.Workflow("InvoiceCollection")


@collection.main()
async def run(ctx: restate.WorkflowContext, collect: Collect) -> Collected:
    invoice_id = ctx.key()
    run_id = f"collect-{invoice_id}"
    lookup = await gated_call(
        ctx,
        tool="lookup_invoice",
        args={"invoice_id": invoice_id},
        index=0,
        requester=collect.requester,
        tenant=collect.tenant,
        run_id=run_id,
    )
    if lookup.result is None or "error" in lookup.result:
        return Collected(invoice_id=invoice_id, outcome="failed", detail=lookup.result)
    invoice = lookup.result
    charge = await gated_call(
        ctx,
        tool="charge_card",
        args={"invoice_id": invoice_id, "amount_usd": invoice["due_usd"], "card": invoice["card"]},
        why=f"invoice {invoice_id} is {invoice['days_overdue']} days overdue",
        goal=f"Collect invoice {invoice_id}",
        index=1,
        requester=collect.requester,
        tenant=collect.tenant,
        run_id=run_id,
        trail=[lookup],  # the approver sees the lookup (and its result) before the charge
    )
    return Collected(
        invoice_id=invoice_id,
        outcome=charge.outcome.value,
        charged_usd=(charge.args or {}).get("amount_usd") if charge.result and "error" not in charge.result else None,
        approved_by=charge.approved_by,
        detail=charge.result or {"reason": charge.reason},
    )


services = [collection]
