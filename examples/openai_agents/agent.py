"""A refund desk on the OpenAI Agents SDK, gated by Countersign, served beside it with
`COUNTERSIGN_SERVICES=examples.openai_agents.agent:services`.

`RefundAgent.run` runs an Agents SDK agent whose tools are the demo's `issue_refund` and
`email_customer`, made with `countersign_tool`: `email_customer` always interrupts the run
(`needs_approval=True`), `issue_refund` when the SDK's callable says so (over $100); a refund it lets
through is still gated by the tool's Countersign policy, inside the tool call. `run_gated` turns each
interruption into a Countersign approval (policy, email, page, deadline), applies the decision to the
run state and resumes, all inside this one durable handler. The model is the SDK's OpenAI provider:
`OPENAI_API_KEY` and `OPENAI_BASE_URL` point it at OpenAI or at any OpenAI-compatible server;
`AGENT_OPENAI_API` picks `chat_completions` (the default, which local servers speak) or `responses`.
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from typing import Any

import restate
from agents import Agent, RunConfig, RunContextWrapper
from agents.models.multi_provider import MultiProvider
from pydantic import BaseModel, Field

from countersign.integrations.openai_agents import countersign_tool, run_gated

INSTRUCTIONS = (
    "You handle refund requests for an online shop. Use issue_refund to refund an order and "
    "email_customer to tell the customer. A person approves refunds; if one is rejected, say why."
)


class Task(BaseModel):
    run_id: str = Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$", description="Places the approvals and effects")
    task: str = Field(min_length=1, max_length=4000, description="What the agent is asked to do")
    requester: str = Field(description="Who asks (an email address; told of the outcomes)")
    model: str | None = Field(default=None, max_length=100, description="Default: AGENT_MODEL, else gpt-4.1-mini")


class Answer(BaseModel):
    run_id: str
    answer: str


async def refund_over_100(context: RunContextWrapper[Any], args: dict[str, Any], call_id: str) -> bool:
    """The SDK's own `needs_approval` callable: a refund over $100 interrupts the run."""
    try:
        return Decimal(str(args.get("amount_usd", "0"))) > 100
    except InvalidOperation:
        return True  # let the gate say what is wrong with it


def _config() -> RunConfig:
    use_responses = os.environ.get("AGENT_OPENAI_API", "chat_completions") == "responses"
    return RunConfig(model_provider=MultiProvider(openai_use_responses=use_responses))


refund_agent = restate.Service("RefundAgent")


@refund_agent.handler()
async def run(ctx: restate.Context, task: Task) -> Answer:
    agent = Agent(
        name="refund desk",
        instructions=INSTRUCTIONS,
        model=task.model or os.environ.get("AGENT_MODEL", "gpt-4.1-mini"),
        tools=[
            countersign_tool("issue_refund", needs_approval=refund_over_100),
            countersign_tool("email_customer"),
        ],
    )
    result = await run_gated(
        ctx,
        agent,
        task.task,
        requester=task.requester,
        run_id=task.run_id,
        why="asked of the refund desk",
        run_config=_config(),
    )
    return Answer(run_id=task.run_id, answer=str(result.final_output))


services = [refund_agent]
