"""The confidence a model reports in a tool call, for confidence-gated checkpoints.

Guarantee: a tool whose policy sets `gate_below_confidence` is offered to the model with one more,
optional argument, `confidence` (a number from 0 to 1); `take` moves it out of the call's arguments
into `ToolCall.confidence` inside the journaled model turn, so it is never validated, frozen, digested
or executed as an argument. A value that is not a number in 0..1 is dropped (then the call counts as
reporting none, which its policy treats as low). A tool whose own arguments already have a
`confidence` field keeps it as an argument and is not asked for one.
"""

from __future__ import annotations

import copy
from typing import Any

from countersign.llm.base import AssistantTurn, ToolSpec

PROPERTY = "confidence"
_SCHEMA = {
    "type": "number",
    "minimum": 0,
    "maximum": 1,
    "description": "How sure you are that this exact call, with these arguments, is right (0 to 1). "
    "Not passed to the tool; a low value stops the call for a person to review.",
}


def asking(parameters: dict[str, Any]) -> dict[str, Any] | None:
    """`parameters` (a JSON schema of the tool's arguments) with the optional `confidence` property
    added, or None when the tool has a `confidence` argument of its own."""
    properties = parameters.get("properties", {})
    if PROPERTY in properties:
        return None
    asked = copy.deepcopy(parameters)
    asked.setdefault("properties", {})[PROPERTY] = dict(_SCHEMA)
    return asked


def take(turn: AssistantTurn, tools: list[ToolSpec]) -> AssistantTurn:
    """The turn with each asked tool's `confidence` argument moved to `ToolCall.confidence`."""
    asked = {t.name for t in tools if t.confidence}
    calls = []
    for call in turn.tool_calls:
        if call.name in asked and PROPERTY in call.args:
            args = dict(call.args)
            raw = args.pop(PROPERTY)
            number = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
            reported = number if number is not None and 0.0 <= number <= 1.0 else None
            call = call.model_copy(update={"args": args, "confidence": reported})
        calls.append(call)
    return turn.model_copy(update={"tool_calls": calls})
