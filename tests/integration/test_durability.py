"""The acceptance test of any approval system: crash while waiting, approve, exactly one effect."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.approver import approval_emails, form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import StackFactory, wait_until


def refund(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order} for $800.00",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "800.00", "reason": "late"}}],
    }


def statuses(stack: Any, run_id: str) -> set[str]:
    return {
        row["status"] for row in stack.restate.invocation_statuses(key=run_id) if row["target_handler_name"] == "run"
    }


@pytest.mark.slow
def test_kill9_handler_while_pending_then_approve(isolated_stack: StackFactory) -> None:
    stack = isolated_stack()
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run("kill-app", refund(order))
    [mail] = wait_for_email(stack.outbox_dir, "kill-app")
    csrf = form_csrf(mail.link)

    stack.app.kill9()
    wait_until(lambda: statuses(stack, "kill-app") & {"suspended", "backing-off"}, 30, "the run to park")
    stack.app.restart()
    assert submit(mail.link, "approve", csrf=csrf).status_code == 200

    result = stack.ingress.wait_output("kill-app", timeout=60).json()
    assert result["status"] == "completed"
    assert result["actions"][0]["outcome"] == "approved"
    assert refunds_for(stack.db_path, "kill-app") == [("kill-app/0", order, 80000)]
    kinds = sorted(path.name.split("_")[0] for path in stack.outbox_dir.glob("*.eml"))
    assert kinds == ["approval-outcome", "approval-receipt", "approval-request"], "one email per intent"


@pytest.mark.slow
def test_kill9_restate_server_while_pending_then_approve(isolated_stack: StackFactory) -> None:
    stack = isolated_stack()
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run("kill-server", refund(order))
    [mail] = wait_for_email(stack.outbox_dir, "kill-server")
    wait_until(lambda: "suspended" in statuses(stack, "kill-server"), 30, "the run to suspend")

    stack.restate.kill9()
    stack.restate.restart()
    wait_until(lambda: "suspended" in statuses(stack, "kill-server"), 30, "the run to be suspended after restart")
    assert stack.ingress.status("kill-server")["pending"][0]["approval_id"] == "kill-server-a0"
    assert submit(mail.link, "approve").status_code == 200

    result = stack.ingress.wait_output("kill-server", timeout=60).json()
    assert result["status"] == "completed"
    assert refunds_for(stack.db_path, "kill-server") == [("kill-server/0", order, 80000)]


@pytest.mark.slow
def test_kill9_handler_inside_the_tool_step_runs_the_effect_once(isolated_stack: StackFactory) -> None:
    """A crash after the refund row is written but before the step is journaled: the retry finds it."""
    stack = isolated_stack(app_env={"COUNTERSIGN_FAULT": "crash-after-effect:issue_refund"})
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run("kill-mid-step", refund(order))
    [mail] = wait_for_email(stack.outbox_dir, "kill-mid-step")
    csrf = form_csrf(mail.link)
    # The page is served by the process the fault kills, so its answer may be lost; the row counts.
    with contextlib.suppress(httpx.HTTPError):
        submit(mail.link, "approve", csrf=csrf)
    wait_until(lambda: not stack.app.alive(), 30, "the fault to kill the handler")
    assert refunds_for(stack.db_path, "kill-mid-step") == [("kill-mid-step/0", order, 80000)]

    stack.app.env.pop("COUNTERSIGN_FAULT")
    stack.app.restart()
    result = stack.ingress.wait_output("kill-mid-step", timeout=60).json()
    assert result["actions"][0]["outcome"] == "approved"
    assert result["actions"][0]["result"]["order_id"] == order
    assert refunds_for(stack.db_path, "kill-mid-step") == [("kill-mid-step/0", order, 80000)]


def test_a_hard_cancel_while_the_approved_action_runs_still_sends_the_approvers_receipt(
    private_stacks: StackFactory, tmp_path: Path
) -> None:
    """The receipt of the vote that decides waits to go out with the outcome notice, after the action;
    a hard cancel of the approval's workflow while the action runs (Restate's own cancel) still sends it."""
    held = tmp_path / "held"
    held.mkdir()
    stack = private_stacks(app_env={"COUNTERSIGN_TOOLS": "tests.support.held_tools:TOOLS", "HELD_TOOLS_DIR": str(held)})
    args = {"customer_id": "c_17", "subject": "Hello", "body": "Hi"}
    task = {"goal": "Say hello", "requester": "alice@example.com", "script": [{"tool": "email_held", "args": args}]}
    stack.ingress.start_run("cancel-held", task)
    [mail] = wait_for_email(stack.outbox_dir, "cancel-held")
    assert submit(mail.link, "approve").status_code == 200
    wait_until(lambda: (held / "cancel-held.started").exists(), 30, "the approved action to start")
    assert not approval_emails(stack.outbox_dir, "cancel-held", "receipt"), "held for the outcome's step"

    [workflow] = [
        row["id"]
        for row in stack.restate.invocation_statuses("Approval", "cancel-held-a0")
        if row["target_handler_name"] == "run"
    ]
    cancelled = httpx.patch(f"{stack.restate.admin_url}/invocations/{workflow}/cancel", timeout=10)
    assert cancelled.is_success, cancelled.text
    try:
        [receipt] = wait_for_email(stack.outbox_dir, "cancel-held", kind="receipt")
    finally:
        (held / "cancel-held.go").touch()  # the action's step may still be waiting: let it end
    assert "You approved" in receipt.text
    # The cancel ends the approval's workflow, and the run that called it ends with the same 409.
    result = stack.ingress.wait_output("cancel-held", timeout=60).json()
    assert (result["code"], result["message"]) == (409, "cancelled"), result
