"""The approval email as an approver's phone shows it: the HTML part with images off at phone width,
and the text part carrying the same facts and links; agent text with bidi overrides or zero-width
characters shows them as markers in the email and on the page its button opens."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Route
from support.approver import wait_for_email
from support.business import new_order
from support.injection import BIDI, INVISIBLE, MARKERS, hidden_characters
from support.processes import AppServer, Ingress

from browser.approval_page import ApprovalPage, open_email
from browser.audits import horizontal_overflow, low_contrast_text, text_smaller_than
from browser.conftest import PHONE, PHONE_WIDTH, ContextFactory, RefundStarter
from browser.scenario import WHY, refund_task


def _no_images(route: Route) -> None:
    if route.request.resource_type == "image":
        route.abort()
    else:
        route.continue_()


def test_email_html_is_legible_on_a_phone_with_images_off(
    new_context: ContextFactory,
    screenshots: Path,
    tmp_path: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    context = new_context(**PHONE)
    context.route("**/*", _no_images)
    email = open_email(context, refund.mail, tmp_path)
    email.screenshot(path=str(screenshots / "email-phone.png"), full_page=True)

    assert horizontal_overflow(email) == 0, "the email must not scroll sideways at 390 px"
    assert text_smaller_than(email, 12) == []
    assert low_contrast_text(email) == []
    assert email.locator("img").count() == 0, "nothing in the email may depend on an image"
    for name in ("Review and approve", "Review and reject"):
        button = email.get_by_role("link", name=name)
        box = button.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE_WIDTH, f"{name} is cut off"
        assert box["height"] >= 44, f"{name} is too small to tap"
    assert email.get_by_role("heading", level=1).inner_text() == refund.summary


def test_email_text_part_has_the_same_facts_and_links_as_the_html(
    ingress: Ingress,
    run_id: str,
    new_context: ContextFactory,
    tmp_path: Path,
    pending_refund: RefundStarter,
) -> None:
    refund = pending_refund()
    [pending] = ingress.status(run_id)["pending"]
    email = open_email(new_context(), refund.mail, tmp_path)
    shown = email.inner_text("body")
    text = refund.mail.text

    facts = [
        refund.summary,
        "alice@example.com",
        f"Refund order {refund.order} for ${refund.amount}: it arrived damaged",
        WHY,
        "issue_refund: needs approval when amount_usd > 500",
        "finance@example.com",
        pending["digest"][:12],
        "1 day after the request",
        *(f"{value}" for value in pending["args"].values()),
    ]
    deadline = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", text)
    assert deadline, "the text part states the deadline"
    facts.append(deadline.group(0))
    for fact in facts:
        assert fact in shown, f"HTML part lacks {fact!r}"
        assert fact in text, f"text part lacks {fact!r}"

    hrefs = {
        email.get_by_role("link", name=name).get_attribute("href")
        for name in ("Review and approve", "Review and reject")
    }
    assert hrefs == {f"{refund.mail.link}?intent=approve", f"{refund.mail.link}?intent=reject"}
    lines = [line.strip() for line in text.splitlines()]
    for href in hrefs:
        assert href in lines, "each button's link is on a line of its own in the text part"


def test_bidi_and_zero_width_characters_show_as_markers_in_the_email_and_on_the_page(
    app_server: AppServer,
    ingress: Ingress,
    demo_db: Path,
    outbox_dir: Path,
    run_id: str,
    new_context: ContextFactory,
    screenshots: Path,
    tmp_path: Path,
) -> None:
    # "refund $12.00" where the browser honours the override, next to the real $1200.00.
    hostile = f"Customer asked for a partial {BIDI}{INVISIBLE} only"
    order = new_order(demo_db, 200_000)
    task = refund_task(order, "1200.00")
    task["script"][1]["why"] = hostile
    task["script"][1]["args"]["reason"] = hostile
    assert ingress.start_run(run_id, task).status_code == 202
    [mail] = wait_for_email(outbox_dir, run_id)
    assert hidden_characters(mail.text) == [] and "[U+202E]00.21$ dnufer[U+202C]" in mail.text

    email = open_email(new_context(**PHONE), mail, tmp_path)
    email.screenshot(path=str(screenshots / "email-bidi-marked.png"), full_page=True)
    in_email = email.inner_text("body")
    page = ApprovalPage.from_email(email, "Review and approve")
    assert page.heading.inner_text() == f"Refund $1200.00 to order {order}"
    page.screenshot(screenshots, "page-bidi-marked")
    for shown in (in_email, page.text()):
        # Before this fix, the text held U+202E and read "refund $12.00" beside the real amount.
        assert hidden_characters(shown) == [], "no bidi control or zero-width character reaches the reader"
        assert all(marker in shown for marker in MARKERS)
        assert "[U+202E]00.21$ dnufer[U+202C]" in shown and "1200.00" in shown
    ingress.call("AgentRun", run_id, "cancel", {"reason": "test cleanup"})
