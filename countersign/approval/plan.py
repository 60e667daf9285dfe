"""Post-plan gating: a plan of intended tool calls, frozen and approved once, then followed.

Guarantee: a plan is frozen like an action (its canonical JSON is the `args` of an approval record of
kind `plan`, digested like one) and decided through the same `Approval` workflow. An approver's edit
can only narrow it (drop a step, lower a bound or a count); anything else is refused with a message
and decides nothing. `route_call` lets a call run inside the plan only if it fits a step of the
approved plan with calls left AND nothing about the call itself needs a person anyway (a checkpoint
stopped it, its tool needs more than one approver, or it is high stakes for these arguments): a plan
never overrides a per-call check. Such a call is asked on its own (an ordinary approval, not
counted); every call outside the plan is a deviation, described in words. The counts are serialized
fields of the object (a loop that keeps its plan in state keeps them) and are rebuilt in the same
order on every replay, since they follow journaled answers only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from countersign.approval.edits import EditRejected
from countersign.contract import ApprovalRecord, Outcome, Plan, PlanStep
from countersign.tools import default_registry
from countersign.tools.policy import PolicyError, PolicyVerdict, ToolPolicy, errors_text, evaluate

PLAN_TOOL = "plan"
"""The `tool` of a plan's approval record (and of the plan's entry in a run's history)."""

OnDeviation = Literal["ask", "refuse"]
_DROP = {"drop", "on", "yes", "true", "1"}


def plan_problem(plan: Plan) -> str | None:
    """Why the plan cannot be approved as written (an unknown tool, a field its tool does not have)."""
    for number, step in enumerate(plan.steps, 1):
        tool = default_registry().get(step.tool)
        if tool is None:
            return f"step {number}: unknown tool {step.tool!r}; available: {', '.join(default_registry().names())}"
        fields = set(tool.args_model.model_fields)
        named = set(step.args) | set(step.one_of) | set(step.at_most)
        if unknown := sorted(named - fields):
            return f"step {number}: {step.tool} has no argument {', '.join(unknown)}"
    return None


def plan_verdict(plan: Plan, *, requester: str, tenant: str) -> PolicyVerdict:
    """Who approves a plan: the approvers of every gated tool it names (in order, each once), with
    the shortest of their deadlines, one approver deciding. Not gated when no step needs approval.
    Raises PolicyError when an approver callable cannot name anyone."""
    approvers: list[str] = []
    deadlines: list[int] = []
    first: ToolPolicy | None = None
    for step in plan.steps:
        tool = default_registry().get(step.tool)
        assert tool is not None  # plan_problem came first
        policy = tool.policy
        if not policy.gated:
            continue
        named = policy.approvers
        if policy.approvers_from is not None:  # named for the step's fixed arguments
            always = policy.model_copy(update={"when": None})
            named = evaluate(step.tool, always, dict(step.args), requester=requester, tenant=tenant).policy.approvers
        first = first or policy
        deadlines.append(policy.deadline_seconds)
        approvers += [a for a in named if a not in approvers]
    if first is None:
        return PolicyVerdict(gated=False, rule="plan: no step needs approval", policy=ToolPolicy())
    deadline = min(deadlines)
    try:
        policy = ToolPolicy(
            gated=True,
            approvers=tuple(approvers),
            deadline_seconds=deadline,
            reminders_seconds=tuple(r for r in first.reminders_seconds if r < deadline),
        )
    except ValidationError as exc:
        raise PolicyError(f"the plan's approvers are not valid: {errors_text(exc)}") from None
    rule = f"plan: approved once by {', '.join(approvers)}; calls inside it then run without a new approval"
    return PolicyVerdict(gated=True, rule=rule, policy=policy)


def describe(plan: Plan) -> str:
    """The plan in one line, for the subject, the inbox and the page's heading."""
    total = "1 call" if plan.total == 1 else f"{plan.total} calls"
    return f"Plan: {', '.join(step_text(s) for s in plan.steps)}; at most {total}"


def step_text(step: PlanStep) -> str:
    bounds = [f"{k} = {v}" for k, v in sorted(step.args.items())]
    bounds += [f"{k} in {', '.join(str(x) for x in v)}" for k, v in sorted(step.one_of.items())]
    bounds += [f"{k} ≤ {v}" for k, v in sorted(step.at_most.items())]
    if step.calls > 1:
        bounds.append(f"up to {step.calls} calls")
    return step.tool + (f" ({'; '.join(bounds)})" if bounds else "")


def editable_fields(plan: Plan) -> dict[str, str]:
    """What an approver may change, by form name: drop a step, lower a step's count or bound, or the total."""
    fields = {"max_calls": "may only go down"}
    for i, step in enumerate(plan.steps):
        fields[f"step.{i}.drop"] = "drop this step"
        fields[f"step.{i}.calls"] = "may only go down"
        for name in step.at_most:
            fields[f"step.{i}.at_most.{name}"] = "may only go down"
    return fields


