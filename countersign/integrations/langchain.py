"""LangChain under Countersign's gate, for a `create_agent` agent run inside a Restate handler.

    from langchain.agents import create_agent
    from restate.ext.langchain import RestateMiddleware
    from countersign.integrations.langchain import CountersignContext, CountersignMiddleware, countersign_tools

    agent = create_agent(
        "openai:gpt-4.1-mini",
        tools=countersign_tools(["lookup_order", "issue_refund"]),
        middleware=[RestateMiddleware(), CountersignMiddleware(interrupt_on={"issue_refund": True})],
    )

    @service.handler()
    async def run(ctx: restate.Context, task: Task) -> str:
        who = CountersignContext(requester=task.requester, run_id=f"refund-{task.order_id}")
        state = await agent.ainvoke({"messages": [{"role": "user", "content": task.prompt}]}, context=who)
        return state["messages"][-1].text

`countersign_tools` offers Countersign tools (by name, from the tools COUNTERSIGN_TOOLS loads) to the
model as LangChain tools of the same name, description and argument schema. `CountersignMiddleware`
takes the place of LangChain's `HumanInTheLoopMiddleware` (the same `interrupt_on` mapping) and must
come after `RestateMiddleware`: each call of a Countersign tool is one `gated_call`, the gate path
every caller takes, so the tool's Countersign policy decides (whom, when, deadline, quorum, edits), a
call it does not gate runs without asking, and an approved call runs there, after the tool's
precondition re-check. The model hears the outcome as LangChain's own tool messages: the effect's
result (after LangChain's edit notice when the approver changed the arguments), or an error message
with the approver's reason, or saying that the approval expired, was cancelled or could not be
delivered. Calls of other tools go to them untouched.

Guarantee: the whole loop runs inside the one durable handler that calls `agent.ainvoke`.
`RestateMiddleware` journals each model reply and lets the calls of one reply through one at a time,
in the model's order; `gated_call` journals its policy step and the effect, which runs under the
idempotency key `<run_id>/<index>` (in the `Approval` workflow when a person approved it, so a crash or
a replay asks nobody twice and runs nothing twice). The LangChain tool itself never runs. What the
middleware decides comes from journaled values (the model's replies, the gate's records), so a replay
takes the same path.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from countersign.extras import install_hint

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolCall, ToolMessage
    from langchain_core.tools import BaseTool, StructuredTool
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command
    from restate.ext.langchain._state import state_from_ctx
except ImportError as exc:  # the extra is not installed
    raise ImportError(f"countersign.integrations.langchain needs LangChain: {install_hint('langchain')}") from exc

import restate
from restate import TerminalError
from restate.extensions import current_context

from countersign.approval.calls import gated_call
from countersign.approval.plan import ApprovedPlan
from countersign.contract import ActionRecord, Outcome
from countersign.integrations._messages import RAN, denial_message
from countersign.integrations._tools import loaded_tools
from countersign.tools import default_registry
from countersign.tools.registry import Tool

__all__ = [
    "CountersignContext",
    "CountersignMiddleware",
    "InterruptOnConfig",
    "countersign_actions",
    "countersign_tools",
]

_META = "countersign"
"""The key that marks a LangChain tool (its `metadata`) and a tool message (its `artifact`) as Countersign's."""

EDIT_NOTICE = (
    "Note: the approver changed this tool call before it ran. The call recorded in your message is the one "
    "you produced, not the one that executed. This was intentional and authorized. Do not re-issue your "
    "original call."
)
"""Prepended to the result of a call run with the approver's edits, as LangChain's human-in-the-loop
middleware prepends its own notice to an edited call's result."""

Describe = Callable[[ToolCall, Any, Any], str]
"""LangChain's description factory: (tool call, agent state, runtime) -> text for the approver."""


class InterruptOnConfig(TypedDict):
    """The part of LangChain's `InterruptOnConfig` that Countersign takes: `description`, what the
    approver reads as the call's "why" (default: the model's own words in the reply that made the
    call). Which decisions a person may take, and when a call is asked at all, are the tool's
    Countersign policy (its editable fields, its condition), not the middleware's."""

    description: NotRequired[str | Describe]


@dataclass(frozen=True)
class CountersignContext:
    """One run's facts for the gate, passed as `agent.ainvoke(..., context=CountersignContext(...))`.

    `requester` (an email: told of outcomes), `tenant`, `run_id` (default: the invocation id; give a
    stable one, e.g. the workflow key, so one action maps to one approval across invocations) and
    `goal` (default: the run's first user message) reach the gate as they do from `gated_call`, and
    so does `plan` (an `ApprovedPlan` from `request_plan_approval`, asked earlier in the handler): a
    call inside it runs without a new approval, one outside it is asked again or refused, as the plan
    says. An agent's own context object (or dict) with fields of these names serves as well."""

    requester: str
    tenant: str = "default"
    run_id: str | None = None
    goal: str = ""
    plan: ApprovedPlan | None = None


