"""The demo tools: look up an order, refund it, delete a customer, email a customer.

Guarantee: each effect is one SQLite transaction keyed by the call's idempotency key; a repeat with
the same key returns the first result and changes nothing. They find their database through the
settings (DEMO_DB), as any tool keeps its own connections: the EffectContext carries nothing demo-specific.
"""

from __future__ import annotations

import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from countersign import EditRule, EffectContext, Tool, ToolError, ToolPolicy, get_settings
from handlers.demo.business_db import connect, transaction


def _db() -> Path:
    return get_settings().demo_db


def _cents(value: Decimal) -> Decimal:
    cents = value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    # The bounds below run before rounding: 0.004 passes `gt=0` and becomes 0.00, which the effect
    # (and the next validation of the executed arguments) would refuse. Check what will run.
    if cents <= 0:
        raise ValueError(f"must be at least 0.01 once rounded to cents (got {value})")
    return cents


Usd = Annotated[Decimal, Field(gt=0, le=1_000_000), AfterValidator(_cents)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LookupOrderArgs(_Args):
    order_id: int = Field(ge=1, description="The order number, e.g. 1042")


class IssueRefundArgs(_Args):
    order_id: int = Field(ge=1, description="The order to refund")
    amount_usd: Usd = Field(description="Refund amount in US dollars")
    reason: str = Field(min_length=1, max_length=500, description="Why the refund is due")


class DeleteCustomerArgs(_Args):
    customer_id: str = Field(pattern=r"^c_[0-9]{1,12}$", description="Customer id, e.g. c_17")
    reason: str = Field(min_length=1, max_length=500)


class EmailCustomerArgs(_Args):
    customer_id: str = Field(pattern=r"^c_[0-9]{1,12}$")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=5000)


def lookup_order(args: LookupOrderArgs, ctx: EffectContext) -> dict[str, Any]:
    with connect(_db()) as db:
        row = db.execute("SELECT * FROM orders WHERE id = ?", (args.order_id,)).fetchone()
    if row is None:
        raise ToolError(f"order {args.order_id} does not exist")
    return {
        "order_id": row["id"],
        "customer_id": row["customer_id"],
        "amount_usd": f"{row['amount_cents'] / 100:.2f}",
        "refunded_usd": f"{row['refunded_cents'] / 100:.2f}",
        "status": row["status"],
    }


def issue_refund(args: IssueRefundArgs, ctx: EffectContext) -> dict[str, Any]:
    cents = int(args.amount_usd * 100)
    with connect(_db()) as db, transaction(db):
        done = db.execute("SELECT * FROM refunds WHERE idempotency_key = ?", (ctx.idempotency_key,)).fetchone()
        if done is None:
            order = db.execute("SELECT * FROM orders WHERE id = ?", (args.order_id,)).fetchone()
            if order is None:
                raise ToolError(f"order {args.order_id} does not exist")
            left = order["amount_cents"] - order["refunded_cents"]
            if cents > left:
                raise ToolError(f"order {args.order_id} has only ${left / 100:.2f} left to refund")
            db.execute(
                "INSERT INTO refunds(idempotency_key, order_id, amount_cents, reason, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (ctx.idempotency_key, args.order_id, cents, args.reason, time.time()),
            )
            status = "refunded" if cents == left else "partially_refunded"
            db.execute(
                "UPDATE orders SET refunded_cents = refunded_cents + ?, status = ? WHERE id = ?",
                (cents, status, args.order_id),
            )
            done = db.execute("SELECT * FROM refunds WHERE idempotency_key = ?", (ctx.idempotency_key,)).fetchone()
    return {
        "refund_id": done["id"],
        "order_id": done["order_id"],
        "amount_usd": f"{done['amount_cents'] / 100:.2f}",
    }


def delete_customer(args: DeleteCustomerArgs, ctx: EffectContext) -> dict[str, Any]:
    with connect(_db()) as db, transaction(db):
        done = db.execute(
            "SELECT * FROM customer_deletions WHERE idempotency_key = ?", (ctx.idempotency_key,)
        ).fetchone()
        if done is None:
            customer = db.execute("SELECT * FROM customers WHERE id = ?", (args.customer_id,)).fetchone()
            if customer is None or customer["deleted_at"] is not None:
                raise ToolError(f"customer {args.customer_id} does not exist")
            now = time.time()
            db.execute("UPDATE customers SET deleted_at = ? WHERE id = ?", (now, args.customer_id))
            db.execute(
                "INSERT INTO customer_deletions(idempotency_key, customer_id, reason, created_at) VALUES (?, ?, ?, ?)",
                (ctx.idempotency_key, args.customer_id, args.reason, now),
            )
    return {"customer_id": args.customer_id, "deleted": True}


