"""Google ADK under Countersign's gate, for an `LlmAgent` run with `restate.ext.adk`'s plugin.

    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.runners import Runner
    from restate.ext.adk import RestatePlugin, RestateSessionService
    from countersign.integrations.adk import CountersignPlugin, countersign_actions, countersign_tools, run_gated

    agent = LlmAgent(name="refunds", model="gemini-2.5-flash", tools=[*countersign_tools(["issue_refund"])])
    app = App(name="refunds", root_agent=agent, plugins=[RestatePlugin(), CountersignPlugin()])
    runner = Runner(app=app, session_service=RestateSessionService())

    @desk.handler()   # a restate.VirtualObject, keyed by user
    async def run(ctx: restate.ObjectContext, task: Task) -> str:
        message = types.Content(role="user", parts=[types.Part.from_text(text=task.prompt)])
        async for event in run_gated(runner, user_id=ctx.key(), session_id=task.session, new_message=message,
                                     requester=task.requester, run_id=f"refund-{task.order_id}"):
            ...
        records = countersign_actions(ctx, f"refund-{task.order_id}")

`countersign_tools` offers Countersign tools (by name, from the tools COUNTERSIGN_TOOLS loads) to the
model as ADK tools of the same name, description and JSON schema. `CountersignPlugin`, after
`RestatePlugin`, answers each call of one in `before_tool_callback` with one `gated_call`, the gate
path every caller takes, so the tool's Countersign policy decides (whom, when, deadline, quorum, edits),
a call it does not gate runs without asking, and an approved call runs there, after the tool's
precondition re-check. The dict it returns is the tool's response (ADK skips the tool): the effect's
result, with the arguments it ran with when the approver edited them, or an `error` with the
approver's reason, or saying that the approval expired, was cancelled or could not be delivered.
ADK's own confirmation (`require_confirmation`) is not used: under RestatePlugin a confirmed call
re-runs without a model call and fails on resume. Calls of other tools go to them untouched.
`run_gated` iterates `runner.run_async` with the run's facts for the gate (who asks, where the
approvals go) and keeps a `TerminalError` terminal: ADK wraps a plugin's exceptions in RuntimeError,
which Restate would retry for ever.

Guarantee: the whole loop runs inside the one durable handler that iterates `runner.run_async`.
`RestatePlugin` journals each model reply and lets the calls of one reply through one at a time, in
the model's order; `gated_call` journals its policy step and the effect, which runs under the
idempotency key `<run_id>/<index>` (in the `Approval` workflow when a person approved it, so a crash or
a replay asks nobody twice and runs nothing twice). The ADK tool itself never runs. What the plugin
decides comes from journaled values (the model's replies, the gate's records), so a replay takes the
same path.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from countersign.extras import install_hint

try:
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.events import Event
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins import BasePlugin
    from google.adk.runners import Runner
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext
    from google.genai import types
    from restate.ext.adk.plugin import PluginState
except ImportError as exc:  # the extra is not installed
    raise ImportError(f"countersign.integrations.adk needs Google ADK: {install_hint('adk')}") from exc

import restate
from restate import TerminalError
from restate.extensions import current_context

from countersign.approval.calls import gated_call
from countersign.approval.plan import ApprovedPlan
from countersign.contract import ActionRecord, Outcome
from countersign.integrations._messages import denial_message
from countersign.integrations._tools import loaded_tools
from countersign.tools.registry import Tool

__all__ = ["EDIT_NOTE", "CountersignPlugin", "countersign_actions", "countersign_tools", "run_gated"]

_META = "countersign"
"""The key that marks an ADK tool (its `custom_metadata`) as Countersign's."""

EDIT_NOTE = (
    "The approver changed this call before it ran: it ran with executed_args, not the arguments you "
    "proposed. This was intentional and authorized. Do not re-issue your original call."
)
"""Sent with the result of a call run with the approver's edits."""


