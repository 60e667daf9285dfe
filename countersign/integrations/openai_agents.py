"""Countersign's gate under the OpenAI Agents SDK (the `openai-agents` extra).

    from countersign.integrations.openai_agents import countersign_tool, run_gated

    agent = Agent(name="billing", model="gpt-4.1", tools=[countersign_tool("issue_refund")])

    @service.handler()
    async def run(ctx: restate.Context, task: Task) -> str:
        result = await run_gated(ctx, agent, task.goal, requester=task.requester, run_id=task.run_id)
        return str(result.final_output)

Guarantee: everything happens inside the one Restate handler that calls `run_gated`. Every model
call is a journaled step (as with restate.ext.openai's DurableRunner), so a replay sees the same tool calls;
each interruption the SDK raises for a `countersign_tool` becomes one `gated_call` (policy, emailed
approval, precondition re-check, the effect under the idempotency key `<run_id>/<index>`), whose
result is journaled by the gate; its verdict is applied to the SDK's RunState (approve, or reject with
a message that says why) and the run resumes from that state. A kill -9 anywhere neither loses the
wait (it lives in the `Approval` workflow) nor runs a tool twice (the effect ran once, in the gate;
the SDK's call of the tool only reports that result). Who approves, when, the deadline, quorum and
edits come from the tool's Countersign policy, as everywhere else.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import restate
from pydantic import BaseModel, TypeAdapter
from restate import RunOptions, TerminalError

from countersign.approval.calls import gated_call
from countersign.approval.plan import ApprovedPlan
from countersign.contract import ActionRecord, Outcome
from countersign.extras import install_hint
from countersign.tools import default_registry
from countersign.tools.registry import Tool

try:
    from agents import (
        Agent,
        AgentsException,
        FunctionTool,
        Model,
        ModelProvider,
        RunConfig,
        Runner,
        RunResult,
        RunState,
        Usage,
    )
    from agents.items import ModelResponse, ToolApprovalItem, TResponseOutputItem, TResponseStreamEvent
    from agents.models.multi_provider import MultiProvider
    from agents.run_context import RunContextWrapper
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"countersign.integrations.openai_agents needs the OpenAI Agents SDK: {install_hint('openai-agents')}"
    ) from exc

__all__ = ["ApprovalFunction", "countersign_actions", "countersign_tool", "run_gated"]

ApprovalFunction = Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]
"""The SDK's own form of `needs_approval`: (run context, parsed arguments, call id) -> ask?"""

_MODEL_STEP = RunOptions[Any](max_attempts=4, initial_retry_interval=timedelta(milliseconds=500))
_RAN = (Outcome.APPROVED, Outcome.APPROVED_WITH_EDITS, Outcome.AUTONOMOUS)
MAX_APPROVAL_ROUNDS = 50
"""Resumes after interruptions one run may make: a bound on a model that keeps asking."""


@dataclass
class _Run:
    """What the tools of one `run_gated` call share: where its approvals go, and what was decided."""

    ctx: restate.Context
    requester: str
    tenant: str
    goal: str
    why: str
    run_id: str
    next_index: int | None
    """The index of the next gated call; None: the gate's own count of the invocation's calls."""
    plan: ApprovedPlan | None
    decided: dict[str, ActionRecord] = field(default_factory=dict)
    """By the SDK's tool call id: the gate's record of a call the SDK is about to report."""
    done: list[ActionRecord] = field(default_factory=list)
    """The gate's records in the order they came back: each approver's "what this run did before"."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def take_index(self) -> int | None:
        index = self.next_index
        if index is not None:
            self.next_index = index + 1
        return index


_CURRENT: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("countersign_openai_run", default=None)

# The gate's records of each run (by the run id given to run_gated) of one invocation, in order:
# what `countersign_actions` returns. Rebuilt alike on a replay, as the calls are journaled.
_TRAILS: weakref.WeakKeyDictionary[restate.Context, dict[str | None, list[ActionRecord]]] = weakref.WeakKeyDictionary()


def countersign_actions(ctx: restate.Context, run_id: str | None = None) -> list[ActionRecord]:
    """The gate's records of the calls `run_gated` made in this invocation for `run_id` (None: the
    runs placed under the invocation id), in order: outcome, arguments run, who approved, result,
    and the plan's approval and any deviation from it."""
    return list(_TRAILS.get(ctx, {}).get(run_id, []))


