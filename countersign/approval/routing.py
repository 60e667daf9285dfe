"""The gate's one path for a call: one policy evaluation (`ask`), then one routing decision (`route`).

Every call goes this way, whoever makes it: the agent's model turn (`AgentRun`), `gated_call` and
`request_approval` from a user's handler, and the framework adapters (which call those two). The
callers differ only in how they act on the route: `gated_call` asks one approval, the agent asks a
turn's gated calls together (one email per approver).

Guarantee: `ask` is the only place that validates a call and evaluates its policy, and it runs
inside the caller's journaled step, so its answer (the validated arguments, the verdict, the first
round's nonce and time) is replayed, never recomputed; `route` reads only that answer and the plan,
so a replay takes the same branch. `route` decides in one order for every caller: an unknown tool or
invalid arguments (`invalid`), a policy that could not be resolved (`failed`), inside an approved
plan (`inside`: counted against it), a call the policy lets run alone (`autonomous`), a gated call
covered by a standing approval (`granted`; never under a plan, whose own rules decide), a gated call
outside the plan that the plan refuses (`refused`), else `gated` (with how it deviates, if it does).
A call of a tool that asks a person a question (`ask_a_person`, countersign.tools.asking) is not an
action: no plan bounds it and no standing approval answers it; gated, it is asked (`question`),
else it runs alone and asks nobody (`autonomous`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel, Field, ValidationError

from countersign.approval.grants import GrantCheck
from countersign.approval.plan import ApprovedPlan, route_call
from countersign.approval.rounds import Opening, open_round
from countersign.contract import MAX_TOOL_ARGS_BYTES, ActionRecord, Outcome
from countersign.events import emit as events
from countersign.tools import default_registry
from countersign.tools.asking import is_question_tool
from countersign.tools.context import ActionContext
from countersign.tools.policy import PolicyError, PolicyVerdict, evaluate
from countersign.tools.registry import Tool, validation_message

NOT_RUN = "not run: "
"""How the reason of a call whose policy failed begins."""


class Answer(BaseModel):
    """The gate's answer for one call: the validated call and what the policy says of it. Its fields
    are the shape `gated_call`'s policy step journals (see `countersign.approval.calls._Asked`)."""

    args: dict[str, Any] = Field(default_factory=dict)
    summary: str = ""
    verdict: PolicyVerdict | None = None
    opening: Opening | None = None
    error: str | None = None
    failed: bool = False
    """The call was valid but its policy could not be resolved (`failed`, not `invalid`)."""
    confidence: float | None = None
    context: ActionContext | None = None
    """The tool's facts for the approver, read in the policy's step when the policy gated the call
    (None: not read there; they are then read when the approval is frozen)."""
    grant: GrantCheck | None = None
    """Whether a standing approval covers the gated call (asked right after the policy's step, see
    countersign.approval.standing; None: not asked)."""


@dataclass(frozen=True)
class Route:
    """What happens to a call. `why`: the reason for `invalid` and `failed`, how the call deviates
    from the plan for `refused` and `gated` (None for a gated call that does not deviate)."""

    kind: Literal["invalid", "failed", "inside", "autonomous", "granted", "refused", "gated", "question"]
    why: str | None = None


def not_a_mapping(raw: object) -> Answer | None:
    """The answer for arguments that are not a mapping of names to values (None when they are);
    pure, so a caller may give it without a step."""
    if isinstance(raw, Mapping):
        return None
    return Answer(error=f"invalid arguments: expected an object of argument names and values, not {type(raw).__name__}")


def validate(tool_name: str, raw: Mapping[str, Any]) -> tuple[Tool, BaseModel] | Answer:
    """The loaded tool and the validated arguments, or the `invalid` answer that says why not."""
    tool = default_registry().get(tool_name)
    if tool is None:
        return Answer(error=f"unknown tool {tool_name!r}; available: {', '.join(default_registry().names())}")
    try:
        return tool, tool.validate(raw)
    except ValidationError as exc:
        return Answer(error=f"invalid arguments: {validation_message(exc)}")


