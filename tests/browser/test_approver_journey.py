"""An approver's journey in Chromium: from the email's button to the page, the decision and its result.

Every form here is submitted by the browser itself (JavaScript off), so these tests also prove that
Chromium's own same-origin POST passes the page's Origin check.
"""

from __future__ import annotations

from pathlib import Path

from support.business import refunds_for
from support.processes import AppServer, Ingress

from browser.approval_page import ApprovalPage, open_email
from browser.conftest import ContextFactory, RefundStarter
from browser.scenario import WHY


def test_approve_from_the_email_runs_the_refund_once(
    app_server: AppServer,
    ingress: Ingress,
    demo_db: Path,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    tmp_path: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    context = new_context()
    email = open_email(context, refund.mail, tmp_path)
    email.screenshot(path=str(screenshots / "email-desktop.png"), full_page=True)

    approval = ApprovalPage.from_email(email, "Review and approve")
    assert approval.page.url.startswith(f"{app_server.url}/approvals/")
    assert approval.heading.inner_text() == refund.summary
    text = approval.text()
    for fact in (WHY, "alice@example.com", "issue_refund: needs approval when amount_usd > 500", "finance@example.com"):
        assert fact in text
    assert approval.page.evaluate("document.activeElement.textContent") == "Approve", "the email's intent focuses it"
    approval.screenshot(screenshots, "confirm-desktop")

    sent = approval.approve()
    assert sent.status == 200
    assert sent.origin == app_server.url, "Chromium must send the page's own origin, not null"
    assert sent.fetch_site == "same-origin"
    assert approval.heading.inner_text() == f"Approved: {refund.summary}"
    assert "What happens next" in approval.text()
    assert "issue_refund with exactly the arguments you saw" in approval.text()
    approval.screenshot(screenshots, "approved")

    result = ingress.wait_output(run_id).json()
    assert result["status"] == "completed"
    assert result["actions"][1]["outcome"] == "approved"
    assert result["actions"][1]["approved_by"] == ["finance@example.com"]
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", refund.order, 61240)]

    again = ApprovalPage.open(context, refund.mail.link)
    assert again.heading.inner_text() == f"Already approved: {refund.summary}"
    text = again.text()
    assert "approved by finance@example.com" in text
    assert "It has run, once." in text and "amount_usd 612.40" in text
    assert again.approve_button.count() == 0 and again.reject_button.count() == 0
    again.screenshot(screenshots, "already-approved")


def test_reject_with_a_reason_from_the_email(
    app_server: AppServer,
    ingress: Ingress,
    demo_db: Path,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    tmp_path: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund(amount="850.00")
    email = open_email(new_context(), refund.mail, tmp_path)
    approval = ApprovalPage.from_email(email, "Review and reject")
    assert approval.page.evaluate("document.activeElement.id") == "reason", "rejecting starts at the reason"
    approval.reason_box.fill("Photos show no damage; offer a replacement instead.")
    approval.screenshot(screenshots, "confirm-rejecting")

    sent = approval.submit(approval.reject_button.click)
    assert sent.status == 200 and sent.origin == app_server.url
    assert approval.heading.inner_text() == f"Rejected: {refund.summary}"
    text = approval.text()
    assert "Your reason: Photos show no damage; offer a replacement instead." in text
    assert "The action will not run." in text
    approval.screenshot(screenshots, "rejected")

    result = ingress.wait_output(run_id).json()
    assert result["actions"][1]["outcome"] == "rejected"
    assert result["actions"][1]["reason"] == "Photos show no damage; offer a replacement instead."
    assert refunds_for(demo_db, run_id) == []


def test_edit_the_amount_then_approve_runs_the_lower_refund(
    app_server: AppServer,
    ingress: Ingress,
    demo_db: Path,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund(amount="700.00")
    approval = ApprovalPage.open(new_context(), refund.mail.link)
    field = approval.edit_field("amount_usd")
    assert field.input_value() == "700.00"
    assert "may only be lowered" in approval.text()

    approval.edit("amount_usd", "800.00")
    refused = approval.approve()
    assert refused.status == 400 and "may only be lowered" in approval.text()
    assert "Nothing was decided" in approval.text()
    assert ingress.status(run_id)["pending"], "a refused edit decides nothing"

    approval = ApprovalPage.open(approval.page.context, refund.mail.link)
    approval.edit("amount_usd", "500.00")
    approval.screenshot(screenshots, "confirm-editing")
    sent = approval.approve()
    assert sent.status == 200 and sent.origin == app_server.url
    text = approval.text()
    assert approval.heading.inner_text() == f"Approved with your changes: {refund.summary}"
    assert "Your change: amount_usd 700.00 → 500.00" in text and "with your edited arguments, once" in text
    approval.screenshot(screenshots, "approved-with-edits")

    action = ingress.wait_output(run_id).json()["actions"][1]
    assert action["outcome"] == "approved_with_edits" and action["args"]["amount_usd"] == "500.00"
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", refund.order, 50000)]