def countersign_tool(tool: str | Tool, *, needs_approval: bool | ApprovalFunction = True) -> FunctionTool:
    """The Countersign tool `tool` (loaded by COUNTERSIGN_TOOLS) as an Agents SDK FunctionTool.

    `needs_approval` is the SDK's: True (the default) or the SDK's callable make every call an
    interruption that `run_gated` turns into a gated call. A call the SDK lets through (False, or
    the callable said no) is still gated by the tool's Countersign policy, inside the tool call: the
    SDK's flag can add a question, never remove one the policy asks."""
    resolved = tool if isinstance(tool, Tool) else default_registry().get(tool)
    if resolved is None:
        raise ValueError(f"unknown Countersign tool {tool!r}; available: {', '.join(default_registry().names())}")
    name = resolved.name

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        run = _CURRENT.get()
        if run is None:
            raise TerminalError(f"tool {name!r} is a Countersign tool: run the agent with run_gated(ctx, ...)")
        record = run.decided.pop(context.tool_call_id, None)
        if record is None:
            try:
                args = _arguments(arguments)
            except ValueError as exc:
                return json.dumps({"outcome": "invalid", "error": str(exc)})
            # One at a time, in the order the SDK started them, so a replay journals them alike.
            async with run.lock:
                record = await _gate(run, name, args)
            if record.outcome not in _RAN:
                return _denial(record)
        return json.dumps(_report(record))

    return FunctionTool(
        name=name,
        description=resolved.description,
        params_json_schema=resolved.schema(),
        on_invoke_tool=invoke,
        strict_json_schema=False,
        needs_approval=needs_approval,
    )


async def run_gated(
    ctx: restate.Context,
    agent: Agent[Any],
    input: str | list[Any],
    *,
    requester: str,
    tenant: str = "default",
    goal: str = "",
    why: str = "",
    run_id: str | None = None,
    first_index: int | None = None,
    plan: ApprovedPlan | None = None,
    run_config: RunConfig | None = None,
    run_options: RunOptions[Any] | None = None,
    max_turns: int = 10,
) -> RunResult:
    """Run `agent` on `input` inside this Restate handler, asking a person for every interruption.

    Approvals are placed at `<run_id>-a<index>` (effects under `<run_id>/<index>`), with indexes from
    `first_index` in the order the calls are gated (None: the gate's own count of this invocation's
    calls, as `gated_call` places them, so a plan asked before in the handler keeps its place);
    `run_id` defaults to the invocation id. `plan` (an `ApprovedPlan` from `request_plan_approval`)
    is handed to each `gated_call`: a call inside it runs without a new approval, one outside it is
    asked again or refused, as the plan says. The model is journaled whether the agent names it
    (resolved by `run_config.model_provider`, by default the SDK's OpenAI provider) or holds a Model
    instance."""
    where = run_id or ctx.request().id
    run = _Run(ctx, requester, tenant, goal or _text(input), why, where, first_index, plan)
    run.done = _TRAILS.setdefault(ctx, {}).setdefault(run_id, [])
    config = _journaled(ctx, agent, run_config or RunConfig(), run_options or _MODEL_STEP)
    token = _CURRENT.set(run)
    try:
        result = await _resume(agent, input, config, max_turns)
        for _ in range(MAX_APPROVAL_ROUNDS):
            if not result.interruptions:
                return result
            state = result.to_state()
            # The state's own items: the SDK matches a copy by identity, which two calls of one
            # tool in one turn can make ambiguous.
            for item in state.get_interruptions():
                await _decide(run, state, item)
            result = await _resume(agent, state, config, max_turns)
    finally:
        _CURRENT.reset(token)
    raise TerminalError(f"the agent was still asking for approvals after {MAX_APPROVAL_ROUNDS} rounds")


async def _resume(
    agent: Agent[Any], input: str | list[Any] | RunState[Any], config: RunConfig, turns: int
) -> RunResult:
    try:
        return await Runner.run(agent, input, run_config=config, max_turns=turns)
    except AgentsException as exc:
        # The SDK's own errors (too many turns, a reply it cannot use, a misuse) replay the same way
        # from the journal: retrying the invocation would only repeat them.
        raise TerminalError(f"the agent run failed: {type(exc).__name__}: {exc}") from exc


async def _decide(run: _Run, state: RunState[Any], item: ToolApprovalItem) -> None:
    """One interruption: the whole gated action, then its verdict in the SDK's own terms."""
    name, call_id = item.tool_name or "", item.call_id
    tool = default_registry().get(name)
    if tool is None or call_id is None:
        # A tool of the SDK's own that asks for approval: Countersign has no policy to ask with.
        raise TerminalError(
            f"tool {name!r} needs approval but is not a Countersign tool; build it with countersign_tool()"
        )
    try:
        args = _arguments(item.arguments)
    except ValueError as exc:
        state.reject(item, rejection_message=f"Not run: {exc}")
        return
    record = await _gate(run, name, args)
    if record.outcome in _RAN:
        run.decided[call_id] = record
        state.approve(item)
    else:
        state.reject(item, rejection_message=_denial(record))


