"""Countersign: durable, emailed human approval for AI agent actions, on Restate.

The public face. Define your own tools (load them with `COUNTERSIGN_TOOLS=package.module:ATTR`):

    from countersign import Tool, ToolPolicy

    TOOLS = [Tool(name="pay_invoice", description="Pay an invoice.", args_model=PayArgs,
                  effect=pay, policy=ToolPolicy(gated=True, when="amount > 1000",
                                                approvers=("finance@example.com",)))]

and gate a call from any Restate handler (Workflow, Virtual Object, Service):

    outcome = await request_approval(ctx, tool="pay_invoice", args=..., requester=...)   # decide only
    record = await gated_call(ctx, tool="pay_invoice", args=..., requester=...)          # the whole action
    plan = await request_plan_approval(ctx, plan={"steps": [...]}, requester=...)       # approve a plan once
    record = await gated_call(ctx, tool="pay_invoice", args=..., requester=..., plan=plan)  # inside it: no new approval

Serve them with the `countersign serve` command (settings from the environment), or build the ASGI
app in code: `create_app(Settings(...), services=[...], tools=[...])`, or `create_app()` to read and
check the environment as `serve` does. On AWS Lambda the function is `lambda_handler`.

Library calls never end the process: a problem the caller has to fix is a `CountersignError` (its
subclasses `SettingsError`, `ToolsError`, `PolicyError`, `ServicesError`), one line naming the setting
or tool; only the console commands turn it into an exit status.

Importing this package builds no Restate app and reads no settings; the gate's calls (which need the
Restate SDK) load on first use. Everything not listed in `__all__` may change between releases.
"""

from typing import TYPE_CHECKING, Any

from countersign.exceptions import CountersignError, ServicesError, SettingsError, ToolsError
from countersign.tools.asking import ask_a_person_tool
from countersign.tools.conditions import Condition
from countersign.tools.policy import (
    ApproverContext,
    ApproverSource,
    GrantPolicy,
    PlanPolicy,
    PolicyError,
    PolicyVerdict,
    ToolPolicy,
)
from countersign.tools.registry import EditRule, EffectContext, Registry, Tool, ToolError, load_tools

if TYPE_CHECKING:
    from countersign.approval.calls import (
        AnswerModelError,
        ApprovalOutcome,
        PersonAnswer,
        ask_person,
        gated_call,
        request_approval,
        request_plan_approval,
    )
    from countersign.approval.plan import ApprovedPlan
    from countersign.runtime.app import create_app
    from countersign.runtime.lambda_handler import handler as lambda_handler
    from countersign.settings import Settings, get_settings

_GATE = (
    "AnswerModelError",
    "ApprovalOutcome",
    "PersonAnswer",
    "ask_person",
    "gated_call",
    "request_approval",
    "request_plan_approval",
)

__all__ = [
    "AnswerModelError",
    "ApprovalOutcome",
    "ApprovedPlan",
    "ApproverContext",
    "ApproverSource",
    "Condition",
    "CountersignError",
    "EditRule",
    "EffectContext",
    "GrantPolicy",
    "PersonAnswer",
    "PlanPolicy",
    "PolicyError",
    "PolicyVerdict",
    "Registry",
    "ServicesError",
    "Settings",
    "SettingsError",
    "Tool",
    "ToolError",
    "ToolPolicy",
    "ToolsError",
    "ask_a_person_tool",
    "ask_person",
    "create_app",
    "gated_call",
    "get_settings",
    "lambda_handler",
    "load_tools",
    "request_approval",
    "request_plan_approval",
]


def __getattr__(name: str) -> Any:
    if name in _GATE:
        from countersign.approval import calls as approval_calls

        return getattr(approval_calls, name)
    if name == "ApprovedPlan":
        from countersign.approval.plan import ApprovedPlan

        return ApprovedPlan
    if name == "create_app":
        from countersign.runtime.app import create_app

        return create_app
    if name in ("Settings", "get_settings"):
        from countersign import settings

        return getattr(settings, name)
    if name == "lambda_handler":
        from countersign.runtime.lambda_handler import handler

        return handler
    raise AttributeError(f"module 'countersign' has no attribute {name!r}")
