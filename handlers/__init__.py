"""Countersign: durable, emailed human approval for AI agent actions, on Restate.

The public API for defining your own tools (load them with `COUNTERSIGN_TOOLS=package.module:ATTR`):

    from handlers import Tool, ToolPolicy

    TOOLS = [Tool(name="pay_invoice", description="Pay an invoice.", args_model=PayArgs,
                  effect=pay, policy=ToolPolicy(gated=True, when="amount > 1000",
                                                approvers=("finance@example.com",)))]

Importing this package builds no Restate app and reads no settings.
"""

from handlers.policy import ApproverContext, ApproverSource, Condition, PolicyError, PolicyVerdict, ToolPolicy
from handlers.tools.registry import EditRule, EffectContext, Registry, Tool, ToolError, load_tools

__all__ = [
    "ApproverContext",
    "ApproverSource",
    "Condition",
    "EditRule",
    "EffectContext",
    "PolicyError",
    "PolicyVerdict",
    "Registry",
    "Tool",
    "ToolError",
    "ToolPolicy",
    "load_tools",
]
