"""End-to-end approval flows against a real restate-server, the real app and its outbox."""

from __future__ import annotations

from pathlib import Path

import httpx
from support.approver import form_csrf, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, RestateServer
from support.runs import lookup_then_refund_task, wait_pending


def test_approve_executes_the_frozen_refund_once(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 125000)
    assert ingress.start_run(run_id, lookup_then_refund_task("700.00", order)).status_code == 202
    status = wait_pending(ingress, run_id)
    [pending] = status["pending"]
    assert pending["tool"] == "issue_refund"
    assert pending["args"] == {"order_id": order, "amount_usd": "700.00", "reason": "damaged in transit"}
    assert pending["approvers"] == ["finance@example.com"]
    assert refunds_for(demo_db, run_id) == []

    [mail] = wait_for_email(outbox_dir, run_id)
    assert mail.message["To"] == "finance@example.com"
    assert f"Refund $700.00 to order {order}" in mail.message["Subject"]
    assert "amount_usd: 700.00" in mail.text and "The customer sent photos" in mail.text
    assert pending["digest"][:12] in mail.text
    assert "An agent working for alice@example.com" in mail.text  # AgentRun is an agent

    page = open_page(mail.link)
    assert page.status_code == 200
    assert f"Refund $700.00 to order {order}" in page.text and pending["digest"][:12] in page.text
    csrf = form_csrf(mail.link)
    decided = submit(mail.link, "approve", csrf=csrf)
    assert decided.status_code == 200, decided.text
    assert "Approved" in decided.text

    result = ingress.wait_output(run_id).json()
    assert result["status"] == "completed"
    refund = result["actions"][1]
    assert refund["outcome"] == "approved"
    assert refund["approved_by"] == ["finance@example.com"]
    assert refund["args"] == pending["args"]
    assert refund["idempotency_key"] == f"{run_id}/1"
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", order, 70000)]

    again = submit(mail.link, "reject", "too late", csrf=csrf)
    assert again.status_code == 409
    assert "approved by finance@example.com" in again.text
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", order, 70000)]


def test_reject_reason_reaches_the_model_and_the_result(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, lookup_then_refund_task("650.00", new_order(demo_db, 90000)))
    [mail] = wait_for_email(outbox_dir, run_id)

    no_reason = submit(mail.link, "reject", "")
    assert no_reason.status_code == 400
    assert ingress.status(run_id)["pending"], "a refused form must decide nothing"

    rejected = submit(mail.link, "reject", "Photos show no damage; offer a replacement instead.")
    assert rejected.status_code == 200

    result = ingress.wait_output(run_id).json()
    refund = result["actions"][1]
    assert refund["outcome"] == "rejected"
    assert refund["reason"] == "Photos show no damage; offer a replacement instead."
    assert refund["args"] is None
    assert "Photos show no damage" in result["answer"], "the scripted model echoes what it was told"
    assert refunds_for(demo_db, run_id) == []


def test_get_and_head_never_decide(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, lookup_then_refund_task("600.00", new_order(demo_db, 90000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    scanner = {"User-Agent": "Mozilla/5.0 (compatible; HeadlessChrome) SafeLinks"}
    for url in (mail.link, mail.link + "?intent=approve", mail.link + "?intent=reject"):
        for _ in range(3):
            assert httpx.get(url, headers=scanner, timeout=30, follow_redirects=True).status_code == 200
            assert httpx.head(url, headers=scanner, timeout=30).status_code == 200

    promises = restate_server.sql(
        f"SELECT completed FROM sys_promise WHERE service_name = 'AgentRun' AND service_key = '{run_id}'"
    )
    assert promises == [] or all(not row["completed"] for row in promises)
    assert len(ingress.status(run_id)["pending"]) == 1
    assert submit(mail.link, "approve").status_code == 200
    assert ingress.wait_output(run_id).json()["actions"][1]["outcome"] == "approved"


def test_autonomous_call_runs_without_asking(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 4500)
    ingress.start_run(run_id, lookup_then_refund_task("25.00", order))
    result = ingress.wait_output(run_id).json()
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "autonomous"]
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", order, 2500)]
    assert list(outbox_dir.glob(f"*{run_id}*")) == []


def test_unknown_tool_and_invalid_args_go_back_to_the_model(
    app_server: AppServer, ingress: Ingress, run_id: str
) -> None:
    task = {
        "goal": "do odd things",
        "requester": "alice@example.com",
        "script": [
            {"tool": "launch_rocket", "args": {}},
            {"tool": "issue_refund", "args": {"order_id": "x", "amount_usd": -5}},
            {"tool": "lookup_order", "args": {"order_id": 999999}},
        ],
    }
    ingress.start_run(run_id, task)
    result = ingress.wait_output(run_id).json()
    assert result["status"] == "completed"
    unknown, invalid, missing = result["actions"]
    assert unknown["outcome"] == "invalid" and "unknown tool 'launch_rocket'" in unknown["result"]["error"]
    assert invalid["outcome"] == "invalid" and "order_id" in invalid["result"]["error"]
    assert missing["outcome"] == "failed" and "does not exist" in missing["result"]["error"]
    assert "launch_rocket: invalid" in result["answer"]


def test_demo_goal_without_script_plans_the_refund(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 70000)
    ingress.start_run(run_id, {"goal": f"Refund order {order} for $612.40", "requester": "bob@example.com"})
    status = wait_pending(ingress, run_id)
    assert status["pending"][0]["args"]["amount_usd"] == "612.40"
    assert [a["tool"] for a in status["history"]] == ["lookup_order"]
    [mail] = wait_for_email(outbox_dir, run_id)
    assert submit(mail.link, "reject", "not this one").status_code == 200
    assert ingress.wait_output(run_id).json()["actions"][1]["outcome"] == "rejected"


def test_cancel_resolves_the_pending_approval(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, lookup_then_refund_task("640.00", new_order(demo_db, 90000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    receipt = ingress.call("AgentRun", run_id, "cancel", {"reason": "customer withdrew the claim"})
    assert receipt.status_code == 200
    assert receipt.json()["accepted"] is True
    assert receipt.json()["cancelled_approvals"] == [f"{run_id}-a1"]

    result = ingress.wait_output(run_id).json()
    assert result["status"] == "cancelled"
    assert result["actions"][1]["outcome"] == "cancelled"
    assert "cancelled" in open_page(mail.link).text
    late = submit(mail.link, "approve", csrf=csrf)
    assert late.status_code == 409 and "cancelled" in late.text
    assert refunds_for(demo_db, run_id) == []
    assert ingress.call("AgentRun", run_id, "cancel", {"reason": "again"}).json()["accepted"] is False
