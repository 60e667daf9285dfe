"""A user's own code for tests/integration/test_gate_path.py, served beside Countersign with
COUNTERSIGN_SERVICES=tests.support.gate_path:served and COUNTERSIGN_TOOLS=tests.support.gate_path:TOOLS.

The ways a user reaches the gate, each after `request_plan_approval` when the case has a plan (the
approved plan handed to the adapter where it takes the run's facts): `GatePath.call` calls `gated_call`
(`GatePath.request`, `request_approval`); `PydanticGatePath.run` runs a Pydantic AI agent (RestateAgent,
with `CountersignToolset` and the `Countersign` capability); `OpenAIGatePath.run` runs an OpenAI Agents
SDK agent (`countersign_tool`, `run_gated`); `LangChainGatePath.run` runs a LangChain `create_agent`
agent (`countersign_tools`, RestateMiddleware then CountersignMiddleware); `AdkGatePath.run` (a Virtual
Object, for RestateSessionService) runs a Google ADK `LlmAgent` (`countersign_tools`, RestatePlugin then
CountersignPlugin, `run_gated`). The agents' models are the frameworks' own OpenAI clients, named after
the run (OPENAI_BASE_URL points them at the test's fake server, which scripts each run).
"""

from __future__ import annotations

from typing import Any, Literal

import restate
from agents import Agent as SdkAgent
from agents import RunConfig
from agents.models.multi_provider import MultiProvider
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.labs.openai import OpenAILlm
from google.adk.runners import Runner
from google.genai import types
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain.chat_models import init_chat_model
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models import infer_model
from restate.ext.adk import RestatePlugin, RestateSessionService
from restate.ext.langchain import RestateMiddleware
from restate.ext.pydantic import RestateAgent

from countersign import (
    ApprovedPlan,
    Tool,
    ToolPolicy,
    ask_a_person_tool,
    gated_call,
    request_approval,
    request_plan_approval,
)
from countersign.integrations import adk
from countersign.integrations.langchain import (
    CountersignContext,
    CountersignMiddleware,
    countersign_actions,
    countersign_tools,
)
from countersign.integrations.openai_agents import countersign_actions as openai_actions
from countersign.integrations.openai_agents import countersign_tool, run_gated
from countersign.integrations.pydantic_ai import Countersign, CountersignToolset
from handlers.demo.tools import DEMO_TOOLS, IssueRefundArgs, issue_refund

REQUESTER = "alice@example.com"
WHY = "the parcel arrived broken"
GOAL = "Refund the damaged order"
OFFERED = ["issue_refund", "refund_unowned", "ask_a_person"]
"""The tools the agents offer their models."""


class Case(BaseModel):
    run_id: str
    tool: str
    args: dict[str, Any]
    plan: dict[str, Any] | None = None
    on_deviation: Literal["ask", "refuse"] | None = None


path = restate.Service("GatePath")


@path.handler()
async def call(ctx: restate.Context, case: Case) -> dict[str, Any]:
    plan, index = None, 0
    if case.plan is not None:
        plan = await request_plan_approval(
            ctx,
            plan=case.plan,
            requester=REQUESTER,
            run_id=case.run_id,
            index=0,
            why="the damaged orders",
            on_deviation=case.on_deviation,
        )
        index = 1
    record = await gated_call(
        ctx, tool=case.tool, args=case.args, requester=REQUESTER, run_id=case.run_id, index=index, plan=plan, why=WHY
    )
    return record.model_dump(mode="json")


@path.handler()
async def request(ctx: restate.Context, case: Case) -> dict[str, Any]:
    """`request_approval` of the case's call: decided only, nothing runs."""
    outcome = await request_approval(
        ctx, tool=case.tool, args=case.args, requester=REQUESTER, run_id=case.run_id, index=0, why=WHY
    )
    return outcome.model_dump(mode="json")


class AgentTask(BaseModel):
    run_id: str
    """Places the approvals and effects, and names the model (the fake server's script for the run)."""
    plan: dict[str, Any] | None = None
    on_deviation: Literal["ask", "refuse"] | None = None


