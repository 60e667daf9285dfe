"""A refund desk on Google ADK, gated by Countersign, served beside it with
`COUNTERSIGN_SERVICES=examples.adk_agent.agent:services`.

`AdkRefunds` (a Virtual Object keyed by the customer, whose ADK sessions it keeps) runs an `LlmAgent`
whose tools are the demo's `issue_refund` and `email_customer` (Countersign tools, through
`countersign_tools`) and `refund_rules`, a plain ADK function tool that Countersign leaves alone. Its
plugins are `RestatePlugin` (each model reply journaled, the calls of a reply one at a time) and then
`CountersignPlugin`, which sends each call of a Countersign tool through the gate (policy, email, page,
deadline, the effect once under `<run_id>/<n>`), all inside this one durable handler; the sessions
live in `RestateSessionService`. The model is `task.model`, else `ADK_AGENT_MODEL`, else
`gemini-2.5-flash` (GOOGLE_API_KEY); `openai:<name>` is ADK's OpenAI model, which `OPENAI_API_KEY` and
`OPENAI_BASE_URL` point at OpenAI or any OpenAI-compatible server (Chat Completions).
"""

from __future__ import annotations

import os
from typing import Any

import restate
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.labs.openai import OpenAILlm
from google.adk.models.base_llm import BaseLlm
from google.adk.runners import Runner
from google.genai import types
from pydantic import BaseModel, Field
from restate.ext.adk import RestatePlugin, RestateSessionService

from countersign.integrations.adk import CountersignPlugin, countersign_actions, countersign_tools, run_gated

MODEL_SETTING = "ADK_AGENT_MODEL"

INSTRUCTIONS = (
    "You handle refund requests for an online shop. Check refund_rules, refund an order with issue_refund "
    "and tell the customer with email_customer. A person approves refunds; if one is rejected, say why."
)


def refund_rules(order_id: int) -> dict[str, str]:
    """The shop's refund rules for an order (a plain ADK tool: no approval)."""
    return {"rules": f"Order {order_id}: damaged or late parcels are refunded in full."}


class Task(BaseModel):
    run_id: str = Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$", description="Places the approvals, effects, session")
    task: str = Field(min_length=1, max_length=4000, description="What the agent is asked to do")
    requester: str = Field(description="Who asks (an email address; told of the outcomes)")
    model: str | None = Field(default=None, max_length=100, description="An ADK model name, or openai:<name>")


class Answer(BaseModel):
    run_id: str
    answer: str
    actions: list[dict[str, Any]] = Field(default_factory=list)
    """The gate's record of each Countersign call: outcome, arguments run, who approved, why."""


def model(name: str) -> str | BaseLlm:
    return OpenAILlm(model=name.removeprefix("openai:")) if name.startswith("openai:") else name


refund_desk = restate.VirtualObject("AdkRefunds")


@refund_desk.handler()
async def run(ctx: restate.ObjectContext, task: Task) -> Answer:
    agent = LlmAgent(
        name="refund_desk",
        model=model(task.model or os.environ.get(MODEL_SETTING, "gemini-2.5-flash")),
        instruction=INSTRUCTIONS,
        tools=[*countersign_tools(["issue_refund", "email_customer"]), refund_rules],
    )
    # RestatePlugin first: it journals the model's replies and lets the calls of one reply through one
    # at a time; the gate after it sees each call in turn.
    app = App(name="refund_desk", root_agent=agent, plugins=[RestatePlugin(), CountersignPlugin()])
    runner = Runner(app=app, session_service=RestateSessionService())
    answer = ""
    message = types.Content(role="user", parts=[types.Part.from_text(text=task.task)])
    async for event in run_gated(
        runner,
        requester=task.requester,
        run_id=task.run_id,
        user_id=ctx.key(),
        session_id=task.run_id,
        new_message=message,
    ):
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(p.text or "" for p in event.content.parts)
    actions = [a.model_dump(mode="json") for a in countersign_actions(ctx, task.run_id)]
    return Answer(run_id=task.run_id, answer=answer, actions=actions)


services = [refund_desk]