def email_customer(args: EmailCustomerArgs, ctx: EffectContext) -> dict[str, Any]:
    with connect(_db()) as db, transaction(db):
        done = db.execute("SELECT id FROM outbound_emails WHERE idempotency_key = ?", (ctx.idempotency_key,)).fetchone()
        if done is None:
            customer = db.execute("SELECT * FROM customers WHERE id = ?", (args.customer_id,)).fetchone()
            if customer is None or customer["deleted_at"] is not None:
                raise ToolError(f"customer {args.customer_id} does not exist")
            db.execute(
                "INSERT INTO outbound_emails(idempotency_key, customer_id, subject, body, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (ctx.idempotency_key, args.customer_id, args.subject, args.body, time.time()),
            )
            done = db.execute(
                "SELECT id FROM outbound_emails WHERE idempotency_key = ?", (ctx.idempotency_key,)
            ).fetchone()
    return {"email_id": done["id"], "customer_id": args.customer_id}


def refund_still_possible(args: IssueRefundArgs, ctx: EffectContext) -> str | None:
    with connect(_db()) as db:
        if db.execute("SELECT 1 FROM refunds WHERE idempotency_key = ?", (ctx.idempotency_key,)).fetchone():
            return None  # this very refund already ran (a retried step): nothing changed for it
        order = db.execute("SELECT * FROM orders WHERE id = ?", (args.order_id,)).fetchone()
    if order is None:
        return f"order {args.order_id} no longer exists"
    left = order["amount_cents"] - order["refunded_cents"]
    if int(args.amount_usd * 100) > left:
        return f"order {args.order_id} now has only ${left / 100:.2f} left to refund (status {order['status']})"
    return None


REFUND_WINDOW_DAYS = 90


def refund_facts(args: IssueRefundArgs, ctx: EffectContext) -> dict[str, str]:
    """What a finance approver wants beside a refund: the order, what was refunded, the customer."""
    with connect(_db()) as db:
        order = db.execute("SELECT * FROM orders WHERE id = ?", (args.order_id,)).fetchone()
        if order is None:
            return {"Order": f"{args.order_id} does not exist"}
        customer = db.execute("SELECT * FROM customers WHERE id = ?", (order["customer_id"],)).fetchone()
        since = time.time() - REFUND_WINDOW_DAYS * 86400
        count, cents = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(r.amount_cents), 0) FROM refunds r JOIN orders o ON o.id = r.order_id"
            " WHERE o.customer_id = ? AND r.created_at >= ?",
            (order["customer_id"], since),
        ).fetchone()
    return {
        "Order total": f"${order['amount_cents'] / 100:.2f}",
        "Already refunded": f"${order['refunded_cents'] / 100:.2f}",
        "Customer since": (customer["customer_since"] if customer else None) or "unknown",
        f"Refunds in the last {REFUND_WINDOW_DAYS} days": f"{count} (${cents / 100:.2f}) for {order['customer_id']}",
    }


def customer_still_exists(args: DeleteCustomerArgs | EmailCustomerArgs, ctx: EffectContext) -> str | None:
    with connect(_db()) as db:
        customer = db.execute("SELECT deleted_at FROM customers WHERE id = ?", (args.customer_id,)).fetchone()
    if customer is None or customer["deleted_at"] is not None:
        return f"customer {args.customer_id} is gone"
    return None


FINANCE = ("finance@example.com",)
OPS = ("ops@example.com",)
OPS_AND_SECURITY = ("ops@example.com", "security@example.com")

DEMO_TOOLS = [
    Tool(
        name="lookup_order",
        description="Look up an order: customer, amount, amount already refunded, status.",
        args_model=LookupOrderArgs,
        policy=ToolPolicy(gated=False),
        effect=lookup_order,
        summarize=lambda a: f"Look up order {a.order_id}",
    ),
    Tool(
        name="issue_refund",
        description="Refund part or all of an order to the customer's original payment method.",
        args_model=IssueRefundArgs,
        policy=ToolPolicy(
            gated=True,
            when="amount_usd > 500",
            approvers=FINANCE,
            deadline_seconds=24 * 3600,
            reminders_seconds=(4 * 3600,),
            escalate_after_seconds=8 * 3600,
            escalate_to=("finance-lead@example.com",),
            high_stakes=True,
            high_stakes_when="amount_usd > 1000",
        ),
        effect=issue_refund,
        summarize=lambda a: f"Refund ${a.amount_usd} to order {a.order_id}",
        editable={"amount_usd": EditRule("decrease_only")},
        precondition=refund_still_possible,
        confirm_field="amount_usd",
        context=refund_facts,
    ),
    Tool(
        name="delete_customer",
        description="Delete a customer record. Irreversible.",
        args_model=DeleteCustomerArgs,
        policy=ToolPolicy(
            gated=True, approvers=OPS_AND_SECURITY, quorum=2, deadline_seconds=72 * 3600, high_stakes=True
        ),
        effect=delete_customer,
        summarize=lambda a: f"Delete customer {a.customer_id}",
        precondition=customer_still_exists,
        confirm_field="customer_id",
    ),
    Tool(
        name="email_customer",
        description="Send an email to a customer on the company's behalf.",
        args_model=EmailCustomerArgs,
        policy=ToolPolicy(gated=True, approvers=OPS, deadline_seconds=24 * 3600),
        effect=email_customer,
        summarize=lambda a: f"Email customer {a.customer_id}: {a.subject!r}",
        editable={"subject": EditRule(), "body": EditRule()},
        precondition=customer_still_exists,
    ),
]
