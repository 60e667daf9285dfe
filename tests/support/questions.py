"""A user's own code for tests/integration/test_ask_person.py (and test_slack_channel.py), served
beside Countersign with COUNTERSIGN_SERVICES=tests.support.questions:served: a Service that asks a
person a question with a typed answer (`ask_person`, by email or in Slack, reminded and escalated
as the test asks) and returns what it got back, as JSON; and, for COUNTERSIGN_TOOLS, the demo tools
with `ask_a_person`, whose questions go to ANSWERER (for an agent's model to ask)."""

from __future__ import annotations

from typing import Any, Literal, cast

import restate
from pydantic import BaseModel, Field

from countersign import ToolPolicy, ask_a_person_tool, ask_person
from countersign.tools.policy import ChannelName
from handlers.demo.tools import DEMO_TOOLS

REQUESTER = "alice@example.com"
ANSWERER = "ops@example.com"
QUESTION = "Which account should the refund for order 1042 go to?"
ANSWERED = {"account": "DE89-3704", "amount": 120.5, "draft": "formal", "notify": True, "tags": ["vip", "repeat"]}
"""The answer the tests type on the form (120.50, Notify ticked, two tags), as the handler gets it back."""
VALID = {"account": "DE89-3704", "amount": "120.50", "draft": "formal", "notify": "on", "tags": "vip\nrepeat"}
"""That answer as the form sends it."""


class RefundTarget(BaseModel):
    account: str = Field(min_length=3, max_length=40, description="as it appears on the bank statement")
    amount: float = Field(ge=0, le=5000)
    draft: Literal["short", "long", "formal"]
    notify: bool = False
    tags: list[str] = Field(default_factory=list, max_length=3)


class Nested(BaseModel):
    target: RefundTarget


class Ask(BaseModel):
    run_id: str
    deadline_seconds: int = 3600
    with_default: bool = False
    nested: bool = False
    to: list[str] = Field(default_factory=lambda: [ANSWERER])
    channels: list[str] = Field(default_factory=lambda: ["email"])
    """Unchecked here: `ask_person` is what refuses a channel that is not one."""
    reminders_seconds: list[int] = Field(default_factory=list)
    escalate_after_seconds: int | None = None
    escalate_to: list[str] = Field(default_factory=list)


asker = restate.Service("Asker")


@asker.handler()
async def ask(ctx: restate.Context, ask: Ask) -> dict[str, Any]:
    if ask.nested:
        refused = await ask_person(
            ctx, question=QUESTION, answer_model=Nested, to=[ANSWERER], requester=REQUESTER, run_id=ask.run_id
        )
        return refused.model_dump(mode="json")
    default = RefundTarget(account="store-credit", amount=0, draft="short") if ask.with_default else None
    answer = await ask_person(
        ctx,
        question=QUESTION,
        answer_model=RefundTarget,
        to=ask.to,
        requester=REQUESTER,
        default=default,
        deadline_seconds=ask.deadline_seconds,
        reminders_seconds=ask.reminders_seconds,
        escalate_after_seconds=ask.escalate_after_seconds,
        escalate_to=ask.escalate_to,
        channels=cast("list[ChannelName]", ask.channels),
        run_id=ask.run_id,
        why="the customer changed banks",
    )
    # The answer is the caller's own model, typed: its fields are read as such.
    assert answer.answer is None or isinstance(answer.answer, RefundTarget)
    return {**answer.model_dump(mode="json"), "kind": type(answer.answer).__name__}


served = [asker]

TOOLS = [*DEMO_TOOLS, ask_a_person_tool(ToolPolicy(gated=True, approvers=(ANSWERER,), deadline_seconds=3600))]