async def approved_plan(ctx: restate.Context, task: AgentTask) -> ApprovedPlan | None:
    """The task's plan, approved before the agent runs (placed by the gate's own count: index 0, so
    the agent's call is index 1), or None when the task has none."""
    if task.plan is None:
        return None
    return await request_plan_approval(
        ctx,
        plan=task.plan,
        requester=REQUESTER,
        run_id=task.run_id,
        why="the damaged orders",
        on_deviation=task.on_deviation,
    )


pydantic_path = restate.Service("PydanticGatePath")


@pydantic_path.handler(name="run")
async def pydantic_run(ctx: restate.Context, task: AgentTask) -> dict[str, Any]:
    inner = Agent(infer_model(f"openai-chat:{task.run_id}"), toolsets=[CountersignToolset(OFFERED)])
    gate = Countersign(requester=REQUESTER, run_id=task.run_id, plan=await approved_plan(ctx, task))
    result = await RestateAgent(inner).run(GOAL, capabilities=[gate])
    return {"actions": [o.model_dump(mode="json") for o in gate.actions], "answer": str(result.output)}


openai_path = restate.Service("OpenAIGatePath")


@openai_path.handler(name="run")
async def openai_run(ctx: restate.Context, task: AgentTask) -> dict[str, Any]:
    agent = SdkAgent(name="gate path", model=task.run_id, tools=[countersign_tool(name) for name in OFFERED])
    config = RunConfig(model_provider=MultiProvider(openai_use_responses=False))
    plan = await approved_plan(ctx, task)
    result = await run_gated(
        ctx, agent, GOAL, requester=REQUESTER, run_id=task.run_id, why=WHY, plan=plan, run_config=config
    )
    actions = [a.model_dump(mode="json") for a in openai_actions(ctx, task.run_id)]
    return {"actions": actions, "answer": str(result.final_output)}


langchain_path = restate.Service("LangChainGatePath")


@langchain_path.handler(name="run")
async def langchain_run(ctx: restate.Context, task: AgentTask) -> dict[str, Any]:
    middleware: list[AgentMiddleware[Any, Any]] = [RestateMiddleware(), CountersignMiddleware()]
    agent = create_agent(
        init_chat_model(f"openai:{task.run_id}"),
        tools=countersign_tools(OFFERED),
        middleware=middleware,
        context_schema=CountersignContext,
    )
    who = CountersignContext(requester=REQUESTER, run_id=task.run_id, goal=GOAL, plan=await approved_plan(ctx, task))
    state = await agent.ainvoke({"messages": [{"role": "user", "content": GOAL}]}, context=who)
    actions = [a.model_dump(mode="json") for a in countersign_actions(state["messages"])]
    return {"actions": actions, "answer": state["messages"][-1].text}


adk_path = restate.VirtualObject("AdkGatePath")


@adk_path.handler(name="run")
async def adk_run(ctx: restate.ObjectContext, task: AgentTask) -> dict[str, Any]:
    agent = LlmAgent(name="gate_path", model=OpenAILlm(model=task.run_id), tools=[*adk.countersign_tools(OFFERED)])
    app = App(name="gate_path", root_agent=agent, plugins=[RestatePlugin(), adk.CountersignPlugin()])
    runner = Runner(app=app, session_service=RestateSessionService())
    message = types.Content(role="user", parts=[types.Part.from_text(text=GOAL)])
    answer, plan = "", await approved_plan(ctx, task)
    async for event in adk.run_gated(
        runner,
        requester=REQUESTER,
        run_id=task.run_id,
        plan=plan,
        user_id=ctx.key(),
        session_id=task.run_id,
        new_message=message,
    ):
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(p.text or "" for p in event.content.parts)
    actions = [a.model_dump(mode="json") for a in adk.countersign_actions(ctx, task.run_id)]
    return {"actions": actions, "answer": answer}


served = [path, pydantic_path, openai_path, langchain_path, adk_path]

# A refund whose approvers come from a callable that names nobody: its policy cannot be resolved;
# and the tool a model asks a person a question with.
TOOLS = [
    *DEMO_TOOLS,
    ask_a_person_tool(ToolPolicy(gated=True, approvers=("ops@example.com",))),
    Tool(
        name="refund_unowned",
        description="A refund nobody may approve.",
        args_model=IssueRefundArgs,
        effect=issue_refund,
        policy=ToolPolicy(gated=True, approvers_from=lambda context: []),
    ),
]
