"""A question with a typed answer (`ask_person`) from a user's own Service, answered by a person
through the real email and page: the form made from the answer model, a bad answer shown back and
deciding nothing, the typed answer returned, a second answer refused, a decline, the deadline
with and without a default answer (and the form sent after it), a reminder and an escalation in a
question's words, channels that are not valid or not set up, a model outside the form's subset
refused before anything is sent, a question listed in its person's inbox through the API beside an
action, and a kill -9 of the handler while the question waits; against the real restate-server."""

from __future__ import annotations

import httpx
import pytest
from support.approver import (
    CSRF,
    INBOX,
    answer_question,
    approval_emails,
    form_after_restart,
    form_csrf,
    open_page,
    wait_for_email,
)
from support.processes import IsolatedStack, wait_until
from support.questions import ANSWERED, ANSWERER, QUESTION, VALID

ADMIN = "https://admin.example.com"


MODULE_STACK_APP_ENV = {
    "COUNTERSIGN_SERVICES": "tests.support.questions:served",
    "COUNTERSIGN_TOOLS": "tests.support.questions:TOOLS",
    "APPROVALS_API_ALLOWED_ORIGINS": ADMIN,
    "APPROVALS_REASSIGN_ALLOWED": "lead@example.com",
}
"""The app's settings (conftest's `module_stack`): the user's Service and tools, the API's allowed origin."""


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test asks under run ids of its own."""
    return module_stack


def api(stack: IsolatedStack, link: str, suffix: str = "") -> str:
    return f"{stack.app.url}/api/v1/items/{link.rsplit('/approvals/', 1)[1]}{suffix}"


def test_a_question_is_answered_on_its_page_a_bad_answer_decides_nothing_and_a_second_is_refused(
    stack: IsolatedStack,
) -> None:
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-1"})
    [mail] = wait_for_email(stack.outbox_dir, "q-1")
    assert QUESTION in mail.text and "has a question for you" in mail.text
    assert "Your answer is needed" in str(mail.message["Subject"])
    page = open_page(mail.link)
    assert page.status_code == 200 and QUESTION in page.text
    # The form made from the model: a radio button per Literal choice, a checkbox, a list's text area.
    for part in ('value="formal"', 'type="checkbox"', 'name="edit.tags"', 'inputmode="decimal"', "bank statement"):
        assert part in page.text
    bad = answer_question(mail.link, {**VALID, "amount": "-5", "account": "DE89-typed"})
    assert bad.status_code == 400
    assert "amount" in bad.text and "greater than or equal to 0" in bad.text and "Nothing was decided" in bad.text
    assert 'value="DE89-typed"' in bad.text, "the answer as sent is shown back"
    wrong_choice = answer_question(mail.link, {**VALID, "draft": "poem"})
    assert wrong_choice.status_code == 400 and "not one of the choices" in wrong_choice.text
    status = stack.ingress.call("Approval", "q-1-a0", "status", None).json()
    assert status["approvals"][0]["state"] == "pending", "a bad answer decides nothing"
    good = answer_question(mail.link, VALID)
    assert good.status_code == 200, good.text
    result = stack.ingress.wait_invocation(invocation).json()
    assert result["outcome"] == "answered" and result["kind"] == "RefundTarget"
    assert result["answer"] == ANSWERED
    assert result["answered_by"] == ANSWERER and result["decision_source"] == "human"
    assert "Answer sent" in good.text and "DE89-3704" in good.text
    # A second, different answer through the same link (the form was still open in another tab).
    second = {**VALID, "account": "FR76-3000"}
    again = httpx.post(
        mail.link,
        data={"csrf": form_csrf_of(bad.text), "verdict": "approve", **{f"edit.{k}": v for k, v in second.items()}},
        headers={"Origin": stack.app.url},
        timeout=30,
    )
    assert again.status_code == 409 and "Already answered" in again.text, again.text
    record = stack.ingress.call("Approval", "q-1-a0", "status", None).json()["approvals"][0]
    assert record["kind"] == "question" and record["state"] == "approved" and record["edits"]["amount"] == 120.5
    [receipt] = wait_for_email(stack.outbox_dir, "q-1", kind="receipt")
    assert str(receipt.message["Subject"]).startswith("You answered:") and "Account: DE89-3704" in receipt.text
    assert "approval link" not in receipt.text and "action may" not in receipt.text
    assert approval_emails(stack.outbox_dir, "q-1", kind="outcome") == [], "the handler that asked is told, not mailed"


def form_csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no form on the page"
    return match.group(1)


def test_a_question_is_answered_through_the_api_checked_as_the_page_checks_it(stack: IsolatedStack) -> None:
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-7"})
    [mail] = wait_for_email(stack.outbox_dir, "q-7")
    view = httpx.get(api(stack, mail.link), timeout=30).json()
    assert view["kind"] == "question" and view["question"] == QUESTION and view["state"] == "pending"
    assert [f["name"] for f in view["fields"]] == ["account", "amount", "draft", "notify", "tags"]
    assert view["fields"][2]["choices"] == ["short", "long", "formal"]
    typed = {"account": "DE89-3704", "amount": 99.5, "draft": "long", "notify": False, "tags": ["a"]}
    bad = httpx.post(
        api(stack, mail.link, "/decision"),
        json={"verdict": "answer", "answer": {**typed, "amount": 9000}, "csrf": view["csrf"]},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/problem+json"
    assert "less than or equal to 5000" in bad.json()["detail"]
    assert httpx.get(api(stack, mail.link), timeout=30).json()["state"] == "pending", "a bad answer decides nothing"
    # A browser page of an allowed origin may call the API (CORS), and its preflight is answered.
    preflight = httpx.options(
        api(stack, mail.link, "/decision"),
        headers={
            "Origin": ADMIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
        timeout=30,
    )
    assert preflight.headers.get("access-control-allow-origin") == ADMIN
    good = httpx.post(
        api(stack, mail.link, "/decision"),
        json={"verdict": "answer", "answer": typed, "csrf": view["csrf"]},
        headers={"Origin": ADMIN},
        timeout=30,
    )
    assert good.status_code == 200, good.text
    assert good.headers["access-control-allow-origin"] == ADMIN
    assert good.json()["answer"] == typed, "typed as the handler gets it, not the form's text"
    result = stack.ingress.wait_invocation(invocation).json()
    assert result["outcome"] == "answered" and result["answer"] == typed
    assert httpx.get(api(stack, mail.link), timeout=30).json()["answer"] == typed
    twice = httpx.post(
        api(stack, mail.link, "/decision"),
        json={"verdict": "answer", "answer": {**typed, "account": "other-acct"}, "csrf": view["csrf"]},
        timeout=30,
    )
    assert twice.status_code == 409 and twice.json()["state"] == "approved"
    assert twice.json()["detail"].startswith(f"This question was answered by {ANSWERER}"), twice.json()


def test_a_waiting_question_is_listed_in_the_approvers_inbox_through_the_api_beside_an_action(
    stack: IsolatedStack,
) -> None:
    """The inbox token of the question's email lists, through the API, the question (kind "question")
    and an agent's action waiting for the same person (kind "action"), each with a link token the API
    reads; a question answered leaves the list."""
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-10"})
    [mail] = wait_for_email(stack.outbox_dir, "q-10")
    email = {"tool": "email_customer", "args": {"customer_id": "c_17", "subject": "Refund", "body": "On its way."}}
    stack.ingress.start_run("q-10-run", {"goal": "Tell c_17", "requester": "alice@example.com", "script": [email]})
    [action_mail] = wait_for_email(stack.outbox_dir, "q-10-run")
    assert action_mail.message["To"] == mail.message["To"] == ANSWERER
    [token] = set(INBOX.findall(mail.text))
    inbox = f"{stack.app.url}/api/v1/inbox/{token}"

    def both_listed() -> dict[str, dict[str, str]] | None:
        listed = {i["approval_id"]: i for i in httpx.get(inbox, timeout=30).json()["items"]}
        return listed if {"q-10-a0", "q-10-run-a0"} <= set(listed) else None

    listed = wait_until(both_listed, 20, "the question and the action in the inbox")
    assert (listed["q-10-a0"]["kind"], listed["q-10-run-a0"]["kind"]) == ("question", "action")
    assert listed["q-10-a0"]["summary"] and listed["q-10-a0"]["url"].endswith(listed["q-10-a0"]["token"])
    item = httpx.get(f"{stack.app.url}/api/v1/items/{listed['q-10-a0']['token']}", timeout=30).json()
    assert item["kind"] == "question" and item["question"] == QUESTION and item["csrf"]

    typed = {"account": "DE89-3704", "amount": 10, "draft": "short"}
    answered = httpx.post(
        f"{stack.app.url}/api/v1/items/{listed['q-10-a0']['token']}/decision",
        json={"verdict": "answer", "answer": typed, "csrf": item["csrf"]},
        timeout=30,
    )
    assert answered.status_code == 200, answered.text
    assert stack.ingress.wait_invocation(invocation).json()["outcome"] == "answered"
    wait_until(
        lambda: (
            {i["approval_id"] for i in httpx.get(inbox, timeout=30).json()["items"]} & {"q-10-a0", "q-10-run-a0"}
            == {"q-10-run-a0"}
        ),
        20,
        "the answered question to leave the inbox",
    )
    stack.ingress.call("AgentRun", "q-10-run", "cancel", {"reason": "test done"})


def test_a_question_is_reassigned_and_answered_by_the_new_person_and_another_is_cancelled(
    stack: IsolatedStack,
) -> None:
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-8"})
    [mail] = wait_for_email(stack.outbox_dir, "q-8")
    moved = stack.ingress.call("Approval", "q-8-a0", "reassign", {"approval_id": "q-8-a0", "to": "lead@example.com"})
    assert moved.status_code == 200 and moved.json()["accepted"], moved.text
    fresh = next(m for m in wait_for_email(stack.outbox_dir, "q-8", count=2) if m.message["To"] == "lead@example.com")
    assert open_page(mail.link).status_code == 410, "the first person's link no longer answers"
    assert answer_question(fresh.link, VALID).status_code == 200
    result = stack.ingress.wait_invocation(invocation).json()
    assert result["outcome"] == "answered" and result["answered_by"] == "lead@example.com"

    cancelled = stack.ingress.send("Asker", None, "ask", {"run_id": "q-9"})
    [other] = wait_for_email(stack.outbox_dir, "q-9")
    stack.ingress.call("Approval", "q-9-a0", "cancel", {"reason": "found it myself", "by": "alice"})
    ended = stack.ingress.wait_invocation(cancelled).json()
    assert ended["outcome"] == "cancelled" and ended["answer"] is None
    assert answer_status_after_close(other.link) in (200, 410)


def answer_status_after_close(link: str) -> int:
    """A closed question's link shows how it ended, with no form left to send."""
    page = open_page(link)
    assert 'name="edit.account"' not in page.text
    return page.status_code


