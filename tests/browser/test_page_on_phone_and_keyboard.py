"""The confirmation page as people use it: on a phone (above the fold), by keyboard alone, and with
assistive technology in mind (labels, focus, contrast, no scripts)."""

from __future__ import annotations

from pathlib import Path

import httpx
from support.processes import AppServer, Ingress

from browser.approval_page import ApprovalPage
from browser.audits import bottom_of, horizontal_overflow, low_contrast_text, text_smaller_than, unlabelled_controls
from browser.conftest import PHONE, PHONE_HEIGHT, ContextFactory, RefundStarter
from browser.scenario import WHY


def test_phone_shows_the_whole_decision_above_the_fold(
    new_context: ContextFactory,
    screenshots: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    approval = ApprovalPage.open(new_context(**PHONE), refund.mail.link)
    page = approval.page
    approval.screenshot(screenshots, "confirm-phone-fold", full_page=False)
    approval.screenshot(screenshots, "confirm-phone-full")

    assert horizontal_overflow(page) == 0
    must_show = {
        "what will happen": approval.heading,
        "who asked": page.get_by_text("alice@example.com", exact=False).first,
        "the agent's reason": page.get_by_text(WHY),
        "the policy": page.get_by_text("issue_refund: needs approval when amount_usd > 500"),
        "the deadline": page.locator("#deadline"),
        "the approver": page.locator("#approver"),
        "the digest": page.locator("dd code"),
        "the reason box": approval.reason_box,
        "Approve": approval.approve_button,
        "Reject": approval.reject_button,
    }
    for what, locator in must_show.items():
        assert bottom_of(locator) <= PHONE_HEIGHT, f"{what} is below the fold on a 390x844 phone"
    assert approval.heading.inner_text() == refund.summary
    deadline = page.locator("#deadline").inner_text()
    assert deadline.startswith("in 23 hours") and deadline.endswith(" UTC)"), deadline
    assert page.locator("#approver").inner_text() == "finance@example.com"
    for button in (approval.approve_button, approval.reject_button):
        box = button.bounding_box()
        assert box is not None and box["height"] >= 44 and box["width"] >= 44, "tap targets are at least 44 px"


def test_keyboard_only_approve_with_enter(
    app_server: AppServer,
    ingress: Ingress,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    approval = ApprovalPage.open(new_context(), refund.mail.link)
    presses = approval.tab_to(approval.approve_button)
    assert presses <= 4, "Approve is a few Tab presses from the top"
    style, width = approval.focus_ring()
    assert style != "none" and width >= 2, "the focused button shows a visible focus ring"
    approval.screenshot(screenshots, "keyboard-focus-approve", full_page=False)

    sent = approval.submit(lambda: approval.page.keyboard.press("Enter"))
    assert sent.status == 200 and sent.origin == app_server.url
    assert approval.heading.inner_text().startswith("Approved: ")
    assert ingress.wait_output(run_id).json()["actions"][1]["outcome"] == "approved"


def test_keyboard_only_reject_with_a_typed_reason_and_space(
    app_server: AppServer,
    ingress: Ingress,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    approval = ApprovalPage.open(new_context(), refund.mail.link)
    approval.tab_to(approval.reason_box)
    style, width = approval.focus_ring()
    assert style != "none" and width >= 2, "the focused reason box shows a visible focus ring"
    approval.page.keyboard.type("Duplicate of a refund already paid.")
    approval.tab_to(approval.reject_button)
    approval.screenshot(screenshots, "keyboard-focus-reject", full_page=False)

    sent = approval.submit(lambda: approval.page.keyboard.press("Space"))
    assert sent.status == 200 and sent.origin == app_server.url
    assert approval.heading.inner_text() == f"Rejected: {refund.summary}"
    action = ingress.wait_output(run_id).json()["actions"][1]
    assert action["outcome"] == "rejected" and action["reason"] == "Duplicate of a refund already paid."


def test_page_is_labelled_readable_and_script_free(
    new_context: ContextFactory,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    context = new_context(**PHONE)
    approval = ApprovalPage.open(context, refund.mail.link)
    page = approval.page
    assert page.evaluate("document.documentElement.lang") == "en"
    assert unlabelled_controls(page) == []
    assert approval.reason_box.get_attribute("name") == "reason"
    assert low_contrast_text(page) == []
    assert text_smaller_than(page, 12) == []
    assert page.locator("script").count() == 0, "the pages work without JavaScript and carry none"
    csp = httpx.get(refund.mail.link, timeout=30).headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp, "the policy forbids every script"

    for name in ("Approve", "Reject"):
        approval.page.get_by_role("button", name=name, exact=True).focus()
        style, width = approval.focus_ring()
        assert style != "none" and width >= 2, f"{name} shows a visible focus ring"

    approval.approve()
    for audit in (unlabelled_controls, low_contrast_text):
        assert audit(page) == [], f"{audit.__name__} on the result page"
    assert horizontal_overflow(page) == 0
