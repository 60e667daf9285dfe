"""The calls of one model turn: validate each, ask the policy, run or gate, report in order.

Guarantee: an unknown tool or invalid arguments become an `invalid` outcome the model can read,
never a crash; the policy's answers are computed inside the model turn's journaled step (`ask_policy`),
so neither a policy-file change nor an approver callable can re-route a replay; a policy that
cannot name approvers for a call fails that call (the model reads why) and never runs it; the gated
calls of one turn are asked together; every call gets a stable index `base + position`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from countersign.approval import ledger
from countersign.approval.calls import GatedCall, approve_and_act, run_alone
from countersign.approval.plan import ApprovedPlan, route_call
from countersign.approval.plan_calls import refused_deviation, run_in_plan
from countersign.approval.rounds import Opening, open_round
from countersign.approval.run_state import RunBook
from countersign.contract import ActionRecord, Outcome
from countersign.events import emit as events
from countersign.llm.base import ToolCall
from countersign.tools import default_registry
from countersign.tools.context import ActionContext, read_facts
from countersign.tools.policy import PolicyError, PolicyVerdict, evaluate
from countersign.tools.registry import validation_message


class RunMustFail(Exception):
    """A tool's policy says an unanswered approval fails the whole run."""


class PolicyAnswer(BaseModel):
    """The policy's answer for one call; a gated call's first round opens with it. `problem` (and no
    verdict) when the policy could not be resolved for the call."""

    verdict: PolicyVerdict | None = None
    opening: Opening | None = None
    problem: str | None = None
    context: ActionContext | None = None
    """A gated call's facts for the approver, when read in the same step (see `read_gated_facts`)."""


def ask_policy(
    calls: list[ToolCall], *, requester: str = "", tenant: str = "", results: Mapping[str, Any] | None = None
) -> list[PolicyAnswer | None]:
    """The policy's answer for each call that reaches a tool (None for the others). Runs inside the
    journaled step that took the model turn: one round trip for the reply and what the policy says of it.
    `results` are the run's earlier results by tool name (for the policies' checks)."""
    return [_answer(call, requester, tenant, results or {}) for call in calls]


async def read_gated_facts(
    calls: list[ToolCall],
    answers: list[PolicyAnswer | None],
    *,
    run_id: str,
    base: int,
    tenant: str,
    requester: str,
    planned: bool,
) -> None:
    """Give each call the policy gates its tool's facts (`answers` in place), inside the model turn's
    step: the facts then cost no round trip of their own before the request email. Not when some
    call of the turn runs before its approvals are asked (one that runs alone, or any under the run's
    approved plan, `planned`): it may change what the facts say, so they are read after it, when the
    approvals are frozen. Call `i` has index `base + i`, as in `handle_turn`."""
    if planned or any(a is not None and a.verdict is not None and a.opening is None for a in answers):
        return
    for position, (call, answer) in enumerate(zip(calls, answers, strict=True)):
        tool = default_registry().get(call.name)
        if answer is None or answer.opening is None or tool is None:
            continue
        args = tool.validate(call.args).model_dump(mode="json")  # it validated when the policy was asked
        answer.context = await read_facts(
            call.name, args, base + position, run_id=run_id, tenant=tenant, requester=requester
        )


def _answer(call: ToolCall, requester: str, tenant: str, results: Mapping[str, Any]) -> PolicyAnswer | None:
    tool = default_registry().get(call.name)
    if call.problem is not None or tool is None:
        return None
    try:
        args = tool.validate(call.args)
    except ValidationError:
        return None
    try:
        verdict = evaluate(
            call.name,
            tool.policy,
            args,
            requester=requester,
            tenant=tenant,
            confidence=call.confidence,
            results=results,
        )
    except PolicyError as exc:
        return PolicyAnswer(problem=str(exc))
    verdict.webhooks = events.wanted(tenant)
    return PolicyAnswer(verdict=verdict, opening=open_round() if verdict.gated else None)