def test_a_declined_question_returns_the_reason_and_no_answer(stack: IsolatedStack) -> None:
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-2"})
    [mail] = wait_for_email(stack.outbox_dir, "q-2")
    unexplained = answer_question(mail.link, {}, verdict="reject")
    assert unexplained.status_code == 400 and "Say why you decline" in unexplained.text
    assert answer_question(mail.link, {}, verdict="reject", reason="ask finance, not me").status_code == 200
    result = stack.ingress.wait_invocation(invocation).json()
    assert result["outcome"] == "declined" and result["answer"] is None
    assert result["reason"] == "ask finance, not me"


def test_at_the_deadline_a_question_ends_with_its_default_or_expires(stack: IsolatedStack) -> None:
    defaulted = stack.ingress.send("Asker", None, "ask", {"run_id": "q-3", "deadline_seconds": 2, "with_default": True})
    expired = stack.ingress.send("Asker", None, "ask", {"run_id": "q-4", "deadline_seconds": 2})
    [mail] = wait_for_email(stack.outbox_dir, "q-3")
    [late] = wait_for_email(stack.outbox_dir, "q-4")
    late_csrf = form_csrf(late.link)  # the link's own, as its page gave it while it waited
    page = open_page(mail.link)
    assert "the answer will be" in page.text and "store-credit" in page.text
    first = stack.ingress.wait_invocation(defaulted, timeout=30).json()
    assert first["outcome"] == "defaulted" and first["decision_source"] == "deadline_default"
    assert first["answer"]["account"] == "store-credit" and first["answered_by"] is None
    second = stack.ingress.wait_invocation(expired, timeout=30).json()
    assert second["outcome"] == "expired" and second["answer"] is None
    view = httpx.get(api(stack, late.link), timeout=30).json()
    assert view["state"] == "expired" and view["csrf"] is None and view["answer"] is None
    by_default = httpx.get(api(stack, mail.link), timeout=30).json()["answer"]
    assert by_default == first["answer"], "the default answered it, as the handler got it"
    body = {"verdict": "answer", "answer": {"account": "DE89-3704", "amount": 1, "draft": "short"}, "csrf": late_csrf}
    too_late = httpx.post(api(stack, late.link, "/decision"), json=body, timeout=30)
    assert too_late.status_code == 409 and too_late.headers["content-type"] == "application/problem+json"
    after = open_page(late.link)
    assert "expired" in after.text.lower() and 'name="edit.account"' not in after.text
    # The page's form, sent after the deadline from a tab opened before it (with that tab's CSRF value).
    for link, csrf, ended in (
        (late.link, late_csrf, "It expired unanswered."),
        (mail.link, form_csrf_of(page.text), "the default answer stands."),
    ):
        sent = answer_question(link, VALID, csrf=csrf)
        assert sent.status_code == 409, (sent.status_code, sent.text)
        assert "You sent an answer, but this question no longer takes one: that changed nothing." in sent.text
        assert ended in sent.text and not CSRF.search(sent.text), "it says how the question ended, with no form"
    record = stack.ingress.call("Approval", "q-4-a0", "status", None).json()["approvals"][0]
    assert record["state"] == "expired" and record["decided_by"] is None
    record = stack.ingress.call("Approval", "q-3-a0", "status", None).json()["approvals"][0]
    assert record["state"] == "approved" and record["edits"]["account"] == "store-credit"


