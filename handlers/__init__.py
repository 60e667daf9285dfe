"""Countersign: durable, emailed human approval for AI agent actions, on Restate.

The public face: gate a tool call from any Restate handler with `request_approval` (decide only) or
`gated_call` (the whole action); everything else in the package may change between releases.
"""

from handlers.approval_calls import ApprovalOutcome, gated_call, request_approval

__all__ = ["ApprovalOutcome", "gated_call", "request_approval"]
