"""Pydantic AI under Countersign's gate, for an agent wrapped in `RestateAgent` and served by Restate.

    from pydantic_ai import Agent
    from restate.ext.pydantic import RestateAgent
    from countersign.integrations.pydantic_ai import Countersign, CountersignToolset

    agent = RestateAgent(Agent("openai:gpt-4.1-mini", toolsets=[CountersignToolset(["charge_card"])]))

    @service.handler()
    async def run(ctx: restate.Context, task: Task) -> str:
        gate = Countersign(requester=task.requester, run_id=f"collect-{task.invoice_id}")
        return (await agent.run(task.prompt, capabilities=[gate])).output

`CountersignToolset` offers Countersign tools (by name, from the tools COUNTERSIGN_TOOLS loads) to the
model as Pydantic AI tools of the same name, description and argument schema. Every call of one is
deferred for approval (`ApprovalRequired`); the `Countersign` capability answers the turn's deferred
calls inline (`handle_deferred_tool_calls`), one `gated_call` each, in the order the model made them:
the gate path every caller takes, so the tool's Countersign policy decides (whom, when, deadline,
quorum, edits), a call it does not gate runs without asking, and an approved call runs there, after
the tool's precondition re-check. The framework then hears the answer in its own terms:
`ToolApproved(override_args=<the arguments run>)`, whose tool call hands the model the effect's
result, or `ToolDenied(<why>)` with the approver's reason, or saying that the approval expired, was
cancelled or could not be delivered, or that the call failed.

Guarantee: the whole loop runs inside the one durable handler that calls `agent.run`. `RestateAgent`
journals each model reply; `gated_call` journals its policy step and the effect, which runs under the
idempotency key `<run_id>/<index>` (in the `Approval` workflow when a person approved it, so a crash or
a replay asks nobody twice and runs nothing twice). The tool call Pydantic AI makes afterwards only
reports the journaled result. Everything the adapter decides comes from journaled values (the model's
replies, the gate's records), so a replay takes the same path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from countersign.extras import install_hint

try:
    from pydantic_ai import ToolDefinition
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import ApprovalRequired
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext, ToolApproved, ToolDenied
    from pydantic_ai.toolsets.abstract import AbstractToolset, ToolsetTool
    from restate.ext.pydantic._utils import current_state
except ImportError as exc:  # the extra is not installed
    raise ImportError(f"countersign.integrations.pydantic_ai needs Pydantic AI: {install_hint('pydantic-ai')}") from exc

import restate
from pydantic import BaseModel
from restate import TerminalError
from restate.extensions import current_context

from countersign.approval.calls import gated_call
from countersign.approval.plan import ApprovedPlan
from countersign.contract import ActionRecord
from countersign.integrations._messages import denial_message
from countersign.tools import default_registry
from countersign.tools.registry import Tool

__all__ = ["Countersign", "CountersignToolset", "denial_message"]

_META = "countersign"
"""The key of Countersign's entry in `DeferredToolResults.metadata[tool_call_id]`."""


def _restate_context() -> restate.Context:
    ctx = current_context()
    if ctx is None:
        raise TerminalError(
            "Countersign's Pydantic AI tools run only inside a Restate handler (an agent wrapped in RestateAgent)", 500
        )
    return ctx


class _ArgsValidator:
    """Validates a call's arguments with the Countersign tool's own pydantic model, and hands on the
    JSON form (what the gate freezes and the effect's step journals). A ValidationError goes back to
    the model as a retry prompt, as for any Pydantic AI tool."""

    def __init__(self, model: type[BaseModel]) -> None:
        self._model = model

    def validate_json(
        self, input: str | bytes | bytearray, *, allow_partial: bool | str = False, **kwargs: Any
    ) -> dict[str, Any]:
        return self._model.model_validate_json(input).model_dump(mode="json")

    def validate_python(self, input: Any, *, allow_partial: bool | str = False, **kwargs: Any) -> dict[str, Any]:
        return self._model.model_validate(input).model_dump(mode="json")