APPROVAL_WORDS = (
    "pproval needed",
    "pproval still needed",
    "This approval",
    "did not decide",
    "will not run",
    "do not approve",
    "Both links",
    "Both buttons",
)
"""An approval's words in its reminder and escalation emails, which a question's must not use."""


def test_a_question_is_reminded_and_escalated_in_a_questions_words_and_those_links_answer_it(
    stack: IsolatedStack,
) -> None:
    reminded = stack.ingress.send(
        "Asker", None, "ask", {"run_id": "q-15", "with_default": True, "reminders_seconds": [1]}
    )
    escalated = stack.ingress.send(
        "Asker", None, "ask", {"run_id": "q-16", "escalate_after_seconds": 1, "escalate_to": ["lead@example.com"]}
    )
    [reminder] = wait_for_email(stack.outbox_dir, "q-15", kind="reminder")
    assert str(reminder.message["Subject"]).startswith("Reminder: your answer is needed by ")
    for part in (reminder.text, reminder.html):
        assert "Nobody has answered yet" in part and "the default answer (below) stands" in part
        assert "The default answer (it stands if nobody answers by the deadline)" in part and "store-credit" in part
        assert not any(w in part for w in APPROVAL_WORDS), "a question's words"
        assert QUESTION in part and "Answer the question" in part
    assert "Reminder 1: your answer is still needed" in reminder.text
    assert answer_question(reminder.link, VALID).status_code == 200
    result = stack.ingress.wait_invocation(reminded).json()
    assert result["outcome"] == "answered" and result["answer"] == ANSWERED and result["answered_by"] == ANSWERER

    [escalation] = wait_for_email(stack.outbox_dir, "q-16", kind="escalation")
    assert escalation.message["To"] == "lead@example.com"
    assert str(escalation.message["Subject"]) == f"Escalated to you: your answer is needed: Question: {QUESTION}"
    for part in (escalation.text, escalation.html):
        assert "This question was escalated to you: the person asked before you did not answer in time" in part
        assert f"It was first sent to {ANSWERER}" in part and "the question expires unanswered" in part
        assert "The default answer" not in part, "this question has none"
        assert not any(w in part for w in APPROVAL_WORDS), "a question's words"
    [first] = approval_emails(stack.outbox_dir, "q-16")
    assert open_page(first.link).status_code == 410, "the first person's link no longer answers"
    assert answer_question(escalation.link, VALID).status_code == 200
    result = stack.ingress.wait_invocation(escalated).json()
    assert result["outcome"] == "answered" and result["answered_by"] == "lead@example.com"