async def _gate(run: _Run, name: str, args: dict[str, Any]) -> ActionRecord:
    record = await gated_call(
        run.ctx,
        tool=name,
        args=args,
        requester=run.requester,
        tenant=run.tenant,
        why=run.why,
        goal=run.goal,
        run_id=run.run_id,
        index=run.take_index(),
        trail=run.done,
        plan=run.plan,
        asked_by="agent",
    )
    run.done.append(record)
    return record


def _arguments(raw: str | None) -> dict[str, Any]:
    try:
        parsed = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"the arguments are not JSON ({exc.msg})") from None
    if not isinstance(parsed, dict):
        raise ValueError("the arguments must be a JSON object")
    return parsed


def _report(record: ActionRecord) -> dict[str, Any]:
    """What the model is told of a call that ran: the outcome, the arguments run, the result."""
    report: dict[str, Any] = {"outcome": record.outcome.value, "result": record.result}
    if record.outcome is Outcome.APPROVED_WITH_EDITS:
        # RunState.approve carries no arguments: the model learns of the edit here.
        report["args"] = record.args
        report["edits"] = record.edits
    return report


def _denial(record: ActionRecord) -> str:
    """The message the model sees for a call that did not run (or ran and failed)."""
    reason = record.reason or (record.result or {}).get("error") or "no reason given"
    match record.outcome:
        case Outcome.REJECTED if record.decision_source == "human":
            return f"Rejected by the approver: {reason}"
        case Outcome.REJECTED:  # e.g. a deadline whose policy says a silence is a no
            return f"Rejected: {reason}"
        case Outcome.EXPIRED:
            return f"Not run: the approval expired without a decision ({reason})"
        case Outcome.CANCELLED:
            return f"Not run: the approval was cancelled ({reason})"
        case _:
            return f"Not run ({record.outcome.value}): {reason}"


def _text(input: str | list[Any]) -> str:
    return input if isinstance(input, str) else ""


_OUTPUT: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])
_USAGE: TypeAdapter[Usage] = TypeAdapter(Usage)


class _Reply(BaseModel):
    """One model reply as journaled: the output items as the API spells them (by alias)."""

    output: list[Any]
    usage: dict[str, Any]
    response_id: str | None = None
    request_id: str | None = None


class _JournaledModel(Model):
    """`inner`, with every reply one journaled step, so a replay never asks the provider again.

    Like restate.ext.openai's wrapper, but the items are journaled by alias: openai 3.x models have
    aliased fields (`async_` for `async`), and an item journaled by field name comes back with an
    extra key that the Agents SDK refuses when it copies pending approvals."""

    def __init__(self, inner: Model, ctx: restate.Context, options: RunOptions[Any]) -> None:
        self._inner = inner
        self._ctx = ctx
        self._options = options

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        async def call() -> _Reply:
            response = await self._inner.get_response(*args, **kwargs)
            return _Reply(
                output=_OUTPUT.dump_python(response.output, mode="json", by_alias=True, exclude_unset=True),
                usage=_USAGE.dump_python(response.usage, mode="json"),
                response_id=response.response_id,
                request_id=response.request_id,
            )

        reply = await self._ctx.run_typed("call model", call, self._options)
        return ModelResponse(
            output=_OUTPUT.validate_python(reply.output),
            usage=_USAGE.validate_python(reply.usage),
            response_id=reply.response_id,
            request_id=reply.request_id,
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise TerminalError("streaming is not supported under run_gated: each reply is one journaled step")


class _JournaledProvider(ModelProvider):
    """Resolves model names with `inner` and journals every call of the models it returns."""

    def __init__(self, inner: ModelProvider, ctx: restate.Context, options: RunOptions[Any]) -> None:
        self._inner = inner
        self._ctx = ctx
        self._options = options

    def get_model(self, model_name: str | None) -> Model:
        return _JournaledModel(self._inner.get_model(model_name), self._ctx, self._options)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _journaled(ctx: restate.Context, agent: Agent[Any], config: RunConfig, options: RunOptions[Any]) -> RunConfig:
    if isinstance(config.model, Model):
        return replace(config, model=_JournaledModel(config.model, ctx, options))
    if config.model is None and isinstance(agent.model, Model):
        # The run config's model takes precedence over every agent's: the journaled one is used.
        return replace(config, model=_JournaledModel(agent.model, ctx, options))
    inner = config.model_provider or MultiProvider()
    return replace(config, model_provider=_JournaledProvider(inner, ctx, options))
