"""Post-plan gating end to end: a plan approved once through the real email and page, then followed
by AgentRun and by a user's own loop (`request_plan_approval` + `gated_call(plan=...)`), with
deviations asked again or refused, against the real restate-server, app and outbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.approver import approval_emails, form_csrf, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, StackFactory, user_services, wait_until

from handlers.demo.business_db import connect, transaction


def refund(order: int, amount: str) -> dict[str, Any]:
    return {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "damaged in transit"}}


def plan_task(
    orders: list[int], amounts: list[str], *, bound: str, calls: int, on_deviation: str | None = None
) -> dict[str, Any]:
    plan = {
        "steps": [
            {
                "tool": "issue_refund",
                "one_of": {"order_id": orders},
                "at_most": {"amount_usd": bound},
                "calls": calls,
                "why": "Refund the damaged orders of the shipment.",
            }
        ]
    }
    options: dict[str, Any] = {"script": plan}
    if on_deviation:
        options["on_deviation"] = on_deviation
    return {
        "goal": "Refund the damaged orders of shipment 7",
        "requester": "alice@example.com",
        "script": [refund(o, a) for o, a in zip(orders, amounts, strict=True)],
        "plan": options,
    }


def wait_pending(ingress: Ingress, run_id: str, index: int) -> dict[str, Any]:
    wanted = f"{run_id}-a{index}"

    def pending() -> dict[str, Any] | None:
        found = [p for p in ingress.status(run_id)["pending"] if p["approval_id"] == wanted]
        return found[0] if found else None

    return wait_until(pending, 20, f"{wanted} to wait")


def test_a_plan_approved_once_runs_three_calls_without_further_emails(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    orders = [new_order(demo_db, 100000) for _ in range(3)]
    task = plan_task(orders, ["600.00", "700.00", "750.00"], bound="800", calls=3)
    assert ingress.start_run(run_id, task).status_code == 202
    pending = wait_pending(ingress, run_id, 0)
    assert pending["tool"] == "plan" and pending["approvers"] == ["finance@example.com"]
    [mail] = wait_for_email(outbox_dir, run_id)
    assert "Plan: issue_refund" in mail.message["Subject"] and "amount_usd ≤ 800" in mail.text
    page = open_page(mail.link)
    assert page.status_code == 200 and "Approve this plan once?" in page.text
    assert 'name="edit.step.0.at_most.amount_usd"' in page.text and pending["digest"][:12] in page.text
    assert refunds_for(demo_db, run_id) == [], "nothing runs before the plan is approved"

    assert submit(mail.link, "approve").status_code == 200
    result = ingress.wait_output(run_id).json()
    assert result["status"] == "completed", result
    plan_action, *refunds = result["actions"]
    assert plan_action["tool"] == "plan" and plan_action["outcome"] == "approved"
    assert plan_action["approval_id"] == f"{run_id}-a0"
    assert [a["outcome"] for a in refunds] == ["approved"] * 3
    assert all(a["plan_approval_id"] == f"{run_id}-a0" and a["approval_id"] is None for a in refunds)
    assert refunds_for(demo_db, run_id) == [
        (f"{run_id}/1", orders[0], 60000),
        (f"{run_id}/2", orders[1], 70000),
        (f"{run_id}/3", orders[2], 75000),
    ]
    assert len(approval_emails(outbox_dir, run_id)) == 1, "one plan email, no email per call"
    history = ingress.status(run_id)["history"]
    assert [h.get("plan_approval_id") for h in history[1:]] == [f"{run_id}-a0"] * 3
    entries = ingress.call("ApprovalAudit", f"{run_id}-a0", "entries", None).json()["entries"]
    in_plan = [e for e in entries if e["kind"] == "executed" and e["details"].get("in_plan")]
    assert [e["details"].get("approval_kind") for e in entries if e["kind"] == "requested"] == ["plan"]
    assert sorted(e["details"]["idempotency_key"] for e in in_plan) == [f"{run_id}/{i}" for i in (1, 2, 3)]


def test_an_edited_plan_stops_a_call_above_the_lowered_bound_for_a_fresh_approval(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    orders = [new_order(demo_db, 100000) for _ in range(2)]
    task = plan_task(orders, ["600.00", "700.00"], bound="800", calls=2)
    assert ingress.start_run(run_id, task).status_code == 202
    [mail] = wait_for_email(outbox_dir, run_id)
    # A field the page does not offer is refused as `decide` refuses it, not dropped: dropping it would
    # approve the unchanged plan (a widening, or an approver's narrowing, lost without a word).
    for offered_not in ({"step.0.one_of.order_id": "987007,987008"}, {"step.0.calls": "1", "step.9.drop": "drop"}):
        widened = submit(mail.link, "approve", edits=offered_not)
        assert widened.status_code == 400 and "cannot be edited" in widened.text, offered_not
        assert "Nothing was decided" in widened.text or "Not decided" in widened.text
        assert wait_pending(ingress, run_id, 0)["approvals"] == 0, "a refused edit decides nothing"
    raised = submit(mail.link, "approve", edits={"step.0.at_most.amount_usd": "900"})
    assert raised.status_code == 400 and "may only be lowered" in raised.text
    assert wait_pending(ingress, run_id, 0)["approval_id"] == f"{run_id}-a0", "an invalid edit decides nothing"

    assert submit(mail.link, "approve", edits={"step.0.at_most.amount_usd": "650"}).status_code == 200
    # The first refund (600) is inside the edited plan; the second (700) is above its bound.
    pending = wait_pending(ingress, run_id, 2)
    assert pending["tool"] == "issue_refund" and pending["args"]["amount_usd"] == "700.00"
    mails = wait_for_email(outbox_dir, run_id, count=2)
    deviation = mails[1]
    assert "Outside the approved plan: amount_usd 700.00 is above the plan's bound 650" in deviation.text
    assert "Outside the approved plan" in open_page(deviation.link).text
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", orders[0], 60000)]

    entries = ingress.call("ApprovalAudit", f"{run_id}-a2", "entries", None).json()["entries"]
    [requested] = [e for e in entries if e["kind"] == "requested"]
    assert requested["details"]["deviation"] == "amount_usd 700.00 is above the plan's bound 650"
    assert submit(deviation.link, "approve", csrf=form_csrf(deviation.link)).status_code == 200
    result = ingress.wait_output(run_id).json()
    plan_action, first, second = result["actions"]
    assert plan_action["outcome"] == "approved_with_edits" and plan_action["args"]["steps"][0]["at_most"] == {
        "amount_usd": "650"
    }
    assert first["plan_approval_id"] == f"{run_id}-a0" and first["approval_id"] is None
    assert second["approval_id"] == f"{run_id}-a2" and second["deviation"].startswith("amount_usd 700.00")
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", orders[0], 60000), (f"{run_id}/2", orders[1], 70000)]


def test_a_deviation_is_refused_when_the_run_says_so_and_the_model_is_told(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    orders = [new_order(demo_db, 100000) for _ in range(2)]
    task = plan_task(orders, ["600.00", "610.00"], bound="800", calls=1, on_deviation="refuse")
    assert ingress.start_run(run_id, task).status_code == 202
    [mail] = wait_for_email(outbox_dir, run_id)
    assert submit(mail.link, "approve").status_code == 200
    result = ingress.wait_output(run_id).json()
    _, inside, outside = result["actions"]
    assert inside["outcome"] == "approved" and inside["plan_approval_id"] == f"{run_id}-a0"
    assert outside["outcome"] == "rejected" and outside["decision_source"] == "system"
    assert outside["deviation"] == "more calls than the plan allows (1 in total)"
    assert "refused: outside the approved plan" in result["answer"], "the model read why"
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", orders[0], 60000)]
    assert len(approval_emails(outbox_dir, run_id)) == 1, "a refused deviation asks nobody"


def test_a_rejected_plan_is_told_to_the_model_and_every_gated_call_then_deviates(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 100000)
    task = plan_task([order], ["600.00"], bound="800", calls=1, on_deviation="refuse")
    assert ingress.start_run(run_id, task).status_code == 202
    [mail] = wait_for_email(outbox_dir, run_id)
    assert submit(mail.link, "reject", reason="refund them one at a time").status_code == 200
    result = ingress.wait_output(run_id).json()
    plan_action, call = result["actions"]
    assert plan_action["outcome"] == "rejected" and plan_action["reason"] == "refund them one at a time"
    assert call["outcome"] == "rejected" and "the plan was rejected" in call["deviation"]
    assert refunds_for(demo_db, run_id) == []


def test_cancelling_a_run_while_its_plan_waits_ends_it_and_nothing_runs(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 100000)
    assert ingress.start_run(run_id, plan_task([order], ["600.00"], bound="800", calls=1)).status_code == 202
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    wait_pending(ingress, run_id, 0)
    receipt = ingress.call("AgentRun", run_id, "cancel", {"reason": "customer withdrew"}).json()
    assert receipt["cancelled_approvals"] == [f"{run_id}-a0"]
    result = ingress.wait_output(run_id).json()
    assert result["status"] == "cancelled" and "customer withdrew" in result["answer"]
    assert refunds_for(demo_db, run_id) == []
    assert submit(mail.link, "approve", csrf=csrf).status_code == 409, "the cancelled plan decides nothing"


def test_a_users_own_loop_follows_an_approved_plan_and_the_tool_policy_refuses_a_deviation(
    isolated_stack: StackFactory, tmp_path: Path
) -> None:
    (tmp_path / "policy.toml").write_text('[tools.issue_refund.plan]\non_deviation = "refuse"\n')
    app_env = {**user_services("plandesk.agents:served"), "APPROVALS_POLICY_FILE": str(tmp_path / "policy.toml")}
    stack = isolated_stack(app_env=app_env)
    orders = [new_order(stack.db_path, 100000) for _ in range(3)]
    batch = {"run_id": "desk-plan", "orders": orders, "amounts": ["600.00", "650.00", "700.00"]}
    invocation = stack.ingress.send("PlanDesk", None, "refund_all", batch)
    [mail] = wait_for_email(stack.outbox_dir, "desk-plan")
    assert "Approve this plan once?" in open_page(mail.link).text
    assert submit(mail.link, "approve").status_code == 200
    out = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert out["plan"]["verdict"] == "approved" and out["plan"]["approval_id"] == "desk-plan-a0"
    first, second, third = out["records"]
    assert first["outcome"] == second["outcome"] == "approved"
    assert first["plan_approval_id"] == second["plan_approval_id"] == "desk-plan-a0"
    assert third["outcome"] == "rejected" and third["deviation"] == "more calls than the plan allows (2 in total)"
    assert refunds_for(stack.db_path, "desk-plan") == [
        ("desk-plan/1", orders[0], 60000),
        ("desk-plan/2", orders[1], 65000),
    ]
    assert len(approval_emails(stack.outbox_dir, "desk-plan")) == 1


@pytest.mark.slow
def test_kill9_of_the_handler_while_a_plan_approval_waits_then_approve(isolated_stack: StackFactory) -> None:
    stack = isolated_stack()
    orders = [new_order(stack.db_path, 100000) for _ in range(2)]
    stack.ingress.start_run("kill-plan", plan_task(orders, ["600.00", "700.00"], bound="800", calls=2))
    [mail] = wait_for_email(stack.outbox_dir, "kill-plan")
    csrf = form_csrf(mail.link)
    stack.app.kill9()
    stack.app.restart()
    assert submit(mail.link, "approve", csrf=csrf).status_code == 200
    result = stack.ingress.wait_output("kill-plan", timeout=60).json()
    assert result["status"] == "completed"
    assert [a["outcome"] for a in result["actions"]] == ["approved", "approved", "approved"]
    assert refunds_for(stack.db_path, "kill-plan") == [
        ("kill-plan/1", orders[0], 60000),
        ("kill-plan/2", orders[1], 70000),
    ], "each refund exactly once"
    assert len(approval_emails(stack.outbox_dir, "kill-plan")) == 1


def test_a_call_inside_the_plan_stopped_by_low_confidence_gets_its_own_approval(
    isolated_stack: StackFactory, tmp_path: Path, run_id: str
) -> None:
    (tmp_path / "policy.toml").write_text("[tools.issue_refund]\ngate_below_confidence = 0.7\n")
    stack = isolated_stack(app_env={"APPROVALS_POLICY_FILE": str(tmp_path / "policy.toml")})
    order = new_order(stack.db_path, 12000)
    task = plan_task([order], ["120.00"], bound="800", calls=1)
    task["script"][0]["confidence"] = 0.3
    assert stack.ingress.start_run(run_id, task).status_code == 202
    [plan_mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(plan_mail.link, "approve").status_code == 200

    # The refund fits the plan, but the model was unsure of it: a person decides it on its own.
    pending = wait_pending(stack.ingress, run_id, 1)
    assert pending["tool"] == "issue_refund"
    [own_record] = [a for a in stack.ingress.status(run_id)["approvals"] if a["approval_id"] == f"{run_id}-a1"]
    assert own_record["stopped_because"][0]["kind"] == "confidence" and own_record["deviation"] is None
    _, own = wait_for_email(stack.outbox_dir, run_id, count=2)
    assert f"{run_id}-a1" in own.path.name and "the model's confidence was 0.30 < 0.70" in own.text
    assert "Outside the approved plan" not in own.text, "it is not a deviation"
    assert refunds_for(stack.db_path, run_id) == [], "nothing ran on the plan's approval alone"

    assert submit(own.link, "approve", csrf=form_csrf(own.link)).status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    _, refund_action = result["actions"]
    assert refund_action["outcome"] == "approved" and refund_action["approval_id"] == f"{run_id}-a1"
    assert refund_action["deviation"] is None
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/1", order, 12000)]


def test_a_quorum_two_tool_inside_a_plan_still_needs_its_two_approvals(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    with connect(demo_db) as db, transaction(db):
        db.execute("INSERT OR IGNORE INTO customers(id, name, email) VALUES ('c_977', 'Temp', 't@example.com')")
    delete = {"tool": "delete_customer", "args": {"customer_id": "c_977", "reason": "duplicate"}}
    plan = {"steps": [{"tool": "delete_customer", "args": {"customer_id": "c_977"}}]}
    task = {"goal": "Remove duplicates", "requester": "alice@example.com", "script": [delete], "plan": {"script": plan}}
    assert ingress.start_run(run_id, task).status_code == 202
    plan_mails = wait_for_email(outbox_dir, run_id, count=2)
    ops_plan = next(m for m in plan_mails if m.message["To"] == "ops@example.com")
    assert submit(ops_plan.link, "approve").status_code == 200, "one person approves the plan"

    pending = wait_pending(ingress, run_id, 1)
    assert pending["tool"] == "delete_customer" and pending["quorum"] == 2
    mails = [m for m in wait_for_email(outbox_dir, run_id, count=4) if f"{run_id}-a1" in m.path.name]
    assert sorted(m.message["To"] for m in mails) == ["ops@example.com", "security@example.com"]
    with connect(demo_db) as db:
        assert db.execute("SELECT deleted_at FROM customers WHERE id = 'c_977'").fetchone()[0] is None
    for mail in mails:
        assert submit(mail.link, "approve", csrf=form_csrf(mail.link), confirm="c_977").status_code == 200
    result = ingress.wait_output(run_id).json()
    _, deleted = result["actions"]
    assert deleted["outcome"] == "approved" and deleted["approval_id"] == f"{run_id}-a1"
    assert deleted["approved_by"] == ["ops@example.com", "security@example.com"]
    with connect(demo_db) as db:
        assert db.execute("SELECT count(*) FROM customer_deletions WHERE customer_id = 'c_977'").fetchone()[0] == 1
