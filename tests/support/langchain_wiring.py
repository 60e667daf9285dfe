"""LangChain agents wired the wrong way, for tests/integration/test_langchain.py (served beside the example with
COUNTERSIGN_SERVICES=...,tests.support.langchain_wiring:served): the gate before RestateMiddleware,
the gate without it, and Countersign tools without the gate. Each must fail the run, not hang or run
an effect around the gate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import restate
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain.chat_models import init_chat_model
from pydantic import BaseModel
from restate.ext.langchain import RestateMiddleware

from countersign.integrations.langchain import CountersignMiddleware, countersign_tools


class Wiring(BaseModel):
    model: str
    order: list[str]
    """The middleware, in order: "restate", "countersign"."""


wiring = restate.Service("LangChainWiring")


@wiring.handler()
async def run(ctx: restate.Context, task: Wiring) -> str:
    kinds: dict[str, Callable[[], AgentMiddleware[Any, Any]]] = {
        "restate": RestateMiddleware,
        "countersign": lambda: CountersignMiddleware(requester="alice@example.com"),
    }
    middleware: list[AgentMiddleware[Any, Any]] = [kinds[name]() for name in task.order]
    agent = create_agent(init_chat_model(task.model), tools=countersign_tools(["issue_refund"]), middleware=middleware)
    state = await agent.ainvoke({"messages": [{"role": "user", "content": "Refund the broken orders."}]})
    return str(state["messages"][-1].text)


served = [wiring]