def test_channels_that_are_not_valid_or_not_set_up_are_refused_before_anything_is_sent(stack: IsolatedStack) -> None:
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-12", "channels": ["email", "pager"]})
    response = stack.ingress.wait_invocation(invocation)
    assert response.status_code == 400, response.text
    assert "channels" in response.text and "'email' or 'slack'" in response.text, response.text
    twice = stack.ingress.wait_invocation(
        stack.ingress.send("Asker", None, "ask", {"run_id": "q-13", "channels": ["slack", "slack"]})
    )
    assert twice.status_code == 400 and "each once" in twice.text, twice.text
    # This stack has no Slack settings: a question that names Slack would reach nobody there.
    slack = stack.ingress.wait_invocation(
        stack.ingress.send("Asker", None, "ask", {"run_id": "q-14", "channels": ["email", "slack"]})
    )
    assert slack.status_code == 400 and "SLACK_BOT_TOKEN is not set" in slack.text, slack.text
    assert approval_emails(stack.outbox_dir, "q-12") == approval_emails(stack.outbox_dir, "q-13") == []
    assert approval_emails(stack.outbox_dir, "q-14") == []


def test_a_model_outside_the_forms_subset_is_refused_before_anything_is_sent(stack: IsolatedStack) -> None:
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-5", "nested": True})
    response = stack.ingress.wait_invocation(invocation)
    assert response.status_code == 400, response.text
    assert "Nested.target" in response.text and "outside the form's subset" in response.text
    assert approval_emails(stack.outbox_dir, "q-5") == []


