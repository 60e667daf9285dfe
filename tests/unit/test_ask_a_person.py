"""`ask_a_person`, the tool a model asks a person with: its arguments, how the gate's one path routes
its calls (a question when gated, never bounded by a plan; nobody asked when not), and its Slack message."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError
from support.records import approval_record

import countersign.tools as tools_module
from countersign import ToolPolicy, ask_a_person_tool
from countersign.approval import routing
from countersign.approval.plan import ApprovedPlan
from countersign.approval.question import form_of
from countersign.approval.question_calls import _tool_answer_model
from countersign.channels import slack
from countersign.contract import Outcome, Plan
from countersign.tools.asking import NOBODY_ASKED, AskAPerson
from countersign.tools.registry import EffectContext, Registry

ASKED = "ops@example.com"
QUESTION = {"question": "Card or store credit?", "choices": ["card", "credit"]}


@pytest.fixture()
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's tools for one test: `ask_a_person`, gated, asking ASKED."""
    registry = Registry([ask_a_person_tool(ToolPolicy(gated=True, approvers=(ASKED,)))])
    monkeypatch.setattr(tools_module, "_process", registry)
    yield


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"question": "  "}, "the question must say what to answer"),
        ({"question": "Which?", "choices": ["card"]}, "at least two choices"),
        ({"question": "Which?", "choices": ["card", "card"]}, "choices must be distinct"),
        ({"question": "Which?", "choices": ["card", ""]}, "at least 1 character"),
        ({"question": "Which?", "urgent": True}, "Extra inputs are not permitted"),
    ],
)
def test_a_question_the_form_could_not_ask_is_refused(args: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        AskAPerson.model_validate(args)


def test_the_form_is_a_choice_among_the_models_choices_or_else_text() -> None:
    [choice] = form_of(_tool_answer_model(AskAPerson.model_validate(QUESTION)))
    assert (choice.kind, choice.choices, choice.label) == ("choice", ["card", "credit"], "Your answer")
    [text] = form_of(_tool_answer_model(AskAPerson(question="Which IBAN?")))
    assert text.kind == "text" and text.bounds == {"min_length": 1, "max_length": 2000}


def test_a_gated_question_is_asked_even_where_a_plan_would_refuse_a_call_outside_it(gated: None) -> None:
    answer = routing.ask("ask_a_person", QUESTION, "alice@example.com", "default")
    assert answer.error is None and answer.opening is not None
    assert answer.verdict is not None and answer.verdict.policy.approvers == (ASKED,)
    plan = ApprovedPlan(
        verdict=Outcome.APPROVED,
        plan=Plan.model_validate({"steps": [{"tool": "ask_a_person", "args": QUESTION}]}),
        approval_id="r-a0",
        on_deviation="refuse",
    )
    assert routing.route(answer, "ask_a_person") == routing.Route("question")
    assert routing.route(answer, "ask_a_person", plan) == routing.Route("question"), "a plan bounds actions only"
    bad = routing.ask("ask_a_person", {"question": "Which?", "choices": ["x"]}, "alice@example.com", "default")
    assert routing.route(bad, "ask_a_person").kind == "invalid"


def test_a_question_its_policy_lets_go_unasked_tells_the_model_nobody_was_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tool = ask_a_person_tool(ToolPolicy(gated=False))
    monkeypatch.setattr(tools_module, "_process", Registry([tool]))
    answer = routing.ask("ask_a_person", QUESTION, "alice@example.com", "default")
    assert routing.route(answer, "ask_a_person") == routing.Route("autonomous")
    told = tool.effect(AskAPerson.model_validate(QUESTION), EffectContext(idempotency_key="r/0", run_id="r"))
    assert told == {"answer": None, "asked": False, "note": NOBODY_ASKED}


def test_a_questions_slack_message_links_to_its_page_and_offers_no_approve_button() -> None:
    fields = [f.model_dump(mode="json") for f in form_of(_tool_answer_model(AskAPerson.model_validate(QUESTION)))]
    record = approval_record(
        approval_id="run-7-a0",
        run_id="run-7",
        index=0,
        tool="question",
        kind="question",
        args={"question": "Card or store credit? <!channel>", "fields": fields, "default": None},
        why="The customer wants the refund today.",
        approvers=[ASKED],
        active_slots=[0],
    )
    text, blocks = slack.request_blocks(record, 0, "", "reminder", (None, None), "https://approve.example/approvals/t")
    assert text.startswith("Reminder: a question for you: Card or store credit?")
    [actions] = [b for b in blocks if b["type"] == "actions"]
    answer, decline = actions["elements"]
    assert answer == {
        "type": "button",
        "action_id": slack.ANSWER_ACTION,
        "style": "primary",
        "text": {"type": "plain_text", "text": "Answer…", "emoji": False},
        "url": "https://approve.example/approvals/t",
    }
    assert decline["action_id"] == slack.REJECT_ACTION and "Decline" in decline["text"]["text"]
    shown = str(blocks)
    assert "Your answer (one of: card, credit)" in shown and slack.APPROVE_ACTION not in shown
    assert "Why: The customer wants the refund today." in shown, "the reason the asker gave, as the email shows it"
    _, unexplained = slack.request_blocks(record.model_copy(update={"why": ""}), 0, "", "request", (None, None), "u")
    assert "Why:" not in str(unexplained)
