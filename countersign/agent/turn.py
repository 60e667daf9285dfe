"""The calls of one model turn: answered and routed by the gate's one path, run or gated, reported in order.

Each call is answered by `routing.ask` inside the model turn's journaled step (`ask_policy`) and
routed by `routing.route` here, as `gated_call` routes a call; the turn only adds batching: its
gated calls are asked together (one email per approver).

Guarantee: an unknown tool or invalid arguments become an `invalid` outcome the model can read,
never a crash; the policy's answers are computed inside the model turn's journaled step,
so neither a policy-file change nor an approver callable can re-route a replay; a policy that
cannot name approvers for a call fails that call (the model reads why) and never runs it; the gated
calls of one turn are asked together, and a question the model asks (`ask_a_person`) on its own, before
them; every call gets a stable index `base + position`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from countersign.approval import ledger, routing
from countersign.approval.autonomous import run_alone
from countersign.approval.batch import GatedCall, approve_and_act
from countersign.approval.plan import ApprovedPlan
from countersign.approval.plan_calls import refused_deviation, run_in_plan
from countersign.approval.question_calls import ask_with_tool
from countersign.approval.rounds import Opening
from countersign.approval.routing import NOT_RUN, Answer, Route
from countersign.approval.run_state import RunBook
from countersign.approval.standing import covering
from countersign.contract import ActionRecord
from countersign.llm.base import ToolCall
from countersign.tools import default_registry
from countersign.tools.context import ActionContext, read_facts
from countersign.tools.policy import PolicyVerdict


class RunMustFail(Exception):
    """A tool's policy says an unanswered approval fails the whole run."""


class PolicyAnswer(BaseModel):
    """The policy's part of the gate's answer (`routing.Answer`) for one call, as the model turn's
    step journals it (the turn keeps the call itself); a gated call's first round opens with it.
    `problem` (and no verdict) when the policy could not be resolved for the call."""

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
    return [
        None
        if call.problem is not None
        else _journaled(routing.ask(call.name, call.args, requester, tenant, call.confidence, results or {}))
        for call in calls
    ]


def _journaled(answer: Answer) -> PolicyAnswer | None:
    """The part of the gate's answer the model turn journals (the turn keeps the call itself)."""
    if answer.error is not None:
        return PolicyAnswer(problem=answer.error.removeprefix(NOT_RUN)) if answer.failed else None
    return PolicyAnswer(verdict=answer.verdict, opening=answer.opening)


def _recalled(call: ToolCall, journaled: PolicyAnswer | None) -> Answer:
    """The gate's answer for a call of the turn, from its journaled part: the arguments are validated
    again against the loaded tools (as when the policy was asked, unless a tool changed under a paused run)."""
    checked = routing.validate(call.name, call.args)
    if isinstance(checked, Answer):
        return checked
    tool, validated = checked
    args = validated.model_dump(mode="json")
    if journaled is None:  # only if the tool's schema changed under a paused run
        return Answer(error="the tool changed since this call was proposed; propose it again")
    if journaled.problem is not None or journaled.verdict is None:
        return Answer(args=args, error=NOT_RUN + (journaled.problem or "the policy gave no answer"), failed=True)
    return Answer(
        args=args,
        summary=tool.summary(validated),
        verdict=journaled.verdict,
        opening=journaled.opening,
        confidence=call.confidence,
        context=journaled.context,
    )


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


async def handle_turn(
    book: RunBook, calls: list[ToolCall], answers: list[PolicyAnswer | None], plan: ApprovedPlan | None = None
) -> list[ActionRecord]:
    """Every call of one turn, each with its outcome, in the order the model proposed them, each
    routed by `routing.route` (with the run's `plan`) as `gated_call` routes a call; the gated ones
    are asked together (`approve_and_act`)."""
    base = len(book.state.actions)
    done: dict[int, ActionRecord] = {}
    gated: list[GatedCall] = []
    routes: dict[int, Route] = {}
    state = book.state
    for position, (call, journaled) in enumerate(zip(calls, answers, strict=True)):
        index = base + position
        answer = _recalled(call, journaled)
        if plan is None:  # under the run's plan, the plan's own rules decide (a grant is never asked there)
            answer.grant = await covering(
                book.ctx,
                call.name,
                answer.verdict,
                answer.opening,
                answer.args,
                use_id=f"{state.run_id}/{index}",
                requester=state.requester,
                tenant=state.tenant,
            )
        routed = routes[index] = routing.route(answer, call.name, plan)
        if routed.kind in ("invalid", "failed"):
            done[index] = routing.unrun(call.name, index, answer, call.args)
            continue
        assert answer.verdict is not None
        if routed.kind == "refused":
            assert plan is not None and routed.why is not None
            done[index] = refused_deviation(call.name, answer.args, index, plan, routed.why)
        elif routed.kind == "question":  # asked on its own, before the turn's batch, and awaited
            assert answer.opening is not None
            done[index] = await ask_with_tool(
                book.ctx, state, index, answer.args, answer.verdict, answer.opening, call.why, book
            )
        elif routed.kind == "gated":
            assert answer.opening is not None
            gated.append(
                GatedCall(
                    tool=call.name,
                    index=index,
                    args=answer.args,
                    why=call.why,
                    summary=answer.summary,
                    verdict=answer.verdict,
                    opening=answer.opening,
                    deviation=routed.why,
                    confidence=answer.confidence,
                    context=answer.context,
                    grant_missed=answer.grant.missed if answer.grant is not None else None,
                )
            )
        elif routed.kind == "inside":
            assert plan is not None
            book.save()  # what `status` shows while the call runs: the phase, the pinned model
            done[index] = await run_in_plan(
                book.ctx,
                call.name,
                answer.args,
                plan,
                run_id=state.run_id,
                index=index,
                tenant=state.tenant,
                requester=state.requester,
                webhooks=answer.verdict.webhooks,
                hold=functools.partial(ledger.note, book),
            )
        else:  # autonomous, or covered by a standing approval (`granted`)
            book.save()  # as above; a gated call is saved with its record, when it is frozen
            done[index] = await run_alone(
                book.ctx,
                call.name,
                answer.args,
                state.run_id,
                index,
                state.tenant,
                state.requester,
                answer.verdict.version,
                answer.verdict.webhooks,
                hold=functools.partial(ledger.note, book),
                grant=answer.grant.grant if routed.kind == "granted" and answer.grant is not None else None,
            )
    failure = None
    if gated:
        for result in await approve_and_act(book, gated):
            done[result.action.index] = result.action
            routing.mark_deviation(result.action, plan, routes[result.action.index])
            if result.fail_run and failure is None:
                failure = f"{result.action.tool} #{result.action.index}: {result.action.reason}"
    actions = [done[base + position] for position in range(len(calls))]
    book.state.actions.extend(actions)
    book.save()
    if failure:
        raise RunMustFail(failure)
    return actions
