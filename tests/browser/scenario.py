"""The runs the browser tests approve: a refund over the policy's $500 threshold on a fresh order.

Guarantee: each call starts one new run on its own order and waits (bounded) until its approval
email is in the outbox, so a test starts from a real pending approval.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.approver import ApprovalEmail, wait_for_email
from support.business import new_order
from support.processes import Ingress

WHY = "The customer sent photos of the parcel crushed in transit; the order is eligible for a full refund."


@dataclass(frozen=True)
class PendingRefund:
    run_id: str
    order: int
    amount: str
    mail: ApprovalEmail

    @property
    def summary(self) -> str:
        return f"Refund ${self.amount} to order {self.order}"


def refund_task(order: int, amount: str) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order} for ${amount}: it arrived damaged",
        "requester": "alice@example.com",
        "script": [
            {"tool": "lookup_order", "args": {"order_id": order}},
            {
                "tool": "issue_refund",
                "args": {"order_id": order, "amount_usd": amount, "reason": "damaged in transit"},
                "why": WHY,
            },
        ],
    }


def start_pending_refund(ingress: Ingress, demo_db: Path, outbox: Path, run_id: str, amount: str) -> PendingRefund:
    order = new_order(demo_db, 100_000)
    started = ingress.start_run(run_id, refund_task(order, amount))
    assert started.status_code == 202, started.text
    [mail] = wait_for_email(outbox, run_id)
    return PendingRefund(run_id=run_id, order=order, amount=amount, mail=mail)