def ask(
    tool_name: str,
    raw: object,
    requester: str,
    tenant: str,
    confidence: float | None = None,
    results: Mapping[str, Any] | None = None,
) -> Answer:
    """The one policy evaluation of a call (the body of a journaled step: it reads the loaded tools,
    the policy, the tenant's webhooks and, for a gated call, opens the first round: nonce and time)."""
    if (shape := not_a_mapping(raw)) is not None:
        return shape
    assert isinstance(raw, Mapping)
    checked = validate(tool_name, raw)
    if isinstance(checked, Answer):
        return checked
    tool, validated = checked
    args = validated.model_dump(mode="json")
    try:
        verdict = evaluate(
            tool.name,
            tool.policy,
            validated,
            requester=requester,
            tenant=tenant,
            confidence=confidence,
            results=results,
        )
    except PolicyError as exc:  # e.g. approvers from a callable that named nobody valid: nothing runs
        return Answer(args=args, error=f"{NOT_RUN}{exc}", failed=True)
    verdict.webhooks = events.wanted(tenant)
    opening = open_round() if verdict.gated else None
    return Answer(args=args, summary=tool.summary(validated), verdict=verdict, opening=opening, confidence=confidence)


def route(answer: Answer, tool: str, plan: ApprovedPlan | None = None) -> Route:
    """The one routing decision for a call, from its answer and the caller's approved plan (if any).
    Pure but for two things: it reads which loaded tool asks a question (`asks_a_person`), and a call
    `inside` the plan is counted against it (`route_call`)."""
    if answer.error is not None:
        return Route("failed" if answer.failed else "invalid", answer.error)
    if asks_a_person(tool):
        return Route("autonomous" if answer.opening is None else "question")
    placed = route_call(plan, answer.verdict, tool, answer.args)
    if placed.kind == "inside":
        return Route("inside")
    if answer.opening is None:
        return Route("autonomous")
    if plan is None and answer.grant is not None and answer.grant.grant is not None:
        return Route("granted")
    assert answer.verdict is not None
    # `own` (inside the plan's bounds, but the call needs a person of its own) is an ordinary approval.
    deviation = placed.why if placed.kind == "outside" else None
    if plan is not None and deviation is not None and plan.deviation_rule(answer.verdict.policy) == "refuse":
        return Route("refused", deviation)
    return Route("gated", deviation)


def asks_a_person(tool_name: str) -> bool:
    """Whether the loaded tool of this name asks a person a question (`ask_a_person`)."""
    tool = default_registry().get(tool_name)
    return tool is not None and is_question_tool(tool)


def unrun(tool: str, index: int, answer: Answer, raw: object) -> ActionRecord:
    """The record of an `invalid` or `failed` call: nothing ran; the model (or caller) reads why."""
    return ActionRecord(
        index=index,
        tool=tool,
        proposed_args=answer.args or proposed(raw),
        outcome=Outcome.FAILED if answer.failed else Outcome.INVALID,
        result={"error": answer.error},
    )


def mark_deviation(action: ActionRecord, plan: ApprovedPlan | None, routed: Route) -> None:
    """A gated call asked again as a deviation from `plan`: its record names the plan and how."""
    if plan is not None and routed.why is not None:
        action.plan_approval_id, action.deviation = plan.approval_id, routed.why


def proposed(args: object) -> dict[str, Any]:
    """What an outcome whose arguments did not validate carries back as `proposed_args`: the
    arguments as JSON when they are a mapping that pydantic writes as at most MAX_TOOL_ARGS_BYTES,
    else nothing (the reason says what was wrong). The caller returns the outcome as its own result,
    `model_dump(mode="json")`: arguments nested past pydantic's depth limit, or of a type it cannot
    write, would fail there, after the gate answered, and the invocation would retry forever."""
    if not isinstance(args, Mapping):
        return {}
    try:
        written = pydantic_core.to_json(dict(args))
    except ValueError:  # PydanticSerializationError: too deep, or a value it cannot write
        return {}
    if len(written) > MAX_TOOL_ARGS_BYTES:
        return {}
    loaded: dict[str, Any] = json.loads(written)
    return loaded
