"""The agent tasks and tool calls the integration tests start runs with, and the wait for a run's approval."""

from __future__ import annotations

from typing import Any

from support.processes import Ingress, wait_until


def task(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"goal": "semantics test", "requester": "alice@example.com", "script": list(steps)}


def refund_step(order: int, amount: str, **extra: Any) -> dict[str, Any]:
    return {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "r"}, **extra}


def refund_task(order: int, amount: str = "700.00") -> dict[str, Any]:
    step = {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "r"}}
    return {"goal": "ops test", "requester": "alice@example.com", "script": [step]}


def lookup_then_refund_task(amount: str, order_id: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order_id} for ${amount}",
        "requester": "alice@example.com",
        "script": [
            {"tool": "lookup_order", "args": {"order_id": order_id}},
            {
                "tool": "issue_refund",
                "args": {"order_id": order_id, "amount_usd": amount, "reason": "damaged in transit"},
                "why": "The customer sent photos of the damage.",
            },
        ],
    }


def refund(order: int, amount: str) -> dict[str, Any]:
    """The arguments of an `issue_refund` call."""
    return {"order_id": order, "amount_usd": amount, "reason": "damaged in transit"}


def wait_pending(ingress: Ingress, run_id: str, timeout: float = 20) -> dict[str, Any]:
    def pending() -> dict[str, Any] | None:
        status = ingress.status(run_id)
        return status if status["pending"] else None

    return wait_until(pending, timeout, f"{run_id} to wait for an approval")


def reassign(ingress: Ingress, run_id: str, approval_id: str, to: str, replacing: str) -> None:
    """Hand `replacing`'s part of a run's approval to `to` (a new round: older links stop deciding)."""
    moved = ingress.call("AgentRun", run_id, "reassign", {"approval_id": approval_id, "to": to, "replacing": replacing})
    assert moved.status_code == 200 and moved.json()["accepted"], moved.text