def countersign_tools(tools: Sequence[str | Tool] | None = None) -> list[BaseTool]:
    """Countersign tools as LangChain tools, to pass to `create_agent(tools=...)`: `tools` names them
    (or gives them; default: every loaded tool). Only `CountersignMiddleware` answers their calls; the
    tools themselves refuse to run, so a call can never reach an effect around the gate."""
    return [_as_langchain(tool) for tool in loaded_tools(tools, "countersign_tools")]


def _as_langchain(tool: Tool) -> BaseTool:
    name = tool.name

    async def refuse(**kwargs: Any) -> str:
        raise TerminalError(
            f"tool {name!r} is a Countersign tool: give the agent CountersignMiddleware() after RestateMiddleware()",
            500,
        )

    return StructuredTool(
        name=name,
        description=tool.description,
        args_schema=tool.schema(),
        coroutine=refuse,
        metadata={_META: True},
    )


def countersign_actions(messages: Sequence[Any]) -> list[ActionRecord]:
    """The gate's records of the run's Countersign calls (outcome, arguments run, who approved,
    result), in order, from the agent's final messages (each tool message carries its record)."""
    return [
        ActionRecord.model_validate(message.artifact[_META])
        for message in messages
        if isinstance(message, ToolMessage) and isinstance(message.artifact, dict) and _META in message.artifact
    ]


# The gate's records of each run (by run id) of one invocation, in order: what each approver sees as
# the run's earlier calls. Rebuilt in the same order on a replay, as the calls are journaled.
_TRAILS: weakref.WeakKeyDictionary[restate.Context, dict[str | None, list[ActionRecord]]] = weakref.WeakKeyDictionary()


class CountersignMiddleware(AgentMiddleware[AgentState[Any], Any]):
    """Sends each call of a Countersign tool through the gate; place it after `RestateMiddleware`.

    `interrupt_on` uses the vocabulary of LangChain's `HumanInTheLoopMiddleware`, so moving from it is
    a change of one middleware: a Countersign tool maps to `True` or an `InterruptOnConfig`
    (`description` only); `False` and unlisted tools that are not Countersign's run untouched. Every
    call of a Countersign tool is gated whether listed or not: its Countersign policy, not this
    mapping, says when a person is asked (`False` for one is refused, as it would bypass that policy).

    `requester`, `tenant`, `run_id` and `goal` are defaults for runs whose context does not give them
    (see `CountersignContext`). `edit_notice` is prepended to the result of a call run with the
    approver's edits, with the arguments it ran with (None: nothing; the message's artifact holds
    the whole record either way)."""

    def __init__(
        self,
        interrupt_on: Mapping[str, bool | InterruptOnConfig] | None = None,
        *,
        requester: str | None = None,
        tenant: str = "default",
        run_id: str | None = None,
        goal: str = "",
        edit_notice: str | None = EDIT_NOTICE,
    ) -> None:
        super().__init__()
        self._descriptions = _descriptions(interrupt_on or {})
        self._defaults = {"requester": requester, "tenant": tenant, "run_id": run_id, "goal": goal}
        self.edit_notice = edit_notice

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """The model's reply, passed on unless this middleware sits before `RestateMiddleware`: then it
        wraps Restate's model call, sees the reply's turnstile already installed, and fails the run here,
        before any of the reply's calls is gated. (`_check_order` alone cannot tell for a reply's first
        call, whose turn is open from the start: that call was put to a person while the calls after
        it waited for a turn that never came.)"""
        response = await handler(request)
        ctx = current_context()
        state = state_from_ctx(ctx) if ctx is not None else None
        asked = [c["id"] for m in response.result if isinstance(m, AIMessage) for c in m.tool_calls if c.get("id")]
        if state is not None and asked and list(state.turnstile.events) == asked:
            raise TerminalError(_AFTER_RESTATE)
        return response

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        call = request.tool_call
        if not _is_countersign(request.tool) and call["name"] not in self._descriptions:
            return await handler(request)
        ctx = _restate_context()
        _check_order(ctx, call.get("id"))
        run = self._run(request.runtime)
        trail = _TRAILS.setdefault(ctx, {}).setdefault(run.run_id, [])
        record = await gated_call(
            ctx,
            tool=call["name"],
            args=call["args"],
            requester=run.requester,
            tenant=run.tenant,
            why=self._why(request),
            goal=run.goal or _first_request(_messages(request.state)),
            run_id=run.run_id,
            trail=trail,
            plan=run.plan,
            asked_by="agent",
        )
        trail.append(record)
        return self._message(call, record)

    def _run(self, runtime: Any) -> CountersignContext:
        context = getattr(runtime, "context", None)
        if isinstance(context, CountersignContext):
            return context
        facts = {name: _field(context, name, default) for name, default in self._defaults.items()}
        if not isinstance(facts["requester"], str) or not facts["requester"]:
            raise TerminalError(
                "CountersignMiddleware needs a requester: pass context=CountersignContext(requester=...) "
                "to the agent's ainvoke, or CountersignMiddleware(requester=...)",
                400,
            )
        plan = _field(context, "plan", None)
        if plan is not None and not isinstance(plan, ApprovedPlan):
            raise TerminalError(
                f"the run's plan must be the ApprovedPlan request_plan_approval returned, not {type(plan).__name__}",
                400,
            )
        return CountersignContext(**facts, plan=plan)

    def _why(self, request: ToolCallRequest) -> str:
        describe = self._descriptions.get(request.tool_call["name"])
        if isinstance(describe, str):
            return describe
        if describe is not None:
            return describe(request.tool_call, request.state, request.runtime)
        return _model_words(_messages(request.state), request.tool_call.get("id"))

    def _message(self, call: ToolCall, record: ActionRecord) -> ToolMessage:
        """The gate's record as the tool message the model reads next (the record is its artifact)."""
        if record.args is None:  # not run
            content = denial_message(record)
        else:  # it ran (a failed effect too: the model hears its error as the tool's result)
            content = json.dumps(record.result or {}, ensure_ascii=False)
            if record.outcome is Outcome.APPROVED_WITH_EDITS and self.edit_notice:
                ran = json.dumps(record.args, ensure_ascii=False)
                notice = f"{self.edit_notice} Executed instead: {call['name']} with arguments {ran}."
                content = f"{notice}\n\nTool response:\n{content}"
        return ToolMessage(
            content=content,
            tool_call_id=call.get("id") or "",
            name=call["name"],
            status="success" if record.outcome in RAN else "error",
            artifact={_META: record.model_dump(mode="json")},
        )


