"""Acme Billing's tools, loaded with `COUNTERSIGN_TOOLS=examples.billing.tools:TOOLS`.

`charge_card` is an `async def` effect that calls the payment provider's HTTP API
(`ACME_PAYMENTS_URL`) with the call's idempotency key in a header, so a retried step never charges
twice. Its policy is in code: a CEL condition, and the approvers named by a callable (the tenant's
account manager). `examples/billing/policy.toml` overrides part of it, as an operator would.
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from countersign import ApproverContext, EditRule, EffectContext, Tool, ToolError, ToolPolicy

ACCOUNT_MANAGERS = {"default": "ops@acme.example", "globex": "globex-manager@acme.example"}


class InvoiceArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invoice_id: str = Field(pattern=r"^inv_[0-9]{1,9}$", description="The invoice, e.g. inv_1001")


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invoice_id: str = Field(pattern=r"^inv_[0-9]{1,9}$")
    amount_usd: Decimal = Field(gt=0, le=100_000, decimal_places=2, description="What to charge, in US dollars")
    card: str = Field(pattern=r"^card_[a-z0-9]{1,20}$", description="The customer's card on file")


def _payments() -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=os.environ.get("ACME_PAYMENTS_URL", "http://127.0.0.1:8099"), timeout=10)


async def lookup_invoice(args: InvoiceArgs, ctx: EffectContext) -> dict[str, Any]:
    async with _payments() as api:
        answer = await api.get(f"/invoices/{args.invoice_id}")
    if answer.status_code == 404:
        raise ToolError(f"invoice {args.invoice_id} does not exist")
    answer.raise_for_status()
    return dict(answer.json())


async def charge_card(args: ChargeArgs, ctx: EffectContext) -> dict[str, Any]:
    async with _payments() as api:
        answer = await api.post(
            "/charges",
            json={"invoice_id": args.invoice_id, "amount_usd": str(args.amount_usd), "card": args.card},
            headers={"Idempotency-Key": ctx.idempotency_key},
        )
    if answer.status_code == 402:
        raise ToolError(f"the card was declined: {answer.json().get('reason', 'no reason given')}")
    answer.raise_for_status()
    return {"charge_id": answer.json()["id"], "approved_by": list(ctx.approved_by)}


def account_manager(context: ApproverContext) -> list[str]:
    """Who approves a charge: the tenant's account manager (evaluated inside the journaled step)."""
    return [ACCOUNT_MANAGERS.get(context.tenant, ACCOUNT_MANAGERS["default"])]


TOOLS = [
    Tool(
        name="lookup_invoice",
        description="Look up an invoice: amount due, customer, card on file.",
        args_model=InvoiceArgs,
        effect=lookup_invoice,
        policy=ToolPolicy(gated=False),
    ),
    Tool(
        name="charge_card",
        description="Charge the customer's card for an invoice.",
        args_model=ChargeArgs,
        effect=charge_card,
        policy=ToolPolicy(gated=True, when="amount_usd > 250.0", approvers_from=account_manager),
        summarize=lambda a: f"Charge ${a.amount_usd} to {a.card} for {a.invoice_id}",
        editable={"amount_usd": EditRule("decrease_only")},
    ),
]
