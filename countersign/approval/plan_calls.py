"""Post-plan gating's steps: ask a person to approve a plan once, then run the calls inside it.

`countersign.approval.calls.request_plan_approval` is the public call built on these.

Guarantee: the caller's side is one journaled step (validate the plan, name its approvers, open the
first round) and one durable call to the same `Approval` workflow that decides single actions (act
`report`: a plan runs nothing itself), so a plan approval waits, reminds, expires, survives a crash
and is audited exactly as an action's. A call run inside the plan is one step of the caller's
journal under its own idempotency key, and its record and the plan's audit trail link the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import restate
from pydantic import BaseModel, ValidationError
from restate import RunOptions

from countersign.approval.gate import freeze_asked
from countersign.approval.handover import asked_alone
from countersign.approval.plan import (
    PLAN_TOOL,
    ApprovedPlan,
    OnDeviation,
    approved_plan,
    describe,
    editable_fields,
    plan_problem,
    plan_verdict,
)
from countersign.approval.rounds import Opening, open_round
from countersign.approval.run_state import RunBook, RunFacts
from countersign.approval.workflow import ApprovalRequest
from countersign.contract import ActionRecord, ApprovalRecord, Outcome, Plan
from countersign.events import emit as events
from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntry
from countersign.tools.execute import idempotency_key, run_tool
from countersign.tools.policy import PolicyError, PolicyVerdict, errors_text

_PLAN_STEP = RunOptions[Any](max_attempts=3, initial_retry_interval=timedelta(milliseconds=100))


class _PlanAsked(BaseModel):
    """The journaled answer of the caller's step: the validated plan and who approves it."""

    plan: dict[str, Any] | None = None
    verdict: PolicyVerdict | None = None
    opening: Opening | None = None
    error: str | None = None


def _ask_plan(raw: dict[str, Any], requester: str, tenant: str) -> _PlanAsked:
    try:
        plan = Plan.model_validate(raw)
    except ValidationError as exc:
        return _PlanAsked(error=f"invalid plan: {errors_text(exc)}")
    if (problem := plan_problem(plan)) is not None:
        return _PlanAsked(error=f"invalid plan: {problem}")
    try:
        verdict = plan_verdict(plan, requester=requester, tenant=tenant)
    except PolicyError as exc:
        return _PlanAsked(plan=plan.model_dump(mode="json"), error=f"not asked: {exc}")
    opening = open_round() if verdict.gated else None
    return _PlanAsked(plan=plan.model_dump(mode="json"), verdict=verdict, opening=opening)


def freeze_plan(facts: RunFacts, index: int, plan: dict[str, Any], why: str, asked: _PlanAsked) -> ApprovalRecord:
    """The approval record of a plan: frozen and digested like an action whose arguments are the plan."""
    assert asked.verdict is not None and asked.opening is not None
    parsed = Plan.model_validate(plan)
    return freeze_asked(
        facts,
        index,
        tool=PLAN_TOOL,
        kind="plan",
        args=plan,
        summary=describe(parsed),
        why=why or parsed.why,
        verdict=asked.verdict,
        opening=asked.opening,
        editable=editable_fields(parsed),
    )


async def ask_plan_approval(
    ctx: restate.Context,
    facts: RunFacts,
    plan: Plan | Mapping[str, Any],
    *,
    index: int,
    why: str = "",
    on_deviation: OnDeviation | None = None,
    book: RunBook | None = None,
) -> ApprovedPlan:
    """The plan's approval at `<run_id>-a<index>`; with `book` (an agent run), the run's status
    lists the approval while it waits and keeps its final record."""
    raw = plan.model_dump(mode="json") if isinstance(plan, Plan) else dict(plan)
    asked = await ctx.run_typed(
        f"ask plan #{index}", _ask_plan, _PLAN_STEP, raw=raw, requester=facts.requester, tenant=facts.tenant
    )
    if asked.error is not None or asked.plan is None:
        verdict = Outcome.INVALID if asked.plan is None else Outcome.FAILED
        return ApprovedPlan(verdict=verdict, reason=asked.error, index=index, on_deviation=on_deviation)
    if asked.opening is None:  # no step of it needs a person: followed as it is
        parsed = Plan.model_validate(asked.plan)
        return ApprovedPlan(
            verdict=Outcome.AUTONOMOUS, plan=parsed, proposed=parsed, index=index, on_deviation=on_deviation
        )
    record = freeze_plan(facts, index, asked.plan, why, asked)
    assert asked.verdict is not None
    request = ApprovalRequest(record=record, policy=asked.verdict, goal=facts.goal, model=facts.model, act="report")
    result = await asked_alone(ctx, request, book)
    return approved_plan(result.record, result.action.outcome, result.action.args, on_deviation=on_deviation)


async def run_in_plan(
    ctx: restate.Context,
    tool: str,
    args: dict[str, Any],
    plan: ApprovedPlan,
    *,
    run_id: str,
    index: int,
    tenant: str,
    requester: str,
    webhooks: bool = True,
    hold: Callable[[AuditEntry], None] | None = None,
) -> ActionRecord:
    """A call inside an approved plan: runs at once, as one step of the caller's journal, under
    `<run_id>/<index>`; its record names the plan's approval, whose audit trail gets an `executed`
    entry for it (sent at once, or given to `hold`, as `run_alone` does)."""
    run = await run_tool(
        ctx,
        tool,
        args,
        index,
        run_id=run_id,
        tenant=tenant,
        requester=requester,
        approval_id=plan.approval_id,
        approved_by=plan.approved_by,
    )
    action = ActionRecord(
        index=index,
        tool=tool,
        proposed_args=args,
        args=args,
        outcome=Outcome.APPROVED if run.ok else Outcome.FAILED,
        approved_by=plan.approved_by,
        result=run.result if run.ok else {"error": run.error},
        idempotency_key=idempotency_key(run_id, index),
        plan_approval_id=plan.approval_id,
    )
    if run.at is not None and plan.approval_id is not None:
        entry = AuditEntry(
            entry_id=f"executed/in-plan/{run_id}/{index}",
            approval_id=plan.approval_id,
            run_id=run_id,
            tenant=tenant,
            kind="executed",
            at=run.at,
            details={
                "in_plan": True,
                "index": index,
                "tool": tool,
                "args": args,
                "outcome": action.outcome.value,
                "result": action.result,
                "idempotency_key": action.idempotency_key,
            },
        )
        if hold is None:
            bookkeeping.send_entry(ctx, entry)
        else:  # the caller's own next bookkeeping call carries it
            hold(entry)
    if run.at is not None and webhooks:
        events.in_plan_executed(ctx, tenant, run_id, action, run.at)
    return action


def refused_deviation(tool: str, args: dict[str, Any], index: int, plan: ApprovedPlan, deviation: str) -> ActionRecord:
    """A gated call outside the plan, refused as the policy says: nothing runs; the model reads why."""
    return ActionRecord(
        index=index,
        tool=tool,
        proposed_args=args,
        outcome=Outcome.REJECTED,
        decision_source="system",
        reason=f"refused: outside the approved plan ({deviation})",
        plan_approval_id=plan.approval_id,
        deviation=deviation,
    )