class _CountersignTool(BaseTool):
    """A Countersign tool as ADK sees it: its declaration only. `CountersignPlugin` answers its calls
    before ADK would run it; run without the plugin, it refuses."""

    def __init__(self, tool: Tool) -> None:
        super().__init__(name=tool.name, description=tool.description, custom_metadata={_META: True})
        self._schema = tool.schema()

    def _get_declaration(self) -> types.FunctionDeclaration | None:
        return types.FunctionDeclaration(
            name=self.name, description=self.description, parameters_json_schema=self._schema
        )

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        raise TerminalError(
            f"tool {self.name!r} is a Countersign tool: give the app CountersignPlugin() after RestatePlugin()", 500
        )


def countersign_tools(tools: Sequence[str | Tool] | None = None) -> list[BaseTool]:
    """Countersign tools as ADK tools, for `LlmAgent(tools=...)`: `tools` names them (or gives them;
    default: every loaded tool). Only `CountersignPlugin` answers their calls."""
    return [_CountersignTool(tool) for tool in loaded_tools(tools, "countersign_tools")]


# The gate's records of each run (by run id) of one invocation, in order: what each approver sees as
# the run's earlier calls, and what `countersign_actions` returns. Rebuilt alike on a replay.
_TRAILS: weakref.WeakKeyDictionary[restate.Context, dict[str | None, list[ActionRecord]]] = weakref.WeakKeyDictionary()


def countersign_actions(ctx: restate.Context, run_id: str | None = None) -> list[ActionRecord]:
    """The gate's records of the Countersign calls this invocation made for `run_id` (None: the runs
    placed under the invocation id), in order: outcome, arguments run, who approved, result."""
    return list(_TRAILS.get(ctx, {}).get(run_id, []))


@dataclass(frozen=True)
class _Run:
    requester: str | None
    tenant: str
    run_id: str | None
    goal: str
    plan: ApprovedPlan | None = None


_CURRENT: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("countersign_adk_run", default=None)


async def run_gated(
    runner: Runner,
    *,
    requester: str,
    tenant: str = "default",
    run_id: str | None = None,
    goal: str = "",
    plan: ApprovedPlan | None = None,
    **run_async: Any,
) -> AsyncIterator[Event]:
    """`runner.run_async(**run_async)`'s events, with this run's facts for `CountersignPlugin`:
    `requester` (an email: told of outcomes), `tenant`, `run_id` (default: the invocation id; give a
    stable one so one action maps to one approval across invocations) and `goal` (default: the run's
    user message); `plan` (an `ApprovedPlan` from `request_plan_approval`, asked earlier in the
    handler) is handed to each `gated_call`: a call inside it runs without a new approval, one
    outside it is asked again or refused, as the plan says. A `TerminalError` raised under ADK (by the
    gate, or by a refused wiring) comes out as itself, not as the RuntimeError ADK wraps it in, so the
    invocation fails instead of retrying."""
    token = _CURRENT.set(_Run(requester, tenant, run_id, goal, plan))
    try:
        async for event in runner.run_async(**run_async):
            yield event
    except Exception as exc:
        terminal = _terminal_cause(exc)
        if terminal is None:
            raise
        raise terminal from None
    finally:
        _CURRENT.reset(token)


