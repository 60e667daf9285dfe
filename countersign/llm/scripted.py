"""The scripted model: deterministic and offline, for the demo and the tests.

Guarantee: it proposes the task's script steps in order, one per turn, then answers with what
happened to each; with no script it plans the demo goals it recognises from the goal text.
"""

from __future__ import annotations

import re

from countersign.contract import Plan, PlanStep, ScriptStep
from countersign.llm.base import AssistantTurn, ToolCall, ToolResult, ToolSpec, Transcript

_REFUND = re.compile(r"refund\s+order\s+#?(\d+)\s+for\s+\$?(\d+(?:\.\d{1,2})?)", re.IGNORECASE)
_DELETE = re.compile(r"delete\s+customer\s+(c_\d+)", re.IGNORECASE)


class ScriptedModel:
    model_id = "scripted"

    def __init__(self, script: list[ScriptStep] | None, plan: Plan | None = None) -> None:
        self._script = script
        self._plan = plan

    def propose_plan(self, transcript: Transcript, tools: list[ToolSpec]) -> Plan | None:
        """The task's scripted plan, or else one step per script call with its exact arguments."""
        if self._plan is not None:
            return self._plan
        steps = self._script if self._script is not None else plan(transcript.goal)
        calls = [call for step in steps for call in (step, *step.also)]
        if not calls:
            return None
        return Plan(steps=[PlanStep(tool=c.tool, args=c.args, why=c.why) for c in calls])

    def next_turn(self, transcript: Transcript, tools: list[ToolSpec]) -> AssistantTurn:
        steps = self._script if self._script is not None else plan(transcript.goal)
        results = transcript.results()
        group = next_group(steps, results)
        if not group:
            return AssistantTurn(text=answer(transcript))
        calls = [
            ToolCall(
                id=f"call_{len(results) + k}", name=step.tool, args=step.args, why=step.why, confidence=step.confidence
            )
            for k, step in enumerate(group)
        ]
        return AssistantTurn(tool_calls=calls)


def next_group(steps: list[ScriptStep], results: list[ToolResult]) -> list[ScriptStep]:
    """Walk the script along the results so far; a step and its `also` calls make one turn, and a
    rejected step with `if_rejected` proposes that next."""
    position, follow_up, consumed = 0, None, 0
    while consumed < len(results):
        current = follow_up or (steps[position] if position < len(steps) else None)
        if current is None:
            return []
        if follow_up is None:
            position += 1
        follow_up = current.if_rejected if results[consumed].outcome == "rejected" else None
        consumed += 1 + len(current.also)
    step = follow_up or (steps[position] if position < len(steps) else None)
    return [step, *step.also] if step else []


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
