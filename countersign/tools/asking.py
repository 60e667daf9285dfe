"""`ask_a_person`: the tool an agent's model calls to ask a person a question when it is unsure.

Guarantee: it is a tool like any other: loaded by name (COUNTERSIGN_TOOLS or `create_app(tools=...)`),
offered to the model with the other loaded tools, its policy (who is asked, when, the deadline,
reminders, escalation, channels) given in code or by the policy file, and every call answered and
routed by the gate's one path. Where that path asks a person, the call is asked as a question with
a typed answer (`countersign.approval.question_calls.ask_with_tool`) and the person's answer is the
call's result; where it asks nobody (a policy that lets the call run alone), the result says that
nobody was asked, so the model never mistakes silence for an answer. A question is not an action: a
run's approved plan neither bounds nor refuses it (countersign.approval.routing).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from countersign.contract import clipped
from countersign.tools.policy import ToolPolicy
from countersign.tools.registry import SUMMARY_LIMIT, EffectContext, Tool

ASK_A_PERSON = "ask_a_person"
MAX_QUESTION = 2000
MAX_CHOICES = 20
MAX_CHOICE = 200

_DESCRIPTION = (
    "Ask a person a question and wait for their answer, when you are unsure and the answer is not in "
    "your tools: a fact, a choice, a correction. Give `choices` when the answer is one of a few options. "
    "The answer may take hours. Do not ask for approval of an action: propose the action itself."
)

NOBODY_ASKED = (
    "No person was asked: this call needed nobody's answer (its policy lets it run alone). "
    "Decide yourself, or say what you would need to know."
)


class AskAPerson(BaseModel):
    """The arguments of `ask_a_person`: the question and, optionally, the answers to choose from."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=MAX_QUESTION, description="The question, in full sentences.")
    choices: list[Annotated[str, Field(min_length=1, max_length=MAX_CHOICE)]] = Field(
        default_factory=list,
        max_length=MAX_CHOICES,
        description="The answers the person may pick from; empty for a free-text answer.",
    )

    @field_validator("question")
    @classmethod
    def _says_something(cls, question: str) -> str:
        if not question.strip():
            raise ValueError("the question must say what to answer")
        return question

    @field_validator("choices")
    @classmethod
    def _distinct(cls, choices: list[str]) -> list[str]:
        if len(set(choices)) != len(choices):
            raise ValueError("choices must be distinct")
        if len(choices) == 1:
            raise ValueError("give at least two choices, or none for a free-text answer")
        return choices


def _nobody_asked(args: AskAPerson, ctx: EffectContext) -> dict[str, Any]:
    return {"answer": None, "asked": False, "note": NOBODY_ASKED}


def _summary(args: AskAPerson) -> str:
    return clipped(f"Question: {args.question}", SUMMARY_LIMIT)


def ask_a_person_tool(policy: ToolPolicy, *, description: str = _DESCRIPTION) -> Tool:
    """The `ask_a_person` tool with `policy` (give it `gated=True` and the people to ask as its
    approvers). Load it with your other tools; the policy file may override its policy under
    `[tools.ask_a_person]`. The first person to answer decides; one may decline with a reason."""
    return Tool(
        name=ASK_A_PERSON,
        description=description,
        args_model=AskAPerson,
        effect=_nobody_asked,
        policy=policy,
        summarize=_summary,
    )


def is_question_tool(tool: Tool) -> bool:
    """Whether a call of `tool` is asked as a question (its arguments are `AskAPerson`'s)."""
    return tool.args_model is AskAPerson
