"""A help desk's Pydantic AI agent wrapped in `RestateAgent`, its Countersign tools gated through
`CountersignToolset`: the Workflow `PydanticSupport` runs it with the `Countersign` capability, and the
Service `PydanticByHand` approves the deferred calls itself, without it (they must not run). The model
is a `FunctionModel` scripted by the prompt: first the calls the prompt lists, then every result it saw.

Served with `COUNTERSIGN_SERVICES=helpdesk.agent:served` (tests/support/user_code on the app's
PYTHONPATH) by tests/integration/test_pydantic_ai.py."""

import json
from typing import Any

import restate
from pydantic import BaseModel
from pydantic_ai import Agent, AgentRunResult, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from restate.ext.pydantic import RestateAgent

from countersign.integrations.pydantic_ai import Countersign, CountersignToolset


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First turn: the calls the prompt lists. Then: report every tool result it saw, as JSON."""
    [prompt] = [
        p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, UserPromptPart)
    ]
    task = json.loads(str(prompt))
    seen = [
        {"tool": p.tool_name, "content": p.content}
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    if not seen:
        calls = [ToolCallPart(c["tool"], c["args"], tool_call_id=f"call-{i}") for i, c in enumerate(task["calls"])]
        return ModelResponse(parts=[TextPart(task["why"]), *calls])
    return ModelResponse(parts=[TextPart(json.dumps(seen))])


inner = Agent(FunctionModel(script), toolsets=[CountersignToolset(["lookup_order", "issue_refund", "email_customer"])])


@inner.tool_plain
def note(text: str) -> dict[str, str]:
    """A plain Pydantic AI tool, not Countersign's: RestateAgent journals it (auto_wrap_tools)."""
    return {"noted": text}


agent = RestateAgent(inner, auto_wrap_tools=True)


class Task(BaseModel):
    calls: list[dict[str, Any]]
    why: str = "the parcel arrived broken"


support = restate.Workflow("PydanticSupport")


@support.main()
async def run(ctx: restate.WorkflowContext, task: Task) -> dict[str, Any]:
    gate = Countersign(requester="alice@example.com", run_id=ctx.key())
    result = await agent.run(task.model_dump_json(), capabilities=[gate])
    return {"seen": json.loads(result.output), "actions": [o.model_dump(mode="json") for o in gate.actions]}


by_hand = restate.Service("PydanticByHand")


@by_hand.handler()
async def approve_all(ctx: restate.Context, task: Task) -> str:
    """Approves the deferred calls itself, without the Countersign capability: they must not run."""
    first: AgentRunResult[str | DeferredToolRequests]
    first = await agent.run(task.model_dump_json(), output_type=[str, DeferredToolRequests])
    assert isinstance(first.output, DeferredToolRequests)
    results = first.output.build_results(approve_all=True)
    second = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
    return str(second.output)


served = [support, by_hand]