class CountersignToolset(AbstractToolset[Any]):
    """Countersign tools as Pydantic AI tools: `tools` names them (or gives them; default: every loaded
    tool), resolved against the loaded registry when the agent first lists its tools, so the policy
    file's overrides apply. Each call asks the gate first (see `Countersign`); each approved call runs
    the tool's effect under Countersign's idempotency key. The tools are `sequential`, so the calls of
    one turn run in the model's order, one at a time, and a replay journals them in the same order."""

    def __init__(self, tools: Sequence[str | Tool] | None = None, *, id: str = "countersign", max_retries: int = 1):
        self._names = None if tools is None else [t if isinstance(t, str) else t.name for t in tools]
        self._id = id
        self._max_retries = max_retries
        # Where the agent is built (at import, when COUNTERSIGN_SERVICES loads it): a misspelt name
        # stops the process at start, not the first run that offers the model its tools.
        if self._names is not None:
            self._missing()

    def _missing(self) -> None:
        registry = default_registry()
        missing = [name for name in self._names or () if registry.get(name) is None]
        if missing:
            raise ValueError(
                f"CountersignToolset: {', '.join(missing)} not among the loaded tools ({', '.join(registry.names())}); "
                "load them with COUNTERSIGN_TOOLS"
            )

    @property
    def id(self) -> str:
        return self._id

    def tools(self) -> list[Tool]:
        registry = default_registry()
        if self._names is None:
            return list(registry)
        return [tool for name in self._names if (tool := registry.get(name)) is not None]

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            tool.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=tool.name,
                    description=tool.description,
                    parameters_json_schema=tool.schema(),
                    sequential=True,
                    metadata={_META: True},
                ),
                max_retries=self._max_retries,
                args_validator=_ArgsValidator(tool.args_model),
            )
            for tool in self.tools()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        if not ctx.tool_call_approved:
            await _take_turn(ctx)
            raise ApprovalRequired()
        ran = (ctx.tool_call_metadata or {}).get(_META) if isinstance(ctx.tool_call_metadata, dict) else None
        if not isinstance(ran, dict):
            # Approved by something other than the Countersign capability (e.g. DeferredToolResults
            # passed in by hand): nothing of Countersign's vouches for it, so it does not run.
            raise TerminalError(
                f"{name} was approved outside Countersign; not run (give the run a Countersign capability)", 400
            )
        record = ActionRecord.model_validate(ran)
        if tool_args != record.args:
            raise TerminalError(f"{name} was to run with arguments other than the approved ones; not run", 400)
        # The effect ran in the gate (see the module's guarantee): the model hears its result.
        return record.result or {}


async def _take_turn(ctx: RunContext[Any]) -> None:
    """Pass RestateAgent's turnstile (its tool calls, in the model's order) without running anything,
    so the calls after this one in the same turn are not left waiting for it."""
    if ctx.tool_call_id is None:
        return
    turnstile = current_state().turnstile
    if ctx.tool_call_id not in turnstile.events:
        return
    await turnstile.wait_for(ctx.tool_call_id)
    turnstile.allow_next_after(ctx.tool_call_id)


def _why(ctx: RunContext[Any]) -> str:
    """The model's own words in the reply that made the calls (what the approver reads as `why`)."""
    for message in reversed(ctx.messages):
        if isinstance(message, ModelResponse):
            # Whole: the gate cuts it to the contract's bound, as it does every caller's.
            return " ".join(p.content for p in message.parts if isinstance(p, TextPart)).strip()
    return ""


@dataclass
class Countersign(AbstractCapability[Any]):
    """Answers the deferred calls of Countersign tools through the gate, inline, during the run.

    Create one per run (inside the handler): `requester` (an email: told of outcomes), `tenant`,
    `run_id` (default: the invocation id; give a stable one, e.g. the workflow key, so one action maps
    to one approval across invocations) and `goal` (default: the run's prompt) reach the gate as they
    do from `gated_call`. `plan` (an `ApprovedPlan` from `request_plan_approval`, asked earlier in the
    handler) is handed to each `gated_call`: a call inside it runs without a new approval, one outside
    it is asked again or refused, as the plan says. `actions` lists the gate's records of the calls
    (outcome, arguments run, result), in order, for the handler to return or record, as an
    `AgentRun`'s result lists its own; each approver also sees them, as the run's earlier calls.
    Deferred calls of tools that are not Countersign's are left alone (a later capability may answer
    them, or the run ends with `DeferredToolRequests` as usual)."""

    requester: str
    tenant: str = "default"
    run_id: str | None = None
    goal: str = ""
    plan: ApprovedPlan | None = None
    actions: list[ActionRecord] = field(default_factory=list, init=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        registry = default_registry()
        rctx = _restate_context()
        prompt = ctx.prompt if isinstance(ctx.prompt, str) else ""
        why = _why(ctx)
        results = DeferredToolResults()
        # One call after another, in the model's order: the next is asked once this one has ended.
        for call in requests.approvals:
            if registry.get(call.tool_name) is None:
                continue
            record = await gated_call(
                rctx,
                tool=call.tool_name,
                args=call.args_as_dict(),
                requester=self.requester,
                tenant=self.tenant,
                why=why,
                goal=self.goal or prompt,
                run_id=self.run_id,
                trail=self.actions,
                plan=self.plan,
                asked_by="agent",
            )
            self.actions.append(record)
            results.answered_by[call.tool_call_id] = ", ".join(record.approved_by) or _answerer(record)
            if record.args is None:  # not run
                results.approvals[call.tool_call_id] = ToolDenied(denial_message(record))
                continue
            # It ran (a failed effect too: the model hears its error as the tool's result).
            results.approvals[call.tool_call_id] = ToolApproved(override_args=record.args)
            results.metadata[call.tool_call_id] = {_META: record.model_dump(mode="json")}
        return results if results.approvals else None


def _answerer(record: ActionRecord) -> str:
    """Who answered a call nobody approved by name: the policy (nobody was asked), the deadline, or
    Countersign (e.g. a rejection, a cancel)."""
    source: Literal["policy", "deadline", "countersign"] = "countersign"
    if record.approval_id is None:
        source = "policy"
    elif record.decision_source == "deadline_default":
        source = "deadline"
    return f"countersign:{source}"
