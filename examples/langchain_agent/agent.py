"""A refund desk on LangChain (`create_agent`), gated by Countersign, served beside it with
`COUNTERSIGN_SERVICES=examples.langchain_agent.agent:services`.

`LangChainRefunds.run` runs a LangChain agent whose tools are the demo's `issue_refund` and
`email_customer` (Countersign tools, through `countersign_tools`) and `refund_rules`, a plain
LangChain tool that Countersign leaves alone. Its middleware is `RestateMiddleware` (each model reply
journaled, the calls of a reply one at a time) and then `CountersignMiddleware`, whose `interrupt_on`
reads like LangChain's own human-in-the-loop middleware; each call of a Countersign tool goes through
the gate (policy, email, page, deadline, the effect once under `<run_id>/<n>`), all inside this one
durable handler. The model is LangChain's `init_chat_model`: `task.model`, else `LANGCHAIN_AGENT_MODEL`,
else `openai:gpt-4.1-mini` (`OPENAI_API_KEY`; `OPENAI_BASE_URL` points it at any OpenAI-compatible
server; a model name of its own, e.g. `openai:llama3.1`, is asked over Chat Completions).
"""

from __future__ import annotations

import os
from typing import Any

import restate
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain.chat_models import init_chat_model
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field
from restate.ext.langchain import RestateMiddleware

from countersign.integrations.langchain import (
    CountersignContext,
    CountersignMiddleware,
    countersign_actions,
    countersign_tools,
)

MODEL_SETTING = "LANGCHAIN_AGENT_MODEL"

INSTRUCTIONS = (
    "You handle refund requests for an online shop. Check refund_rules, refund an order with issue_refund "
    "and tell the customer with email_customer. A person approves refunds; if one is rejected, say why."
)


@tool
def refund_rules(order_id: int) -> str:
    """The shop's refund rules for an order (a plain LangChain tool: no approval)."""
    return f"Order {order_id}: damaged or late parcels are refunded in full."


class Task(BaseModel):
    run_id: str = Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$", description="Places the approvals and effects")
    task: str = Field(min_length=1, max_length=4000, description="What the agent is asked to do")
    requester: str = Field(description="Who asks (an email address; told of the outcomes)")
    model: str | None = Field(default=None, max_length=100, description="A LangChain model string")


class Answer(BaseModel):
    run_id: str
    answer: str
    actions: list[dict[str, Any]] = Field(default_factory=list)
    """The gate's record of each Countersign call: outcome, arguments run, who approved, why."""


refund_desk = restate.Service("LangChainRefunds")


@refund_desk.handler()
async def run(ctx: restate.Context, task: Task) -> Answer:
    name = task.model or os.environ.get(MODEL_SETTING, "openai:gpt-4.1-mini")
    # RestateMiddleware first: it journals the model's replies and lets the calls of one reply through
    # one at a time; the gate inside it sees each call in turn.
    middleware: list[AgentMiddleware[Any, Any]] = [
        RestateMiddleware(),
        CountersignMiddleware(
            interrupt_on={
                "issue_refund": True,
                "email_customer": {"description": "The refund desk writes to the customer."},
            }
        ),
    ]
    agent = create_agent(
        init_chat_model(name),  # builds a client; nothing is called until the journaled model step
        tools=[*countersign_tools(["issue_refund", "email_customer"]), refund_rules],
        system_prompt=INSTRUCTIONS,
        context_schema=CountersignContext,
        middleware=middleware,
    )
    who = CountersignContext(requester=task.requester, run_id=task.run_id)
    state = await agent.ainvoke({"messages": [HumanMessage(task.task)]}, context=who)
    actions = [a.model_dump(mode="json") for a in countersign_actions(state["messages"])]
    return Answer(run_id=task.run_id, answer=state["messages"][-1].text, actions=actions)


services = [refund_desk]