def apply_plan_edits(frozen: Mapping[str, Any], edits: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the approved plan's JSON, the edits that changed something) for an approver's `edits` on the
    frozen plan; EditRejected (deciding nothing) for anything but a narrowing."""
    plan = Plan.model_validate(frozen)
    allowed = editable_fields(plan)
    steps = [s.model_copy(deep=True) for s in plan.steps]
    dropped: set[int] = set()
    changed: dict[str, Any] = {}
    max_calls = plan.total
    for key, raw in edits.items():
        value = raw.strip()
        if key not in allowed:
            raise EditRejected(f"{key} cannot be edited")
        parts = key.split(".")
        if key == "max_calls":
            new = _whole(value, "the total number of calls")
            if new != plan.total:
                if not 1 <= new < plan.total:
                    raise EditRejected(f"the total number of calls may only be lowered (was {plan.total})")
                max_calls = changed[key] = new
            continue
        i = int(parts[1])
        if parts[2] == "drop":
            if value.lower() in _DROP:
                dropped.add(i)
                changed[key] = True
            continue
        if parts[2] == "calls":
            new = _whole(value, f"the calls of step {i + 1}")
            if new != steps[i].calls:
                if not 1 <= new < steps[i].calls:
                    raise EditRejected(f"the calls of step {i + 1} may only be lowered (was {steps[i].calls})")
                steps[i].calls = changed[key] = new
            continue
        name = ".".join(parts[4:]) if len(parts) > 4 else parts[3]
        bound = _number(value, f"{name} of step {i + 1}")
        old = steps[i].at_most[name]
        if bound != old:
            if bound > old:
                raise EditRejected(f"{name} of step {i + 1} may only be lowered (was {old})")
            steps[i].at_most[name] = bound
            changed[key] = str(bound)
    kept = [s for i, s in enumerate(steps) if i not in dropped]
    if not kept:
        raise EditRejected("every step was dropped: reject the plan instead")
    approved = Plan(steps=kept, max_calls=min(max_calls, sum(s.calls for s in kept)), why=plan.why)
    return approved.model_dump(mode="json"), changed


def _whole(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise EditRejected(f"{what} must be a whole number, not {value[:40]!r}") from None


def _number(value: str, what: str) -> Decimal:
    try:
        number = Decimal(value.replace(",", "").removeprefix("$"))
    except InvalidOperation:
        raise EditRejected(f"{what} must be a number, not {value[:40]!r}") from None
    if not number.is_finite():
        raise EditRejected(f"{what} must be a finite number")
    return number


def _same(wanted: Any, value: Any) -> bool:
    if isinstance(wanted, bool) or isinstance(value, bool):
        return wanted is value
    try:
        return Decimal(str(wanted)) == Decimal(str(value))
    except InvalidOperation:
        return str(wanted) == str(value)


def _misfit(step: PlanStep, args: Mapping[str, Any]) -> str | None:
    """Why `args` do not fit `step` (None when they do)."""
    for name, wanted in step.args.items():
        if not _same(wanted, args.get(name)):
            return f"{name} {args.get(name)} is not the plan's {wanted}"
    for name, values in step.one_of.items():
        if not any(_same(v, args.get(name)) for v in values):
            return f"{name} {args.get(name)} is not one of the plan's {', '.join(str(v) for v in values)}"
    for name, bound in step.at_most.items():
        try:
            number = Decimal(str(args.get(name)))
        except InvalidOperation:
            return f"{name} {args.get(name)} is not a number under the plan's bound {bound}"
        if not number.is_finite() or number > bound:
            return f"{name} {args.get(name)} is above the plan's bound {bound}"
    return None


class ApprovedPlan(BaseModel):
    """What `request_plan_approval` returns: the plan's outcome and, when approved, the plan to follow.

    Pass it to `gated_call(plan=...)`: a call inside it runs without a new approval, linked to
    `approval_id`; a gated call outside it (a deviation) is asked again or refused (`on_deviation`)."""

    verdict: Outcome
    """approved, approved_with_edits, autonomous (no step needs approval), rejected, expired,
    cancelled, undeliverable, invalid (the plan names an unknown tool or argument), failed."""
    plan: Plan | None = None
    """The plan to follow (with the approver's edits); None unless approved."""
    proposed: Plan | None = None
    edits: dict[str, Any] | None = None
    approved_by: list[str] = Field(default_factory=list)
    reason: str | None = None
    approval_id: str | None = None
    index: int = 0
    on_deviation: OnDeviation | None = None
    """None: each tool's `plan.on_deviation`, else `ask`."""
    used: list[int] = Field(default_factory=list)
    """Calls run inside the plan so far, per step of `plan` (serialized, so a reloaded plan keeps them)."""

    @property
    def approved(self) -> bool:
        return self.plan is not None and self.verdict in (
            Outcome.APPROVED,
            Outcome.APPROVED_WITH_EDITS,
            Outcome.AUTONOMOUS,
        )

    def _counts(self) -> list[int]:
        steps = self.plan.steps if self.plan else []
        if len(self.used) != len(steps):
            self.used = [0] * len(steps)
        return self.used

    def _fit(self, tool: str, args: Mapping[str, Any]) -> int | str:
        """The step this call would use, or why it deviates."""
        if not self.approved or self.plan is None:
            return f"the plan was {self.verdict.value}, so no call is inside it"
        used = self._counts()
        if sum(used) >= self.plan.total:
            return f"more calls than the plan allows ({self.plan.total} in total)"
        misfits = []
        for i, step in enumerate(self.plan.steps):
            if step.tool != tool:
                continue
            misfit = _misfit(step, args)
            if misfit is None and used[i] < step.calls:
                return i
            misfits.append(misfit or f"step {i + 1} allows {step.calls} call{'s' if step.calls > 1 else ''}, all used")
        if not misfits:
            return f"{tool} is not in the plan"
        return "; ".join(misfits)

    def check(self, tool: str, args: Mapping[str, Any]) -> str | None:
        """None if a call of `tool` with these (validated) arguments fits the plan now; else how it
        deviates. Counts nothing."""
        fit = self._fit(tool, args)
        return fit if isinstance(fit, str) else None

    def admits(self, tool: str, args: Mapping[str, Any]) -> bool:
        return self.check(tool, args) is None

    def admit(self, tool: str, args: Mapping[str, Any]) -> str | None:
        """As `check`, and a call that fits is counted against its step (the gate calls this)."""
        fit = self._fit(tool, args)
        if isinstance(fit, str):
            return fit
        self._counts()[fit] += 1
        return None

    def deviation_rule(self, tool_policy: ToolPolicy) -> OnDeviation:
        if self.on_deviation is not None:
            return self.on_deviation
        return tool_policy.plan.on_deviation if tool_policy.plan is not None else "ask"

    def told(self) -> str:
        """What the model is told of the plan's outcome."""
        if self.approved and self.plan is not None:
            edited = f" with the approver's edits ({self.edits})" if self.edits else ""
            return (
                f"Your plan was {self.verdict.value}{edited}: {describe(self.plan)}. Calls inside it run "
                "without a new approval; a call outside it is a deviation and may be refused."
            )
        reason = f": {self.reason}" if self.reason else ""
        return f"Your plan was {self.verdict.value}{reason}. Every gated call is now outside the plan."


@dataclass(frozen=True)
class PlanRoute:
    """Where a call goes given the run's plan: `none` (no plan), `inside` (runs without its own
    approval, already counted), `own` (fits the plan but needs its own approval: `why` says why) or
    `outside` (a deviation: `why` says how)."""

    kind: Literal["none", "inside", "own", "outside"]
    why: str | None = None


def needs_own_approval(verdict: PolicyVerdict | None) -> str | None:
    """Why a call that fits a plan still needs its own approval (None: the plan's approval covers it):
    a checkpoint stopped it, its tool needs more than one approver, or it is high stakes for these
    arguments. A plan is approved by one person and confirms nothing, so it stands in for none of these."""
    if verdict is None or not verdict.gated:
        return None
    reasons = [stop.text for stop in verdict.stopped_because]
    if verdict.policy.quorum > 1:
        reasons.append(f"{verdict.policy.quorum} approvers")
    if verdict.high_stakes:
        reasons.append("high stakes")
    return f"needs its own approval: {'; '.join(reasons)}" if reasons else None


def route_call(
    plan: ApprovedPlan | None, verdict: PolicyVerdict | None, tool: str, args: Mapping[str, Any]
) -> PlanRoute:
    """The plan's part of `routing.route`, the one routing decision of every call (`verdict`: the
    call's journaled policy answer). A call is counted against the plan only when it is `inside`."""
    if plan is None:
        return PlanRoute("none")
    deviation = plan.check(tool, args)
    if deviation is not None:
        return PlanRoute("outside", deviation)
    if (own := needs_own_approval(verdict)) is not None:
        return PlanRoute("own", own)
    admitted = plan.admit(tool, args)
    assert admitted is None  # check said it fits, and nothing changed in between
    return PlanRoute("inside")


def approved_plan(record: ApprovalRecord, outcome: Outcome, args: dict[str, Any] | None, **extra: Any) -> ApprovedPlan:
    """The ApprovedPlan of a plan approval's final record (`args`: the approved plan's JSON)."""
    plan = Plan.model_validate(args) if args is not None else None
    return ApprovedPlan(
        verdict=outcome,
        plan=plan,
        proposed=Plan.model_validate(record.args),
        edits=record.edits,
        approved_by=record.approved_by,
        reason=record.reason,
        approval_id=record.approval_id,
        index=record.index,
        **extra,
    )
