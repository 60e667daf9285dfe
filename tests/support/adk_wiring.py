"""Google ADK apps wired the wrong way, for tests/integration/test_adk.py (served beside the example with
COUNTERSIGN_SERVICES=...,tests.support.adk_wiring:served): the gate before RestatePlugin, the gate
without it, and Countersign tools without the gate. Each must fail the run, not hang or run an effect
around the gate."""

from __future__ import annotations

from collections.abc import Callable

import restate
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.labs.openai import OpenAILlm
from google.adk.plugins import BasePlugin
from google.adk.runners import Runner
from google.genai import types
from pydantic import BaseModel
from restate.ext.adk import RestatePlugin, RestateSessionService

from countersign.integrations.adk import CountersignPlugin, countersign_tools, run_gated


class Wiring(BaseModel):
    model: str
    order: list[str]
    """The plugins, in order: "restate", "countersign"."""


wiring = restate.VirtualObject("AdkWiring")


@wiring.handler()
async def run(ctx: restate.ObjectContext, task: Wiring) -> str:
    kinds: dict[str, Callable[[], BasePlugin]] = {
        "restate": RestatePlugin,
        "countersign": CountersignPlugin,
    }
    agent = LlmAgent(
        name="miswired",
        model=OpenAILlm(model=task.model.removeprefix("openai:")),
        tools=[*countersign_tools(["issue_refund"])],
    )
    app = App(name="miswired", root_agent=agent, plugins=[kinds[name]() for name in task.order])
    runner = Runner(app=app, session_service=RestateSessionService())
    message = types.Content(role="user", parts=[types.Part.from_text(text="Refund the broken orders.")])
    run = run_gated(runner, requester="alice@example.com", user_id=ctx.key(), session_id="s", new_message=message)
    texts = [e.content.parts[0].text or "" async for e in run if e.content and e.content.parts]
    return " ".join(texts)


served = [wiring]
