"""The Slack channel's pure parts: what a message shows, the modal, the policy fields, the wording."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fakes.slack_server import SIGNING_SECRET, signed
from fakes.slack_server import submit as submission
from pydantic import SecretStr, ValidationError

from countersign.channels import slack
from countersign.channels.slack_interactions import NotOurs, authentic, payload_of
from countersign.channels.slack_interactions import submission as read_submission
from countersign.contract import ApprovalRecord, Fact
from countersign.settings import Settings
from countersign.tools.policy import ToolPolicy, policy_version
from countersign.web.wording import closed_state


def record(**changes: object) -> ApprovalRecord:
    base = ApprovalRecord(
        approval_id="run-7-a1",
        run_id="run-7",
        tenant="default",
        index=1,
        tool="issue_refund",
        args={"order_id": 1042, "amount_usd": "612.40", "reason": "*bold* <!channel> ``` \u202etxet"},
        digest="ab12cd34ef56" + "0" * 52,
        summary="Refund $612.40 to order 1042 <@U123>",
        why="The customer sent photos of the damage.",
        policy="amount_usd > 500",
        requester="alice@example.com",
        approvers=["finance@example.com"],
        active_slots=[0],
        nonces=["nonce-1"],
        requested_at=1_767_225_600.0,
        round_started_at=1_767_225_600.0,
        deadline=1_767_225_600.0 + 2 * 86400,
        context=[Fact(label="Order total", value="$612.40")],
    )
    return base.model_copy(update=changes)


def text_objects(blocks: Any) -> list[dict[str, Any]]:
    if isinstance(blocks, dict):
        own = [blocks] if blocks.get("type") in ("plain_text", "mrkdwn", "text") else []
        return own + [t for v in blocks.values() for t in text_objects(v)]
    if isinstance(blocks, list):
        return [t for b in blocks for t in text_objects(b)]
    return []


def test_the_message_shows_the_exact_arguments_as_literal_text_and_never_formats_them() -> None:
    text, blocks = slack.request_blocks(record(), 0, "Refund order 1042", "request", (None, None))
    objects = text_objects(blocks)
    assert objects and all(o["type"] in ("plain_text", "text") for o in objects), "no mrkdwn anywhere"
    [pre] = [b for b in blocks if b["type"] == "rich_text"]
    shown = pre["elements"][0]["elements"][0]["text"]
    assert json.loads(shown.replace("[U+202E]", "\u202e")) == record().args, "the arguments, exactly"
    assert "\u202e" not in json.dumps(blocks, ensure_ascii=False) and "[U+202E]" in shown
    assert "Order total: $612.40" in json.dumps(blocks) and "Deadline 2026-01-03 00:00 UTC" in json.dumps(blocks)
    assert "<@U123>" in text  # shown as typed: plain_text cannot mention anyone
    value = json.loads(blocks[-1]["elements"][0]["value"])
    assert value == {"a": "run-7-a1", "r": 1, "s": 0}, "the buttons carry no token"


def test_a_decided_message_loses_its_buttons_and_a_reminder_keeps_them() -> None:
    text, blocks = slack.request_blocks(record(), 0, "", "request", (None, None))
    posted = slack.Posted(key="k", round=1, slot=0, approver="f@x.io", channel="D1", ts="1.0", text=text, blocks=blocks)
    reminded = slack.with_note(posted, "Reminder 1", keep_buttons=True)
    assert reminded[-1]["type"] == "actions" and reminded[-2]["text"]["text"] == "Reminder 1"
    closed = slack.with_note(posted.model_copy(update={"blocks": reminded}), "Approved", keep_buttons=False)
    assert all(b["type"] != "actions" for b in closed) and [
        b["text"]["text"] for b in closed if b.get("block_id") == "status"
    ] == ["Approved"]


def test_the_modal_asks_for_the_typed_confirmation_of_a_high_stakes_approval() -> None:
    state = slack.ModalState(a="run-7-a1", r=1, s=0, v="approve", c="amount usd")
    view = slack.modal(state, "Refund", "612.40")
    assert [b.get("block_id") for b in view["blocks"] if b["type"] == "input"] == ["reason", "confirm"]
    reject = slack.modal(state.model_copy(update={"v": "reject"}), "Refund", "612.40")
    [reason] = [b for b in reject["blocks"] if b["type"] == "input"]
    assert reason["optional"] is False, "rejecting needs a reason"


def test_a_question_is_declined_in_its_modal_and_its_message_says_answered_or_declined() -> None:
    """A question's Decline… button opens a modal that declines (a reason is still required); its
    message ends "Answered by" or "Declined by", never "Nothing ran", as nothing was to run."""
    view = slack.modal(slack.ModalState(a="q-1-a0", r=1, s=0, v="reject", q=True), "Card or credit?", None)
    assert (view["title"]["text"], view["submit"]["text"]) == ("Decline", "Decline")
    [reason] = [b for b in view["blocks"] if b["type"] == "input"]
    assert reason["optional"] is False
    assert slack.modal(slack.ModalState(a="a-1", r=1, s=0, v="reject"), "x", None)["title"]["text"] == "Reject"
    assert slack.final_line("rejected", "f@x.io", "slack", None, "ask the customer", question=True) == (
        "Declined by f@x.io (decided in Slack). Reason: ask the customer"
    )
    assert slack.final_line("approved", "f@x.io", "email", None, None, question=True) == (
        "Answered by f@x.io (decided by email)."
    )
    assert "Nothing ran" not in slack.final_line("expired", None, None, None, None, question=True)
    cancelled = slack.final_line("cancelled", None, None, None, "asked by mistake", question=True)
    assert cancelled == "Cancelled: it takes no answer now. Reason: asked by mistake"
    assert slack.final_line("approved", None, None, None, None, question=True, source="deadline_default") == (
        "Nobody answered before the deadline: the default answer stands."
    )


def test_an_approval_the_deadline_let_through_says_nobody_approved_it() -> None:
    line = slack.final_line(
        "approved", None, None, None, "the deadline passed; policy allows it", source="deadline_default"
    )
    assert line == "Nobody decided before the deadline: the policy let it run."
    assert slack.final_line("approved", "f@x.io", "slack", None, None) == "Approved by f@x.io (decided in Slack)."


def test_signed_payloads_are_verified_and_read() -> None:
    settings = Settings(slack_signing_secret=SecretStr(SIGNING_SECRET))
    view = slack.modal(slack.ModalState(a="a-1", r=2, s=0, v="approve", ch="D1", ts="9.0"), "x", None)
    body, headers = signed(submission(view, "U1", reason=" fine ", view_id="V9"))
    ts, sig = headers["x-slack-request-timestamp"], headers["x-slack-signature"]
    assert authentic(body, ts, sig, settings)
    assert not authentic(body + "x", ts, sig, settings)
    stale_body, stale = signed({"type": "x"}, at=time.time() - 600)
    assert not authentic(stale_body, stale["x-slack-request-timestamp"], stale["x-slack-signature"], settings)
    read = read_submission(payload_of(body), 1.0)
    assert (read.approval_id, read.round, read.slot, read.verdict, read.reason, read.channel) == (
        "a-1",
        2,
        0,
        "approve",
        "fine",
        "D1",
    )
    with pytest.raises(NotOurs):
        read_submission({"type": "view_submission", "view": {"callback_id": "other"}}, 1.0)


@pytest.mark.parametrize(
    ("timestamp", "signature"),
    [("", None), ("soon", None), ("1.5e9", None), ("9" * 400, None), ("9" * 5000, None), (None, "v0=\u00e9")],
    ids=["empty", "word", "float", "overflows-float", "too-many-digits", "non-ascii-signature"],
)
def test_a_malformed_timestamp_or_signature_is_not_authentic_and_raises_nothing(
    timestamp: str | None, signature: str | None
) -> None:
    settings = Settings(slack_signing_secret=SecretStr(SIGNING_SECRET))
    body, headers = signed({"type": "x"})
    sent_at = headers["x-slack-request-timestamp"] if timestamp is None else timestamp
    assert not authentic(body, sent_at, signature or headers["x-slack-signature"], settings)


@pytest.mark.parametrize(
    "changes",
    [{"view": "x"}, {"view": ["x"]}, {"user": "x"}, {"view": {"state": "x"}}, {"view": {"state": {"values": 1}}}],
    ids=["view", "view-list", "user", "state", "values"],
)
def test_a_submission_of_an_unexpected_shape_is_a_value_error(changes: dict[str, Any]) -> None:
    view = slack.modal(slack.ModalState(a="a-1", r=2, s=0, v="approve"), "x", None)
    payload = submission(view, "U1", reason="fine")
    for key, value in changes.items():
        payload[key] = {**payload[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ValueError) as caught:
        read_submission(payload, 1.0)
    assert not isinstance(caught.value, NotOurs) and "is not an object" in str(caught.value)


def test_policy_channels() -> None:
    policy = ToolPolicy(gated=True, approvers=("a@x.io", "b@x.io"), approver_channels={"B@x.io": ("slack",)})
    assert policy.channels_for("a@x.io") == ("email",) and policy.channels_for("b@x.io") == ("slack",)
    assert policy.uses_channel("slack") and not ToolPolicy().uses_channel("slack")
    for bad in (
        {"channels": ()},
        {"channels": ("email", "email")},
        {"channels": ("fax",)},
        {"approver_channels": {"x": ("email",)}},
    ):
        with pytest.raises(ValidationError):
            ToolPolicy(**bad)
    # Delivery is not gating: a policy that names no channel keeps the version it had.
    plain = ToolPolicy(gated=True, approvers=("a@x.io",))
    assert policy_version("t", plain) == policy_version("t", plain.model_copy(update={"channels": ("email",)}))
    assert policy_version("t", plain) != policy_version("t", plain.model_copy(update={"channels": ("slack",)}))


def test_the_page_says_a_decision_was_made_in_slack() -> None:
    view = closed_state("approved", "finance@example.com", 1_767_225_600.0, None, None, "slack")
    assert view.headline == "This action was approved at 2026-01-01 00:00 UTC: decided in Slack by finance@example.com."
    assert "Slack" not in closed_state("approved", "finance@example.com", None, None, None, "email").headline
    assert slack.final_line("rejected", "f@x.io", "slack", None, "too much") == (
        "Rejected by f@x.io (decided in Slack). Nothing ran. Reason: too much"
    )
