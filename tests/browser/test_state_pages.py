"""Every page an approver can land on after the decision window: each says honestly what happened.

Covers a stale tab pressed after someone else decided, a cancelled run, an expired approval, and
links that are not valid; each page is screenshotted as a test artifact.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.approver import wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, StackFactory

from browser.approval_page import ApprovalPage
from browser.audits import horizontal_overflow
from browser.conftest import PHONE, ContextFactory, RefundStarter
from browser.scenario import refund_task


def test_a_stale_tab_pressed_after_the_decision_changes_nothing(
    app_server: AppServer,
    ingress: Ingress,
    demo_db: Path,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    context = new_context()
    first, stale = ApprovalPage.open(context, refund.mail.link), ApprovalPage.open(context, refund.mail.link)
    assert first.approve().status == 200

    late = stale.reject("changed my mind")
    assert late.status == 409 and late.origin == app_server.url
    assert stale.heading.inner_text() == f"Already approved: {refund.summary}"
    text = stale.text()
    assert "You pressed Reject, but this was already decided: your click changed nothing." in text
    assert "approved by finance@example.com" in text
    stale.screenshot(screenshots, "stale-tab-409")
    assert ingress.wait_output(run_id).json()["actions"][1]["outcome"] == "approved"
    assert len(refunds_for(demo_db, run_id)) == 1


def test_cancelled_run_page(
    ingress: Ingress,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    assert ingress.call("AgentRun", run_id, "cancel", {"reason": "customer withdrew the claim"}).status_code == 200
    assert ingress.wait_output(run_id).json()["status"] == "cancelled"

    page = ApprovalPage.open(new_context(**PHONE), refund.mail.link)
    assert page.heading.inner_text() == f"Cancelled: {refund.summary}"
    assert horizontal_overflow(page.page) == 0
    text = page.text()
    # The caller's reason, or the run's own if it saw the cancel before it began to wait: either is recorded.
    [record] = ingress.status(run_id)["approvals"]
    assert record["state"] == "cancelled" and record["reason"] in (
        "customer withdrew the claim",
        "the run was cancelled",
    )
    assert "The run was cancelled at " in text and f"Reason given: {record['reason']}" in text
    assert "It did not run" in text
    assert page.approve_button.count() == 0
    page.screenshot(screenshots, "cancelled-phone")


@pytest.mark.slow
def test_expired_approval_page(
    isolated_stack: StackFactory, new_context: ContextFactory, screenshots: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[tools.issue_refund]\ndeadline_seconds = 2\nreminders_seconds = []\n")
    stack = isolated_stack(app_env={"APPROVALS_POLICY_FILE": str(policy)})
    order = new_order(stack.db_path, 100_000)
    stack.ingress.start_run("expiring", refund_task(order, "700.00"))
    [mail] = wait_for_email(stack.outbox_dir, "expiring")
    assert stack.ingress.wait_output("expiring", timeout=30).json()["actions"][1]["outcome"] == "expired"

    page = ApprovalPage.open(new_context(), mail.link)
    assert page.heading.inner_text() == f"Expired: Refund $700.00 to order {order}"
    text = page.text()
    assert "Nobody decided before the deadline" in text and "It did not run" in text
    assert page.approve_button.count() == 0
    page.screenshot(screenshots, "expired")
    assert refunds_for(stack.db_path, "expiring") == []


@pytest.mark.parametrize(
    ("mangle", "status", "name"),
    [
        (lambda token: token[:-2] + ("AA" if not token.endswith("AA") else "BB"), 403, "invalid-link"),
        (lambda token: token[:20], 400, "malformed-link"),
    ],
    ids=["forged-tag", "truncated"],
)
def test_invalid_link_page_says_nothing_was_decided(
    ingress: Ingress,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    mangle: object,
    status: int,
    name: str,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    base, token = refund.mail.link.rsplit("/", 1)
    page = new_context().new_page()
    response = page.goto(f"{base}/{mangle(token)}")  # type: ignore[operator]
    assert response is not None and response.status == status
    assert page.get_by_role("heading", level=1).inner_text() == "Link not valid"
    text = page.inner_text("body")
    assert "Nothing was decided." in text and token not in page.content()
    assert page.get_by_role("button").count() == 0
    page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
    assert ingress.status(run_id)["pending"], "a bad link decides nothing"
    ingress.call("AgentRun", run_id, "cancel", {"reason": "test cleanup"})