def _descriptions(interrupt_on: Mapping[str, bool | InterruptOnConfig]) -> dict[str, str | Describe | None]:
    """`interrupt_on` checked against the loaded tools: the Countersign tools it lists, with the
    description (if any) the approver reads for their calls."""
    registry = default_registry()
    listed: dict[str, str | Describe | None] = {}
    for name, config in interrupt_on.items():
        countersign = registry.get(name) is not None
        if config is False:
            if countersign:
                raise ValueError(
                    f"interrupt_on[{name!r}] is False, but {name} is a Countersign tool: its policy says when a "
                    "person is asked (gated = false in the policy lets its calls run alone)"
                )
            continue
        if not countersign:
            raise ValueError(
                f"interrupt_on names {name!r}, which is not among the loaded Countersign tools "
                f"({', '.join(registry.names())}): Countersign has no policy to ask with; load it with "
                "COUNTERSIGN_TOOLS, or leave its approval to HumanInTheLoopMiddleware"
            )
        if config is True:
            listed[name] = None
            continue
        if not isinstance(config, Mapping):
            raise ValueError(f"interrupt_on[{name!r}] must be True or a config with a description")
        other = sorted(set(config) - {"description"})
        if other:
            raise ValueError(
                f"interrupt_on[{name!r}] has {', '.join(other)}: the decisions a person may take and when a "
                "call is asked come from the tool's Countersign policy (its editable fields, its condition); "
                "only a description is taken here"
            )
        listed[name] = config.get("description")
    return listed


def _is_countersign(tool: BaseTool | None) -> bool:
    return tool is not None and bool((tool.metadata or {}).get(_META))


def _restate_context() -> restate.Context:
    ctx = current_context()
    if ctx is None:
        raise TerminalError(
            "Countersign's LangChain middleware runs only inside a Restate handler (with RestateMiddleware)", 500
        )
    return ctx


def _check_order(ctx: restate.Context, call_id: str | None) -> None:
    """Refuse to gate outside `RestateMiddleware`: without it the model's replies are not journaled
    (a replay would ask a different question), and before it a gated call would never pass its turn,
    leaving the calls after it in the same reply waiting for ever."""
    state = state_from_ctx(ctx)
    if state is None:
        raise TerminalError(
            "CountersignMiddleware needs RestateMiddleware() before it in create_agent(middleware=[...])"
        )
    turn = state.turnstile.events.get(call_id or "")
    if turn is not None and not turn.is_set():
        raise TerminalError(_AFTER_RESTATE)


_AFTER_RESTATE = "CountersignMiddleware must come after RestateMiddleware() in create_agent(middleware=[...])"


def _field(context: Any, name: str, default: Any) -> Any:
    value = context.get(name) if isinstance(context, Mapping) else getattr(context, name, None)
    return default if value is None else value


def _messages(state: Any) -> list[AnyMessage]:
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
    return list(messages or [])


def _model_words(messages: Sequence[AnyMessage], call_id: str | None) -> str:
    """The model's own words in the reply that made the call (what the approver reads as `why`)."""
    for message in reversed(messages):
        if isinstance(message, AIMessage) and any(c.get("id") == call_id for c in message.tool_calls):
            # Whole: the gate cuts it to the contract's bound, as it does every caller's.
            return message.text.strip()
    return ""


def _first_request(messages: Sequence[AnyMessage]) -> str:
    return next((m.text for m in messages if isinstance(m, HumanMessage)), "")
