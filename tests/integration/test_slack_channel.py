"""Slack as an approval channel beside email, against the real slack_sdk and a local fake Slack API.

The tests share one fake Slack and one restate-server and handlers app per protocol (conftest's
`module_stack`), whose policy sends `issue_refund` approvals and `ask_a_person` questions through
email and Slack, and which serves a user's Service that asks with `ask_person`; clicks are
interactivity payloads signed as Slack signs them. Each test looks only at what is its own: the
messages of its run's approvals (by approval id, in their metadata), the modals opened from them and
the notes Slack shows to Slack user ids of its own (`people`). Tests that kill the app or need
another policy or Slack directory start a stack of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.slack_server import FakeSlack, Message, click, running, signed, slack_env
from fakes.slack_server import submit as submission
from support.approver import answer_question, approval_emails, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import IsolatedStack, StackFactory, wait_until
from support.questions import ANSWERED, QUESTION, VALID

from countersign import Registry, SettingsError, load_tools
from countersign.runtime import startup
from countersign.settings import Settings
from countersign.tools import DEMO_TOOLS

FINANCE, FINANCE_ID, EVE_ID = "finance@example.com", "UFIN", "UEVE"
POLICY = '[tools.issue_refund]\nchannels = ["email", "slack"]\n'
QUESTIONS = '[tools.ask_a_person]\napprovers = ["finance@example.com"]\nchannels = ["email", "slack"]\n'


@pytest.fixture(scope="module")
def fake(deployment_protocol: str) -> Iterator[FakeSlack]:
    """One fake Slack per module and protocol, started before the stack whose settings point at it."""
    with running(FakeSlack({FINANCE_ID: FINANCE})) as slack:
        yield slack


@pytest.fixture(scope="module")
def module_stack_app_env(fake: FakeSlack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The app's settings (conftest's `module_stack`): Slack at the fake; refunds and questions
    (the demo tools with `ask_a_person`) asked by email and in Slack; a user's Service whose
    `ask_person` questions go through the channels each test asks for."""
    policy = tmp_path_factory.mktemp("slack") / "policy.toml"
    policy.write_text(POLICY + QUESTIONS)
    return {
        **slack_env(fake),
        "APPROVALS_POLICY_FILE": str(policy),
        "COUNTERSIGN_TOOLS": "tests.support.questions:TOOLS",
        "COUNTERSIGN_SERVICES": "tests.support.questions:served",
    }


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test runs under run ids (and orders) of its own."""
    return module_stack


@dataclass(frozen=True)
class People:
    """Slack user ids of the test's own: what Slack tells them (ephemeral notes) is this test's."""

    finance: str
    """finance@example.com, the approver (the DM itself goes to FINANCE_ID, the first id of that email)."""
    eve: str
    """Someone who is not the approver."""


@pytest.fixture()
def people(fake: FakeSlack, run_id: str) -> People:
    found = People(finance=f"UFIN-{run_id}", eve=f"UEVE-{run_id}")
    fake.add_user(found.finance, FINANCE)
    fake.add_user(found.eve, f"eve-{run_id}@example.com")
    return found


def of_run(run_id: str) -> str:
    """What the Slack messages of the run's approvals carry: their idempotency keys name the approval
    ids `<run id>-a<n>` (for the fake's `about=` look-ups)."""
    return f"/{run_id}-a"


def refund(order: int, amount: str = "800.00") -> dict[str, Any]:
    return {
        "goal": f"Refund order {order} for ${amount}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "late"}}],
    }


def interact(stack: IsolatedStack, payload: dict[str, Any], **signing: Any) -> httpx.Response:
    body, headers = signed(payload, **signing)
    return httpx.post(f"{stack.app.url}/slack/interactions", content=body, headers=headers, timeout=10)


def texts(blocks: Any) -> str:
    """Every text a person reads in Slack blocks, one per line."""
    if isinstance(blocks, dict):
        own = [blocks["text"]] if isinstance(blocks.get("text"), str) else []
        return "\n".join(own + [texts(v) for k, v in blocks.items() if k != "text" or not isinstance(v, str)])
    if isinstance(blocks, list):
        return "\n".join(texts(b) for b in blocks)
    return ""


def open_modal(stack: IsolatedStack, fake: FakeSlack, message: Message, user: str, action: str) -> dict[str, Any]:
    opened = len(fake.views_for(message))
    assert interact(stack, click(message, user, action)).status_code == 200
    views = wait_until(lambda: v if len(v := fake.views_for(message)) > opened else None, 10, "the modal to open")
    view: dict[str, Any] = views[-1]["view"]
    return view


def pending(stack: IsolatedStack, run_id: str) -> list[Any]:
    found: list[Any] = stack.ingress.status(run_id)["pending"]
    return found


def decided_entries(stack: IsolatedStack, approval: str) -> list[dict[str, Any]]:
    entries = stack.ingress.call("ApprovalAudit", approval, "entries", None).json()["entries"]
    return [e for e in entries if e["kind"] == "decided"]


def test_approve_in_slack_after_refusing_forged_stale_and_wrong_user_clicks(
    stack: IsolatedStack, fake: FakeSlack, people: People, run_id: str
) -> None:
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run(run_id, refund(order))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    [message] = fake.wait_message(about=of_run(run_id))
    assert message.channel == f"D{FINANCE_ID}", "a DM to the approver, found by their email"
    shown = texts(message.blocks)
    assert "issue_refund" in shown and '"amount_usd": "800.00"' in shown and f'"order_id": {order}' in shown
    assert "Deadline" in shown and [b["action_id"] for b in message.buttons] == [
        "countersign_approve",
        "countersign_reject",
    ]

    # Forged or replayed payloads: 401, no modal, nothing decided.
    assert interact(stack, click(message, people.finance), secret="not-the-secret").status_code == 401
    assert interact(stack, click(message, people.finance), at=time.time() - 600).status_code == 401
    assert fake.views_for(message) == []
    # A forged submission straight at the ingress: the workflow verifies the signature itself.
    forged_view = {
        "callback_id": "countersign_decide",
        "private_metadata": json.dumps({"a": f"{run_id}-a0", "r": 1, "s": 0, "v": "approve"}),
    }
    body, headers = signed(submission(forged_view, people.finance), secret="not-the-secret")
    interaction = {
        "body": body,
        "timestamp": headers["x-slack-request-timestamp"],
        "signature": headers["x-slack-signature"],
    }
    assert stack.ingress.call("Approval", f"{run_id}-a0", "slack_decide", interaction).status_code == 401
    assert interact(stack, submission(forged_view, people.finance), secret="not-the-secret").status_code == 401
    assert len(pending(stack, run_id)) == 1

    # Someone who is not the approver: refused in Slack, nothing decided.
    view = open_modal(stack, fake, message, people.eve, "countersign_approve")
    answer = interact(stack, submission(view, people.eve, view_id="V-eve"))
    assert answer.status_code == 200 and answer.json() == {"response_action": "clear"}
    told = wait_until(lambda: fake.told(people.eve) or None, 30, "eve to be told")
    assert "nothing was decided" in told[0]["text"] and FINANCE in told[0]["text"]
    assert len(pending(stack, run_id)) == 1 and decided_entries(stack, f"{run_id}-a0") == []

    # Rejecting needs a reason, said in the modal itself.
    view = open_modal(stack, fake, message, people.finance, "countersign_reject")
    refused = interact(stack, submission(view, people.finance, view_id="V-reject"))
    assert refused.json()["response_action"] == "errors"

    view = open_modal(stack, fake, message, people.finance, "countersign_approve")
    assert interact(stack, submission(view, people.finance, reason="ok", view_id="V-fin")).status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert result["actions"][0]["outcome"] == "approved"
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    # The same submission again (Slack or a person retrying) records nothing new.
    interact(stack, submission(view, people.finance, reason="ok", view_id="V-fin"))
    interact(stack, submission(view, people.finance, reason="again", view_id="V-fin2"))
    wait_until(lambda: len(fake.told(people.finance)) >= 2, 30, "the replies")
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    [decided] = decided_entries(stack, f"{run_id}-a0")
    assert decided["actor"] == FINANCE and decided["details"]["client"] == f"slack:{people.finance}"

    updated = wait_until(lambda: message.updates or None, 30, "the Slack message to be updated")
    assert f"Approved by {FINANCE} (decided in Slack)" in texts(updated[-1]["blocks"])
    assert message.buttons == [], "a decided message has no buttons"
    page = open_page(mail.link)
    assert f"decided in Slack by {FINANCE}" in page.text


def test_a_malformed_timestamp_is_refused_as_a_forgery_and_an_odd_payload_is_a_400(
    stack: IsolatedStack, run_id: str
) -> None:
    """Anyone can send these: a missing, non-numeric or overlong timestamp (slack_sdk does
    `int(timestamp)`) or a non-ASCII signature is a 401 like a forged signature, on the web route and
    at the ingress (where it must be a terminal refusal, not a step retried until the invocation
    pauses); a signed payload of an unexpected shape is a 400 that says so. Never a 500."""
    log_from = stack.app.log_path.stat().st_size
    url = f"{stack.app.url}/slack/interactions"
    form = {b"content-type": b"application/x-www-form-urlencoded"}
    body, headers = signed({"type": "block_actions"})
    now = headers["x-slack-request-timestamp"].encode()
    timestamps: list[dict[bytes, bytes]] = [  # bytes: a header value need not be ASCII
        {},
        {b"x-slack-request-timestamp": b""},
        {b"x-slack-request-timestamp": b"not-a-number"},
        {b"x-slack-request-timestamp": b"9" * 400},
        {b"x-slack-request-timestamp": now, b"x-slack-signature": b"v0=\xe9"},
    ]
    for sent in timestamps:
        reply = httpx.post(url, content="payload=x", headers={**form, **sent}, timeout=10)
        assert reply.status_code == 401, (sent, reply.status_code, reply.text)
        assert "signature or timestamp was not accepted" in reply.json()["error"]

    button = json.dumps({"a": f"{run_id}-a0", "r": 1, "s": 0})
    odd = {
        "a view that is text": {"type": "view_submission", "user": {"id": FINANCE_ID}, "view": "x"},
        "a user that is text": submission(
            {"callback_id": "countersign_decide", "private_metadata": button.replace("}", ', "v": "approve"}')},
            "x",
        )
        | {"user": "x"},
        "a container that is text": {
            "type": "block_actions",
            "container": "x",
            "actions": [{"action_id": "countersign_approve", "value": button}],
        },
    }
    for what, payload in odd.items():
        reply = interact(stack, payload)
        assert reply.status_code == 400, (what, reply.status_code, reply.text)
        assert "not a Slack interaction this service can read" in reply.json()["error"], what

    # At the ingress: refused at once, as a forged signature is. A retried step would hold the
    # call past this deadline (the invocation backs off, then pauses), so an answer means terminal.
    interaction = {"body": body, "timestamp": "", "signature": "v0=" + "0" * 64}
    answer = stack.ingress.client.post(f"/Approval/{run_id}-a0/slack_decide", json=interaction, timeout=10)
    assert answer.status_code == 401 and "not accepted" in answer.json()["message"], answer.text
    with stack.app.log_path.open("rb") as log:
        log.seek(log_from)
        assert b"Traceback" not in log.read(), "what the app logged during this test"


def test_slack_down_does_not_hold_the_email_and_its_message_is_updated_once_up(
    stack: IsolatedStack, fake: FakeSlack, run_id: str
) -> None:
    mine = of_run(run_id)  # Slack fails for this run's messages only: the other tests share the fake
    # Both faults before the run: the 503s must be in place before the retry after Retry-After.
    fake.fail("chat.postMessage", 429, retry_after="2", times=1, about=mine)
    fake.fail("chat.postMessage", 503, about=mine)
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run(run_id, refund(order))
    wait_until(lambda: fake.calls("chat.postMessage", mine) or None, 30, "the first Slack post (rate limited)")
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(mail.link, "approve").status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert result["actions"][0]["outcome"] == "approved"
    assert fake.messages_about(mine) == [], "decided by email while Slack was still failing"
    posts = wait_until(lambda: p if len(p := fake.calls("chat.postMessage", mine)) >= 2 else None, 30, "a retry")
    assert posts[0].status == 429 and posts[1].at - posts[0].at >= 1.5, "the retry waited for Retry-After"

    fake.heal(mine)
    [message] = fake.wait_message(timeout=90, about=mine)
    updated = wait_until(lambda: message.updates or None, 60, "the Slack message to be updated")
    assert f"Approved by {FINANCE} (decided by email)" in texts(updated[-1]["blocks"])
    assert message.buttons == []
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    assert len(fake.messages_about(mine)) == 1, "posted once"


@pytest.mark.slow
def test_kill9_between_a_slack_click_and_its_recording_decides_once(
    isolated_stack: StackFactory,
    module_stack_app_env: dict[str, str],
    fake: FakeSlack,
    people: People,
    run_id: str,
) -> None:
    """On a stack of its own (the module's settings and a crash point): it kills its app."""
    stack = isolated_stack(app_env={**module_stack_app_env, "COUNTERSIGN_FAULT": "crash-before-slack-decision"})
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run(run_id, refund(order))
    [message] = fake.wait_message(about=of_run(run_id))
    view = open_modal(stack, fake, message, people.finance, "countersign_approve")
    # The process that answers is the one the fault kills: its answer may be lost; the record counts.
    with contextlib.suppress(httpx.HTTPError):
        interact(stack, submission(view, people.finance, view_id="V-kill"))
    wait_until(lambda: not stack.app.alive(), 30, "the fault to kill the handler")

    stack.app.env.pop("COUNTERSIGN_FAULT")
    stack.app.restart()
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert result["actions"][0]["outcome"] == "approved"
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    assert len(decided_entries(stack, f"{run_id}-a0")) == 1


def test_slack_in_a_policy_without_its_settings_stops_the_start(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    tools = Registry(load_tools([DEMO_TOOLS]), policy)
    keys = {"approvals_signing_keys": "k1:" + "s" * 32, "countersign_env": "dev"}
    with pytest.raises(SettingsError) as caught:
        startup.require_slack(Settings(**keys), tools)  # type: ignore[arg-type]
    assert str(caught.value).startswith("SLACK_BOT_TOKEN is not set") and "\n" not in str(caught.value)
    assert caught.value.setting == "SLACK_BOT_TOKEN"
    with pytest.raises(SettingsError, match=r"^SLACK_SIGNING_SECRET"):
        startup.require_slack(Settings(**keys, slack_bot_token="xoxb-1"), tools)  # type: ignore[arg-type]
    startup.require_slack(Settings(**keys, slack_bot_token="xoxb-1", slack_signing_secret="s"), tools)  # type: ignore[arg-type]
    startup.require_slack(Settings(**keys), Registry(load_tools([DEMO_TOOLS]), None))  # type: ignore[arg-type]


def test_a_reminder_an_expiry_and_a_cancel_rewrite_the_slack_message_in_place(
    isolated_stack: StackFactory, tmp_path: Path, fake: FakeSlack, run_id: str
) -> None:
    """On a stack of its own: its policy reminds after 2 s and ends the wait after 5 s."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY + "reminders_seconds = [2]\ndeadline_seconds = 5\n")
    stack = isolated_stack(app_env={**slack_env(fake), "APPROVALS_POLICY_FILE": str(policy)})
    stack.ingress.start_run(run_id, refund(new_order(stack.db_path, 100000)))
    [message] = fake.wait_message(about=of_run(run_id))
    reminded = wait_until(lambda: message.updates or None, 30, "the reminder")
    assert "Reminder 1" in texts(reminded[0]["blocks"]) and len(message.buttons) == 2, "still decides"
    wait_until(lambda: len(message.updates) >= 2 or None, 30, "the expiry")
    assert "Expired" in texts(message.current["blocks"]) and message.buttons == []
    assert stack.ingress.wait_output(run_id, timeout=60).json()["actions"][0]["outcome"] == "expired"
    assert len(fake.messages_about(of_run(run_id))) == 1, "a reminder rewrites the message, it posts no new one"

    cancelled = f"{run_id}-c"
    stack.ingress.start_run(cancelled, refund(new_order(stack.db_path, 100000)))
    [second] = fake.wait_message(about=of_run(cancelled))
    assert len(fake.messages_about(of_run(run_id))) == 1
    stack.ingress.call("AgentRun", cancelled, "cancel", {"reason": "customer withdrew"})
    wait_until(lambda: "Cancelled" in texts(second.current["blocks"]) or None, 30, "the cancel")
    assert "customer withdrew" in texts(second.current["blocks"]) and second.buttons == []


def test_an_approver_reached_only_through_slack_who_cannot_be_found_ends_the_approval_undeliverable(
    isolated_stack: StackFactory, tmp_path: Path, run_id: str
) -> None:
    with running(FakeSlack({EVE_ID: "eve@example.com"})) as nobody_in_finance:
        policy = tmp_path / "policy.toml"
        policy.write_text('[tools.issue_refund]\nchannels = ["slack"]\n')
        stack = isolated_stack(app_env={**slack_env(nobody_in_finance), "APPROVALS_POLICY_FILE": str(policy)})
        order = new_order(stack.db_path, 100000)
        stack.ingress.start_run(run_id, refund(order))
        result = stack.ingress.wait_output(run_id, timeout=60).json()
        assert result["actions"][0]["outcome"] == "undeliverable"
        assert "users_not_found" in result["actions"][0]["reason"]
        assert refunds_for(stack.db_path, run_id) == []
        assert list(stack.outbox_dir.glob("approval-request_*.eml")) == [], "Slack only: no approval email"


def test_an_escalation_retires_the_first_message_and_the_next_approver_decides_in_slack(
    isolated_stack: StackFactory, tmp_path: Path, run_id: str
) -> None:
    lead, lead_id = "finance-lead@example.com", "ULEAD"
    with running(FakeSlack({FINANCE_ID: FINANCE, lead_id: lead})) as fake:
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY + f'escalate_after_seconds = 2\nescalate_to = ["{lead}"]\n')
        stack = isolated_stack(app_env={**slack_env(fake), "APPROVALS_POLICY_FILE": str(policy)})
        order = new_order(stack.db_path, 100000)
        stack.ingress.start_run(run_id, refund(order))
        [first, second] = fake.wait_message(2)
        assert second.channel == f"D{lead_id}" and len(second.buttons) == 2
        wait_until(lambda: first.updates or None, 30, "the first message to be retired")
        assert first.buttons == [] and f"Asked again, of {lead}" in texts(first.current["blocks"])

        # A click on the first message as it was (a client that had not refreshed) decides nothing.
        as_posted = dataclasses.replace(first, updates=[])
        stale = open_modal(stack, fake, as_posted, FINANCE_ID, "countersign_approve")
        interact(stack, submission(stale, FINANCE_ID, view_id="V-old"))
        told = wait_until(lambda: fake.told(FINANCE_ID) or None, 30, "the refusal")
        assert "escalated" in told[0]["text"] and "changed nothing" in told[0]["text"]

        view = open_modal(stack, fake, second, lead_id, "countersign_approve")
        interact(stack, submission(view, lead_id, view_id="V-lead"))
        result = stack.ingress.wait_output(run_id, timeout=60).json()
        assert result["actions"][0]["outcome"] == "approved" and result["actions"][0]["approved_by"] == [lead]
        assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
        wait_until(lambda: second.updates or None, 30, "the second message to say who decided")
        assert f"Approved by {lead} (decided in Slack)" in texts(second.current["blocks"])


def test_a_high_stakes_approval_in_slack_needs_the_typed_confirmation(
    stack: IsolatedStack, fake: FakeSlack, people: People, run_id: str
) -> None:
    order = new_order(stack.db_path, 150000)
    stack.ingress.start_run(run_id, refund(order, "1200.00"))  # high stakes above $1000
    [message] = fake.wait_message(about=of_run(run_id))
    view = open_modal(stack, fake, message, people.finance, "countersign_approve")
    [field] = [b for b in view["blocks"] if b.get("block_id") == "confirm"]
    assert json.loads(view["private_metadata"])["c"] == "amount usd"
    assert field["label"]["text"] == "High stakes: type the amount usd (1200.00) to confirm"

    interact(stack, submission(view, people.finance, confirm="wrong", view_id="V-wrong"))
    told = wait_until(lambda: fake.told(people.finance) or None, 30, "the refusal")
    assert "high-stakes" in told[0]["text"] and len(pending(stack, run_id)) == 1

    interact(stack, submission(view, people.finance, confirm="$1,200.00", view_id="V-right"))
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert result["actions"][0]["outcome"] == "approved"
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 120000)]


def test_a_batch_reaches_slack_one_message_per_item_and_each_is_decided_there(
    stack: IsolatedStack, fake: FakeSlack, people: People, run_id: str
) -> None:
    first, second = new_order(stack.db_path, 100000), new_order(stack.db_path, 100000)
    task = refund(first)
    task["script"][0]["also"] = [
        {"tool": "issue_refund", "args": {"order_id": second, "amount_usd": "700.00", "reason": "late"}}
    ]
    stack.ingress.start_run(run_id, task)
    [batch_mail] = wait_for_email(stack.outbox_dir, run_id, kind="batch")
    messages = fake.wait_message(2, about=of_run(run_id))
    assert len(messages) == 2, "one Slack message per item of the batch, beside the one batch email"
    shown = [texts(m.blocks) for m in messages]
    assert any(f'"order_id": {first}' in s for s in shown) and any(f'"order_id": {second}' in s for s in shown)
    assert refunds_for(stack.db_path, run_id) == [], "nothing runs before the whole turn is decided"
    for n, message in enumerate(messages):
        view = open_modal(stack, fake, message, people.finance, "countersign_approve")
        assert interact(stack, submission(view, people.finance, reason="ok", view_id=f"V-{n}")).status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert [a["outcome"] for a in result["actions"]] == ["approved", "approved"]
    assert sorted(r[1] for r in refunds_for(stack.db_path, run_id)) == sorted([first, second])
    assert batch_mail.link, "the batch email went out as well"


def test_a_standing_approval_given_in_the_slack_modal_covers_the_next_similar_call(
    isolated_stack: StackFactory, tmp_path: Path, fake: FakeSlack, people: People, run_id: str
) -> None:
    """On a stack of its own: its policy offers standing approvals, which the module's does not."""
    first, second = run_id, f"{run_id}-next"
    policy = tmp_path / "policy.toml"
    policy.write_text(
        POLICY + '[tools.issue_refund.grants]\nmax_seconds = 14400\nmax_uses = 1\nat_most = ["amount_usd"]\n'
    )
    stack = isolated_stack(app_env={**slack_env(fake), "APPROVALS_POLICY_FILE": str(policy)})
    order = new_order(stack.db_path, 300000)
    stack.ingress.start_run(first, refund(order))
    [message] = fake.wait_message(about=of_run(first))
    view = open_modal(stack, fake, message, people.finance, "countersign_approve")
    [field] = [b for b in view["blocks"] if b.get("block_id") == "grant"]
    assert "amount_usd ≤ 800.00" in field["hint"]["text"] and "at most 1 call" in field["hint"]["text"]
    options = [o["value"] for o in field["element"]["options"]]
    assert options == ["none", "3600", "14400"] and field["element"]["initial_option"]["value"] == "none"

    # A forged duration (above the policy's maximum) decides nothing, and Slack tells the person why.
    interact(stack, submission(view, people.finance, grant="999999", view_id="V-forged"))
    told = wait_until(lambda: fake.told(people.finance) or None, 30, "the refusal")
    assert "standing approval lasts" in told[0]["text"] and len(pending(stack, first)) == 1

    interact(stack, submission(view, people.finance, grant="3600", view_id="V-grant"))
    assert stack.ingress.wait_output(first, timeout=60).json()["actions"][0]["outcome"] == "approved"
    stack.ingress.start_run(second, refund(order, "650.00"))
    [action] = stack.ingress.wait_output(second, timeout=60).json()["actions"]
    assert action["outcome"] == "granted" and action["grant_id"] == f"g-{first}-a0"
    assert action["approved_by"] == [FINANCE]
    assert refunds_for(stack.db_path, second) == [(f"{second}/0", order, 65000)]


def test_a_question_in_slack_links_to_its_page_and_is_declined_there(
    stack: IsolatedStack, fake: FakeSlack, people: People, run_id: str
) -> None:
    """An agent's `ask_a_person` question reaches Slack as the question, what the form asks, a link to
    its page (answered and checked there, as from the email) and a Decline button; declining in
    Slack ends the question with the reason, and the model's call is rejected."""
    call = {"tool": "ask_a_person", "args": {"question": "Card or store credit?", "choices": ["card", "credit"]}}
    stack.ingress.start_run(run_id, {"goal": "Refund order 7", "requester": "alice@example.com", "script": [call]})
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    [message] = fake.wait_message(about=of_run(run_id))
    shown = texts(message.blocks)
    assert "A question for you" in shown and "Card or store credit?" in shown
    assert "Your answer (one of: card, credit)" in shown
    answer_button, decline = message.buttons
    assert (answer_button["action_id"], decline["action_id"]) == ("countersign_answer", "countersign_reject")
    assert answer_button["url"] == mail.link.split("?", 1)[0], "the question's own signed page"
    assert 'value="card"' in open_page(answer_button["url"]).text

    view = open_modal(stack, fake, message, people.finance, "countersign_reject")
    declined = interact(stack, submission(view, people.finance, reason="ask the customer", view_id="V-q"))
    assert declined.status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    [asked] = result["actions"]
    assert (asked["outcome"], asked["reason"], asked["result"]) == ("rejected", "ask the customer", None), asked
    updated = wait_until(lambda: message.updates or None, 30, "the Slack message to be updated")
    closed = texts(updated[-1]["blocks"])
    assert f"Declined by {FINANCE} (decided in Slack)" in closed and "Reason: ask the customer" in closed
    assert "Nothing ran" not in closed, "a question is declined, not an action rejected"


def test_an_ask_person_question_in_slack_only_is_answered_on_the_page_its_message_links_to(
    stack: IsolatedStack, fake: FakeSlack, run_id: str
) -> None:
    """`ask_person(channels=["slack"])` from a user's Service: the question reaches the person in
    Slack only, with a link to its signed page and no Approve button; the person follows the link,
    answers there, and the handler gets the typed answer; a reminder and then who answered rewrite
    the message, in a question's words."""
    asked = {"run_id": run_id, "to": [FINANCE], "channels": ["slack"], "reminders_seconds": [1]}
    invocation = stack.ingress.send("Asker", None, "ask", asked)
    [message] = fake.wait_message(about=of_run(run_id))
    assert message.channel == f"D{FINANCE_ID}", "a DM to the person asked, found by their email"
    shown = texts(message.blocks)
    assert "A question for you" in shown and QUESTION in shown and "To answer: Account (text)" in shown
    assert [b["action_id"] for b in message.buttons] == ["countersign_answer", "countersign_reject"]
    assert approval_emails(stack.outbox_dir, run_id) == [], "Slack only: no email (it goes out before the post)"

    reminded = wait_until(lambda: message.updates or None, 30, "the reminder")
    assert "Reminder 1: still waiting for an answer." in texts(reminded[0]["blocks"])
    link = message.buttons[0]["url"]
    page = open_page(link)
    assert page.status_code == 200 and QUESTION in page.text and 'name="edit.account"' in page.text
    assert answer_question(link, VALID).status_code == 200
    result = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert (result["outcome"], result["kind"], result["answer"]) == ("answered", "RefundTarget", ANSWERED), result
    assert result["answered_by"] == FINANCE and result["decision_source"] == "human"
    answered = lambda: f"Answered by {FINANCE}" in texts(message.current["blocks"])  # noqa: E731
    wait_until(answered, 30, "the Slack message to say who answered")
    assert message.buttons == []
