"""The scripted model: deterministic and offline, for the demo and the tests.

Guarantee: it proposes the task's script steps in order, one per turn, then answers with what
happened to each; with no script it plans the demo goals it recognises from the goal text.
"""

from __future__ import annotations

import re

from handlers.contract import ScriptStep
from handlers.llm.base import AssistantTurn, ToolCall, ToolResult, ToolSpec, Transcript

_REFUND = re.compile(r"refund\s+order\s+#?(\d+)\s+for\s+\$?(\d+(?:\.\d{1,2})?)", re.IGNORECASE)
_DELETE = re.compile(r"delete\s+customer\s+(c_\d+)", re.IGNORECASE)


class ScriptedModel:
    model_id = "scripted"

    def __init__(self, script: list[ScriptStep] | None) -> None:
        self._script = script

    def next_turn(self, transcript: Transcript, tools: list[ToolSpec]) -> AssistantTurn:
        steps = self._script if self._script is not None else plan(transcript.goal)
        results = transcript.results()
        step = next_step(steps, results)
        if step is None:
            return AssistantTurn(text=answer(transcript))
        call = ToolCall(id=f"call_{len(results)}", name=step.tool, args=step.args, why=step.why)
        return AssistantTurn(tool_calls=[call])


def next_step(steps: list[ScriptStep], results: list[ToolResult]) -> ScriptStep | None:
    """Walk the script along the results so far: a rejected step with `if_rejected` proposes that next."""
    position, follow_up = 0, None
    for result in results:
        current = follow_up or (steps[position] if position < len(steps) else None)
        if current is None:
            return None
        if follow_up is None:
            position += 1
        follow_up = current.if_rejected if result.outcome == "rejected" else None
    if follow_up is not None:
        return follow_up
    return steps[position] if position < len(steps) else None


def plan(goal: str) -> list[ScriptStep]:
    if m := _REFUND.search(goal):
        order_id, amount = int(m.group(1)), m.group(2)
        return [
            ScriptStep(tool="lookup_order", args={"order_id": order_id}, why="Check the order before refunding."),
            ScriptStep(
                tool="issue_refund",
                args={"order_id": order_id, "amount_usd": amount, "reason": goal},
                why=f"The requester asked: {goal}",
            ),
        ]
    if m := _DELETE.search(goal):
        return [
            ScriptStep(tool="delete_customer", args={"customer_id": m.group(1), "reason": goal}, why=f"Asked: {goal}")
        ]
    return []


def answer(transcript: Transcript) -> str:
    results = transcript.results()
    if not results:
        return f"I have no plan for: {transcript.goal}"
    lines = []
    for r in results:
        detail = r.content.get("reason") or r.content.get("error") or r.content.get("result") or ""
        if edited := r.content.get("edited_by_approver"):
            detail = "approver changed " + ", ".join(
                f"{k} {v['proposed']} -> {v['approved']}" for k, v in edited.items()
            )
        lines.append(f"{r.name}: {r.outcome}" + (f" ({detail})" if detail else ""))
    return "Done. " + "; ".join(lines)
