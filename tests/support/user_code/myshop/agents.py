"""A shop's own Restate handlers served beside Countersign, calling the gate as a library: the Virtual
Object `RefundDesk` (`gated_call`, keeping the last outcome in its state), the Service `RefundCheck`
(`request_approval`, and two approvals placed by default in one invocation), and `RawGate`, which
passes the gate what a typed input would have refused (any placement, argument, text length, or a
`Tool` object that is not the loaded one).

Served with `COUNTERSIGN_SERVICES=myshop.agents:served` (tests/support/user_code on the app's PYTHONPATH)
by tests/integration/test_gate_library.py, test_standing_approvals.py and test_webhooks.py."""

from typing import Any

import restate
from pydantic import BaseModel

from countersign import Tool, ToolPolicy, gated_call, request_approval, request_plan_approval
from handlers.demo.tools import DEMO_TOOLS


class Ask(BaseModel):
    run_id: str
    tool: str
    args: dict[str, Any]
    index: int | None = None
    requester: str = "alice@example.com"


desk = restate.VirtualObject("RefundDesk")


@desk.handler()
async def act(ctx: restate.ObjectContext, ask: Ask) -> dict[str, Any]:
    record = await gated_call(
        ctx,
        tool=ask.tool,
        args=ask.args,
        requester=ask.requester,
        run_id=ask.run_id,
        index=ask.index,
        why="asked by the desk",
    )
    ctx.set("last", record.outcome.value)
    return record.model_dump(mode="json")


checker = restate.Service("RefundCheck")


@checker.handler()
async def ask(ctx: restate.Context, ask: Ask) -> dict[str, Any]:
    outcome = await request_approval(ctx, tool=ask.tool, args=ask.args, requester=ask.requester, run_id=ask.run_id)
    return outcome.model_dump(mode="json")


@checker.handler()
async def twice(ctx: restate.Context, ask: Ask) -> list[dict[str, Any]]:
    """Two approvals in one invocation, placed by default (the invocation id and a count)."""
    first = await request_approval(ctx, tool=ask.tool, args=ask.args, requester="alice@example.com")
    second = await request_approval(ctx, tool=ask.tool, args=ask.args, requester="alice@example.com")
    return [first.model_dump(mode="json"), second.model_dump(mode="json")]


class Nothing(BaseModel):
    pass


STRAY = Tool(
    name="stray", description="Loaded by nobody.", args_model=Nothing, effect=lambda a, c: {}, policy=ToolPolicy()
)
OBJECTS = {tool.name: tool for tool in [*DEMO_TOOLS, STRAY]}
raw = restate.Service("RawGate")


@raw.handler()
async def call(ctx: restate.Context, ask: dict[str, Any]) -> dict[str, Any]:
    """The gate's calls with what a typed input would have refused: any `run_id`, `index` or `args`."""
    placed: dict[str, Any] = {"run_id": ask.get("run_id"), "index": ask.get("index")}
    times = ask.get("repeat", 1)  # long texts made here, not sent: the ingress carries a short request
    who = {"requester": "alice@example.com", "why": ask.get("why", "") * times, "goal": ask.get("goal", "") * times}
    if ask["call"] == "plan":
        plan = await request_plan_approval(ctx, plan=ask["plan"], **placed, **who)
        return plan.model_dump(mode="json")
    gate = gated_call if ask["call"] == "gated_call" else request_approval
    tool = OBJECTS[ask["tool"]] if ask.get("as_object") else ask["tool"]
    outcome = await gate(ctx, tool=tool, args=ask["args"], **placed, **who)
    return outcome.model_dump(mode="json")


served = [desk, checker, raw]
