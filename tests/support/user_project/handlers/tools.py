"""The user's one tool, loaded with `COUNTERSIGN_TOOLS=handlers.tools:TOOLS`: pay an invoice, recorded
in a SQLite file of the project's own (`PAYMENTS_DB`) under the call's idempotency key."""

from __future__ import annotations

import os
import sqlite3
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from countersign import EffectContext, Tool, ToolPolicy


class PayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invoice_id: str = Field(pattern=r"^inv_[0-9]{1,9}$")
    amount_usd: Decimal = Field(gt=0, le=100_000, decimal_places=2)


def pay_invoice(args: PayArgs, ctx: EffectContext) -> dict[str, Any]:
    with sqlite3.connect(os.environ.get("PAYMENTS_DB", "payments.db")) as db:
        db.execute("CREATE TABLE IF NOT EXISTS payments (idempotency_key TEXT PRIMARY KEY, invoice_id TEXT, cents INT)")
        db.execute(
            "INSERT OR IGNORE INTO payments VALUES (?, ?, ?)",
            (ctx.idempotency_key, args.invoice_id, int(args.amount_usd * 100)),
        )
    return {"paid": args.invoice_id}


TOOLS = [
    Tool(
        name="pay_invoice",
        description="Pay a supplier's invoice.",
        args_model=PayArgs,
        effect=pay_invoice,
        policy=ToolPolicy(gated=True, approvers=("finance@example.com",)),
    )
]
