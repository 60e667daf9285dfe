"""A question's form (made from a pydantic answer model by `ask_person`) as people use it on a phone,
with JavaScript off and on: it fits the screen, every control has a label and a tap target of at
least 44 px, a wrong answer comes back on the form with what is wrong and decides nothing, and the
corrected answer reaches the asking handler typed. The asking handler is tests/support/questions.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.approver import wait_for_email
from support.processes import IsolatedStack, StackFactory
from support.questions import ANSWERED

from browser.approval_page import ApprovalPage
from browser.audits import horizontal_overflow, low_contrast_text, unlabelled_controls
from browser.conftest import PHONE, ContextFactory


@pytest.fixture()
def stack(isolated_stack: StackFactory) -> Iterator[IsolatedStack]:
    yield isolated_stack(app_env={"COUNTERSIGN_SERVICES": "tests.support.questions:served"})


@pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])
def test_the_question_form_is_usable_on_a_phone(
    stack: IsolatedStack, new_context: ContextFactory, screenshots: Path, javascript: bool
) -> None:
    run_id = f"phone-q-{'js' if javascript else 'nojs'}"
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": run_id})
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    form = ApprovalPage.open(new_context(**PHONE, java_script_enabled=javascript), mail.link)
    page = form.page
    form.screenshot(screenshots, f"question-phone-{'js' if javascript else 'nojs'}")
    assert horizontal_overflow(page) == 0, "the form scrolls sideways on a 390 px phone"
    assert unlabelled_controls(page) == []
    assert low_contrast_text(page) == []
    for choice in ("short", "long", "formal", "Notify"):
        control_id = page.get_by_label(choice, exact=True).get_attribute("id")
        box = page.locator(f"label[for='{control_id}']").bounding_box()
        assert box is not None and box["height"] >= 44, f"the {choice} choice is a tap target under 44 px"
    send = page.get_by_role("button", name="Send answer", exact=True)
    decline = page.get_by_role("button", name="Decline", exact=True)
    for button in (send, decline):
        box = button.bounding_box()
        assert box is not None and box["height"] >= 44 and box["width"] >= 44, "tap targets are at least 44 px"

    assert page.get_by_label("Tags").input_value() == "", "an empty list's default shows as an empty box"
    page.get_by_label("Account").fill("DE89-3704")
    page.get_by_label("Amount").fill("-5")
    page.get_by_label("formal", exact=True).check()
    page.get_by_label("Notify").check()
    page.get_by_label("Tags").fill("vip\nrepeat")
    refused = form.submit(send.click)
    assert refused.status == 400
    assert "greater than or equal to 0" in page.locator("#problem").inner_text()
    # What was typed is still there, so only the wrong value needs fixing.
    assert page.get_by_label("Account").input_value() == "DE89-3704"
    assert page.get_by_label("formal", exact=True).is_checked() and page.get_by_label("Notify").is_checked()
    assert page.get_by_label("Tags").input_value() == "vip\nrepeat"
    assert stack.ingress.call("Approval", f"{run_id}-a0", "status", None).json()["approvals"][0]["state"] == "pending"

    page.get_by_label("Amount").fill("120.50")
    sent = form.submit(send.click)
    assert sent.status == 200 and sent.origin == stack.app.url
    assert "Answer sent" in form.text()
    result = stack.ingress.wait_invocation(invocation).json()
    assert result["outcome"] == "answered"
    assert result["answer"] == ANSWERED
