"""The agent's trail as the approver sees it: the run's earlier calls, each in one short line.

Guarantee: pure and bounded (the last `MAX_STEPS` calls, each argument list and result cut to a
few hundred characters), built from journaled records only, so the frozen approval shows the same
trail on every replay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from countersign.contract import ActionRecord, TrailStep

MAX_STEPS = 10
MAX_ARGS = 160
MAX_RESULT = 200


def shorten(value: Any, limit: int) -> str:
    """`value` (text, or JSON of anything else) on one line of at most `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step_of(action: ActionRecord | TrailStep) -> TrailStep:
    if isinstance(action, TrailStep):
        return action.model_copy(
            update={"args": shorten(action.args, MAX_ARGS), "result": shorten(action.result, MAX_RESULT)}
        )
    result = action.result or {}
    shown: Any = f"error: {result['error']}" if "error" in result else result
    if not result and action.reason:
        shown = action.reason
    return TrailStep(
        index=action.index,
        tool=action.tool,
        outcome=str(action.outcome),
        args=shorten(action.args if action.args is not None else action.proposed_args, MAX_ARGS),
        result=shorten(shown, MAX_RESULT) if shown else "",
    )


def trail_of(actions: Sequence[ActionRecord | TrailStep]) -> list[TrailStep]:
    """The last `MAX_STEPS` of `actions`, oldest first, each shortened."""
    return [step_of(a) for a in list(actions)[-MAX_STEPS:]]