def _terminal_cause(exc: BaseException) -> TerminalError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, TerminalError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class CountersignPlugin(BasePlugin):
    """Gates each call of a Countersign tool through `gated_call`; place it after `RestatePlugin`.

    A run's `requester`, `tenant`, `run_id` and `goal` come from `run_gated`, else from these keyword
    arguments (see `run_gated`); its `plan` only from `run_gated`, as a plan is approved per run. The
    approver reads the model's words in the reply that made the call as its "why"."""

    def __init__(
        self,
        *,
        requester: str | None = None,
        tenant: str = "default",
        run_id: str | None = None,
        goal: str = "",
        name: str = "countersign",
    ) -> None:
        super().__init__(name=name)
        self._defaults = _Run(requester, tenant, run_id, goal)

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        """Reached only when no plugin before this one answered the model call, as `RestatePlugin`
        does (it makes the journaled call and returns its reply): so Restate's plugin comes after
        this one, or is missing. Either fails the run here, before any call of the reply is gated.
        (`_check_order` alone cannot tell for a reply's first call, whose turn is open from the start.)"""
        ctx = _restate_context()
        try:
            PluginState.from_context(callback_context.invocation_id, ctx)
        except RuntimeError:
            raise TerminalError(_NEEDS_RESTATE) from None
        raise TerminalError(_AFTER_RESTATE)

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        if not (tool.custom_metadata or {}).get(_META):
            return None  # not Countersign's: ADK runs it as usual
        ctx = _restate_context()
        _check_order(ctx, tool_context)
        facts = self._facts()
        run_id = facts.run_id
        trail = _TRAILS.setdefault(ctx, {}).setdefault(run_id, [])
        record = await gated_call(
            ctx,
            tool=tool.name,
            args=tool_args,
            requester=facts.requester or "",
            tenant=facts.tenant,
            why=_model_words(tool_context),
            goal=facts.goal or _text(tool_context.user_content),
            run_id=run_id,
            trail=trail,
            plan=facts.plan,
            asked_by="agent",
        )
        trail.append(record)
        return _response(record)

    def _facts(self) -> _Run:
        given, default = _CURRENT.get(), self._defaults
        facts = default
        if given is not None:
            facts = _Run(
                given.requester or default.requester,
                given.tenant,
                given.run_id or default.run_id,
                given.goal or default.goal,
                given.plan,
            )
        if not facts.requester:
            raise TerminalError(
                "CountersignPlugin needs a requester: iterate run_gated(runner, requester=..., ...), "
                "or pass CountersignPlugin(requester=...)",
                400,
            )
        return facts


def _response(record: ActionRecord) -> dict[str, Any]:
    """The gate's record as the tool's response the model reads next."""
    if record.args is None:  # not run
        return {"error": denial_message(record)}
    # It ran (a failed effect too: the model hears its error as the tool's result).
    result = dict(record.result or {})
    if record.outcome is Outcome.APPROVED_WITH_EDITS:
        # ADK's function response has no place for an edit: the executed arguments travel with it.
        return {"result": result, "executed_args": record.args, "note": EDIT_NOTE}
    return result


def _restate_context() -> restate.Context:
    ctx = current_context()
    if ctx is None:
        raise TerminalError("Countersign's ADK plugin runs only inside a Restate handler (with RestatePlugin)", 500)
    return ctx


def _check_order(ctx: restate.Context, tool_context: ToolContext) -> None:
    """Refuse to gate outside `RestatePlugin`: without it the model's replies are not journaled (a
    replay would ask a different question), and before it a gated call would skip its turn."""
    try:
        state = PluginState.from_context(tool_context.invocation_id, ctx)
    except RuntimeError:
        raise TerminalError(_NEEDS_RESTATE) from None
    turn = state.turnstile.events.get(tool_context.function_call_id or "")
    if turn is not None and not turn.is_set():
        raise TerminalError(_AFTER_RESTATE)


_NEEDS_RESTATE = "CountersignPlugin needs RestatePlugin() before it in App(plugins=[...])"
_AFTER_RESTATE = "CountersignPlugin must come after RestatePlugin() in App(plugins=[...])"


def _model_words(tool_context: ToolContext) -> str:
    """The model's own words in the reply that made the call (what the approver reads as `why`)."""
    call_id = tool_context.function_call_id
    for event in reversed(tool_context.session.events):
        parts = event.content.parts if event.content and event.content.parts else []
        if any(p.function_call is not None and p.function_call.id == call_id for p in parts):
            # Whole: the gate cuts it to the contract's bound, as it does every caller's.
            return _text(event.content).strip()
    return ""


def _text(content: types.Content | None) -> str:
    if content is None or not content.parts:
        return ""
    return " ".join(p.text for p in content.parts if p.text and not p.thought)