async def handle_turn(
    book: RunBook, calls: list[ToolCall], answers: list[PolicyAnswer | None], plan: ApprovedPlan | None = None
) -> list[ActionRecord]:
    """Every call of one turn, each with its outcome, in the order the model proposed them. With the
    run's `plan`, a call inside it runs at once (linked to the plan) unless it needs its own approval
    (`route_call`); a gated call outside it is a deviation, asked again with what deviates, or
    refused, as the plan's policy says."""
    base = len(book.state.actions)
    done: dict[int, ActionRecord] = {}
    gated: list[GatedCall] = []
    deviations: dict[int, str] = {}
    for position, (call, answer) in enumerate(zip(calls, answers, strict=True)):
        index = base + position
        tool = default_registry().get(call.name)
        if tool is None:
            known = ", ".join(default_registry().names())
            done[index] = _invalid(call, index, f"unknown tool {call.name!r}; available: {known}")
            continue
        try:
            validated = tool.validate(call.args)
        except ValidationError as exc:
            done[index] = _invalid(call, index, f"invalid arguments: {validation_message(exc)}")
            continue
        args = validated.model_dump(mode="json")
        if answer is None:  # only if the tool's schema changed under a paused run
            done[index] = _invalid(call, index, "the tool changed since this call was proposed; propose it again")
            continue
        if answer.problem is not None or answer.verdict is None:
            done[index] = ActionRecord(
                index=index,
                tool=call.name,
                proposed_args=args,
                outcome=Outcome.FAILED,
                result={"error": f"not run: {answer.problem or 'the policy gave no answer'}"},
            )
            continue
        state = book.state
        route = route_call(plan, answer.verdict, call.name, args)
        if route.kind == "inside":
            assert plan is not None
            book.save()  # what `status` shows while the call runs: the phase, the pinned model
            done[index] = await run_in_plan(
                book.ctx,
                call.name,
                args,
                plan,
                run_id=state.run_id,
                index=index,
                tenant=state.tenant,
                requester=state.requester,
                webhooks=answer.verdict.webhooks,
                hold=functools.partial(ledger.note, book),
            )
            continue
        # `own`: inside the plan's bounds, but the call needs a person of its own; it is asked as an
        # ordinary approval (its checkpoint reasons, quorum and confirmation show as for any call).
        if route.kind == "outside" and route.why is not None and answer.opening is not None:
            assert plan is not None
            if plan.deviation_rule(answer.verdict.policy) == "refuse":
                done[index] = refused_deviation(call.name, args, index, plan, route.why)
                continue
            deviations[index] = route.why
        if answer.opening is not None:
            gated.append(
                GatedCall(
                    tool=call.name,
                    index=index,
                    args=args,
                    why=call.why,
                    summary=tool.summary(validated),
                    verdict=answer.verdict,
                    opening=answer.opening,
                    deviation=deviations.get(index),
                    confidence=call.confidence,
                    context=answer.context,
                )
            )
            continue
        book.save()  # as above; a gated call is saved with its record, when it is frozen
        done[index] = await run_alone(
            book.ctx,
            call.name,
            args,
            state.run_id,
            index,
            state.tenant,
            state.requester,
            answer.verdict.version,
            answer.verdict.webhooks,
            hold=functools.partial(ledger.note, book),
        )
    failure = None
    if gated:
        for result in await approve_and_act(book, gated):
            done[result.action.index] = result.action
            if plan is not None and result.action.index in deviations:
                result.action.plan_approval_id = plan.approval_id
                result.action.deviation = deviations[result.action.index]
            if result.fail_run and failure is None:
                failure = f"{result.action.tool} #{result.action.index}: {result.action.reason}"
    actions = [done[base + position] for position in range(len(calls))]
    book.state.actions.extend(actions)
    book.save()
    if failure:
        raise RunMustFail(failure)
    return actions


def _invalid(call: ToolCall, index: int, message: str) -> ActionRecord:
    return ActionRecord(
        index=index, tool=call.name, proposed_args=call.args, outcome=Outcome.INVALID, result={"error": message}
    )