def test_kill9_of_the_handler_while_a_question_waits_then_answer(own_stack: IsolatedStack) -> None:
    stack = own_stack
    invocation = stack.ingress.send("Asker", None, "ask", {"run_id": "q-6"})
    [mail] = wait_for_email(stack.outbox_dir, "q-6")
    stack.app.kill9()
    stack.app.restart()
    form_after_restart(mail.link)
    response = answer_question(mail.link, VALID)
    assert response.status_code == 200, response.text
    result = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert result["outcome"] == "answered" and result["answer"]["account"] == "DE89-3704"
    assert len(approval_emails(stack.outbox_dir, "q-6")) == 1, "the question was asked once"


def asking(text: str, **args: object) -> dict[str, object]:
    """An agent's task whose scripted model asks a person one question with `ask_a_person`."""
    call = {"tool": "ask_a_person", "args": {"question": text, **args}, "why": "the order names two accounts"}
    return {"goal": "Refund order 1042", "requester": "alice@example.com", "script": [call]}


def test_an_agents_model_asks_with_ask_a_person_and_its_run_waits_lists_and_cancels_the_question(
    stack: IsolatedStack,
) -> None:
    """The model's `ask_a_person` call is a question to the tool's approver: the run lists it while it
    waits, the answer typed on its page is the call's result, and a cancel of a run ends its question."""
    stack.ingress.start_run("agent-q1", asking("Which IBAN did the customer give on the phone?"))
    [mail] = wait_for_email(stack.outbox_dir, "agent-q1")
    assert "Which IBAN did the customer give on the phone?" in mail.text and "has a question for you" in mail.text
    [waiting] = stack.ingress.status("agent-q1")["pending"]
    assert waiting["approval_id"] == "agent-q1-a0"
    refused = answer_question(mail.link, {"answer": ""})
    assert refused.status_code == 400 and "Nothing was decided" in refused.text
    assert answer_question(mail.link, {"answer": "DE89 3704 0044"}).status_code == 200
    result = stack.ingress.wait_output("agent-q1", timeout=60).json()
    [asked] = result["actions"]
    assert (asked["tool"], asked["outcome"]) == ("ask_a_person", "approved"), asked
    assert asked["result"] == {"answer": "DE89 3704 0044", "answered_by": ANSWERER}
    assert result["status"] == "completed"

    stack.ingress.start_run("agent-q2", asking("Refund to card or to store credit?", choices=["card", "credit"]))
    [mail] = wait_for_email(stack.outbox_dir, "agent-q2")
    assert 'value="card"' in open_page(mail.link).text, "the choices are the form's"
    cancelled = stack.ingress.call("AgentRun", "agent-q2", "cancel", {"reason": "customer called back"}).json()
    assert cancelled["accepted"] and cancelled["cancelled_approvals"] == ["agent-q2-a0"], cancelled
    result = stack.ingress.wait_output("agent-q2", timeout=60).json()
    assert result["status"] == "cancelled" and result["actions"][0]["outcome"] == "cancelled", result
    late = open_page(mail.link)
    assert "cancelled" in late.text.lower() and not CSRF.search(late.text), "a cancelled question takes no answer"
