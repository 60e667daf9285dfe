"""Asking a model for a plan before it acts (post-plan gating), through the adapters' own tool calls.

Guarantee: a plan is read from one structured call, `submit_plan`, whose parameters are the `Plan`
schema, so the provider adapters need nothing new: they already send tool specs and parse tool
calls. A reply without that call, or whose arguments do not validate, is a `problem` the run tells
the model about, never an exception.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from countersign.contract import Plan
from countersign.llm.base import ChatModel, Feedback, ToolSpec, Transcript, bounded

SUBMIT_PLAN = "submit_plan"
PLAN_INSTRUCTION = (
    "Before you act, propose your plan: call submit_plan once with the ordered steps you intend, each "
    "a tool with its fixed arguments (args), the values a field may take (one_of), upper bounds of "
    "numbers (at_most) and how many calls (calls). A person approves the plan once; calls inside it "
    "then run without a new approval. Do not call any other tool in this reply."
)


class PlanReply(BaseModel):
    """The model's plan, or why none could be read from its reply."""

    plan: Plan | None = None
    problem: str | None = None


def plan_spec() -> ToolSpec:
    return ToolSpec(
        name=SUBMIT_PLAN,
        description="Propose the plan of tool calls you intend, for a person to approve once.",
        parameters=Plan.model_json_schema(),
        approval="the plan is approved by a person",
    )


def ask_for_plan(model: ChatModel, transcript: Transcript, tools: list[ToolSpec]) -> PlanReply:
    """One model turn that asks for a plan (the scripted model has its own `propose_plan`)."""
    propose = getattr(model, "propose_plan", None)
    if callable(propose):
        plan = propose(transcript, tools)
        return PlanReply(plan=plan) if isinstance(plan, Plan) else PlanReply(problem="no plan was proposed")
    asking = transcript.model_copy(update={"turns": [*transcript.turns, Feedback(text=PLAN_INSTRUCTION)]})
    reply = bounded(model.next_turn(asking, [*tools, plan_spec()]))
    call = next((c for c in reply.tool_calls if c.name == SUBMIT_PLAN), None)
    if call is None:
        return PlanReply(problem=f"the reply did not call {SUBMIT_PLAN}")
    if call.problem is not None:
        return PlanReply(problem=call.problem)
    try:
        return PlanReply(plan=Plan.model_validate(call.args))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        return PlanReply(problem=f"the plan is not valid: {where}: {first['msg']}")
