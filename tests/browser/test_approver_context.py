"""What the approver sees beside the action, in Chromium on a phone (JavaScript off): the facts
the tool read, the run's earlier calls, and, for an edited long text, the diff before it decides.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

from support.approver import wait_for_email
from support.processes import AppServer, Ingress, wait_until

from browser.approval_page import ApprovalPage, open_email
from browser.conftest import PHONE, ContextFactory, RefundStarter

BODY = "Hello Ada,\nyour refund is on its way.\nIt should arrive within 5 days.\nBest,\nSupport"


def audit_entries(ingress: Ingress, approval: str) -> list[dict[str, Any]]:
    return list(ingress.call("ApprovalAudit", approval, "entries", None).json()["entries"])


def audited(ingress: Ingress, approval: str) -> list[dict[str, Any]] | None:
    return audit_entries(ingress, approval) or None


def test_the_refund_facts_and_the_trail_on_the_page_and_in_the_email(
    ingress: Ingress,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    tmp_path: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    facts = {
        "Order total": "$1000.00",
        "Already refunded": "$0.00",
        "Customer since": "2019-03-14",
    }
    text = refund.mail.text
    assert "Facts read for you when it was requested:" in text
    for label, value in facts.items():
        assert f"    {label}: {value}" in text
    assert "Refunds in the last 90 days:" in text
    assert "What this run did before asking:" in text and "#0 lookup_order: autonomous" in text
    assert f'result: {{"amount_usd": "1000.00", "customer_id": "c_17", "order_id": {refund.order}' in text

    context = new_context(**PHONE)
    email = open_email(context, refund.mail, tmp_path)
    shown = email.inner_text("body")
    for label, value in facts.items():
        assert label in shown and value in shown
    assert "What this run did before asking" in shown and "lookup_order" in shown

    approval = ApprovalPage.from_email(email, "Review and approve")
    page = approval.page
    context_list = page.locator("#context")
    for label, value in facts.items():
        assert page.locator("#context dt", has_text=label).count() == 1
        assert value in context_list.inner_text()
    trail = page.locator("#trail li")
    assert trail.count() == 1
    assert "lookup_order autonomous" in trail.first.inner_text()
    assert '"refunded_usd": "0.00"' in trail.first.inner_text()
    assert f"Refund order {refund.order} for ${refund.amount}" in approval.text(), "the goal"
    scroll_width = page.evaluate("document.documentElement.scrollWidth")
    assert scroll_width <= PHONE["viewport"]["width"], "the facts and the trail fit the phone's width"
    approval.screenshot(screenshots, "context-and-trail-phone")

    [inbox_url] = re.findall(r"https?://\S+/inbox/[A-Za-z0-9._~-]+", text)
    inbox = context.new_page()
    inbox.goto(inbox_url)
    [item] = [li for li in inbox.locator("li").all() if refund.summary in li.inner_text()]
    assert "Order total: $1000.00 · Already refunded: $0.00 · Customer since: 2019-03-14" in item.inner_text()

    [requested] = [e for e in audit_entries(ingress, f"{run_id}-a1") if e["kind"] == "requested"]
    shown_facts = {f["label"]: f["value"] for f in requested["details"]["context"]}
    assert {k: shown_facts[k] for k in facts} == facts
    assert requested["details"]["context_error"] is None
    assert [t["tool"] for t in requested["details"]["trail"]] == ["lookup_order"]


def test_an_edited_email_body_shows_the_diff_before_it_decides(
    app_server: AppServer,
    ingress: Ingress,
    run_id: str,
    outbox_dir: Path,
    new_context: ContextFactory,
    screenshots: Path,
    tmp_path: Path,
) -> None:
    task = {
        "goal": "Tell Ada her refund is coming",
        "requester": "alice@example.com",
        "script": [{"tool": "email_customer", "args": {"customer_id": "c_17", "subject": "Your refund", "body": BODY}}],
    }
    assert ingress.start_run(run_id, task).status_code == 202
    [mail] = wait_for_email(outbox_dir, run_id)
    approval = ApprovalPage.open(new_context(**PHONE), mail.link)
    typed = BODY.replace("within 5 days", "within 3 business days").replace("Best,", "Kind regards,")
    approval.edit("body", typed)

    reviewed = approval.approve()
    assert reviewed.status == 200
    page = approval.page
    assert page.get_by_role("heading", name="Your changes to body").count() == 1
    assert "Nothing is decided yet" in approval.text()
    removed = page.locator("table.diff tr.del").all_inner_texts()
    added = page.locator("table.diff tr.add").all_inner_texts()
    assert any("It should arrive within 5 days." in row for row in removed)
    assert any("It should arrive within 3 business days." in row for row in added)
    assert any("Kind regards," in row for row in added)
    assert not any("your refund is on its way." in row for row in removed + added), "unchanged lines are not marked"
    approval.screenshot(screenshots, "edit-diff-phone")
    assert ingress.status(run_id)["phase"] == "awaiting_approval", "the review decided nothing"

    decided = approval.submit(page.get_by_role("button", name="Approve with these changes").click)
    assert decided.status == 200
    assert approval.heading.inner_text().startswith("Approved with your changes")
    result = ingress.wait_output(run_id).json()
    [action] = result["actions"]
    assert action["outcome"] == "approved_with_edits"
    assert action["args"]["body"] == typed, "exactly the reviewed text ran (line breaks as proposed)"

    [receipt] = wait_for_email(outbox_dir, run_id, kind="receipt")
    receipt_text = receipt.text.replace("\r\n", "\n")
    assert "Your changes to body (2 removed, 2 added):" in receipt_text
    fenced = "      | - It should arrive within 5 days.\n      | + It should arrive within 3 business days."
    assert fenced in receipt_text, "every line of the texts is fenced"
    shown = open_email(approval.page.context, receipt, tmp_path).inner_text("body")
    assert "Your changes to body" in shown and "+ Kind regards," in shown and "- Best," in shown


def test_facts_that_cannot_be_read_never_block_the_approval(
    private_stacks: Any, new_context: ContextFactory, tmp_path: Path
) -> None:
    stack = private_stacks(
        app_env={"COUNTERSIGN_TOOLS": "tests.support.context_tools:TOOLS", "TOOL_CONTEXT_TIMEOUT_SECONDS": "1"}
    )
    context = new_context(**PHONE)
    for tool, why in (("email_broken_facts", "RuntimeError: crm is down for c_17"), ("email_slow_facts", "1 s")):
        run = f"facts-{tool}"
        args = {"customer_id": "c_17", "subject": "Hello", "body": "Hi"}
        assert (
            stack.ingress.start_run(
                run, {"goal": "Say hello", "requester": "alice@example.com", "script": [{"tool": tool, "args": args}]}
            ).status_code
            == 202
        )
        [mail] = wait_for_email(stack.outbox_dir, run, timeout=60)
        assert "Facts: the facts could not be read (" in mail.text and why in mail.text
        email = open_email(context, mail, tmp_path)
        assert "The facts could not be read" in email.inner_text("body")
        approval = ApprovalPage.open(context, mail.link)
        notice = approval.page.locator("#context").inner_text()
        assert notice.startswith("The facts could not be read") and why in notice
        assert approval.approve().status == 200
        result = stack.ingress.wait_output(run, timeout=60).json()
        assert result["actions"][0]["outcome"] == "approved"
        entries = wait_until(partial(audited, stack.ingress, f"{run}-a0"), 30, "the audit trail")
        [requested] = [e for e in entries if e["kind"] == "requested"]
        assert requested["details"]["context"] == [] and why in requested["details"]["context_error"]
