"""The gate's public calls, for any Restate handler: request_approval, gated_call, request_plan_approval,
and ask_person (a question with a typed answer, asked and awaited as an approval is).

Each call is answered by `routing.ask` (in its journaled step) and routed by `routing.route`, the
path the agent's turn takes too; this module only acts on the route.

Guarantee: the caller's side of an approval is one journaled step (validate the arguments, ask the
policy, open the first round: nonce and time) and one durable call to the `Approval` workflow, so a
replay re-routes nothing and a crash of the caller loses nothing: the approval waits in its own
workflow, and the caller, suspended on the call, resumes with its result on whatever process is
alive. Works the same from a Workflow, a Virtual Object or a Service.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, cast

import restate
from pydantic import BaseModel, Field
from restate import RunOptions, TerminalError

from countersign.approval.autonomous import run_alone
from countersign.approval.batch import ask_people
from countersign.approval.gate import Act, GateResult, freeze
from countersign.approval.plan import ApprovedPlan, OnDeviation
from countersign.approval.plan_calls import ask_plan_approval, refused_deviation, run_in_plan
from countersign.approval.question import AnswerModelError, form_of
from countersign.approval.question_calls import (
    M,
    PersonAnswer,
    Question,
    ask_question,
    ask_with_tool,
    default_answer,
    question_policy,
)
from countersign.approval.routing import Answer, ask, mark_deviation, not_a_mapping, proposed, route, unrun
from countersign.approval.run_state import RunBook, RunFacts, RunState
from countersign.approval.standing import covering
from countersign.approval.trail import trail_of
from countersign.approval.waiting import Waiter
from countersign.approval.workflow import ApprovalRequest
from countersign.approval.workflow import run as approval_run
from countersign.compact import Compact
from countersign.contract import (
    EMAIL_PATTERN,
    MAX_GOAL,
    MAX_WHY,
    NAME_PATTERN,
    ActionRecord,
    AskedBy,
    DecisionSource,
    Outcome,
    Plan,
    TrailStep,
    clipped,
)
from countersign.faults import crash_point
from countersign.observability import tracing
from countersign.security import links
from countersign.tools import default_registry
from countersign.tools.checkpoints import results_of
from countersign.tools.context import read_context, read_facts
from countersign.tools.policy import ChannelName
from countersign.tools.registry import Tool

__all__ = [
    "AnswerModelError",
    "ApprovalOutcome",
    "PersonAnswer",
    "ask_person",
    "gated_call",
    "request_approval",
    "request_plan_approval",
]


class ApprovalOutcome(BaseModel):
    """What `request_approval` returns: the verdict and, when approved, the arguments approved."""

    verdict: Outcome
    """approved, approved_with_edits, rejected, expired, cancelled, undeliverable, failed (the approved
    edits no longer validate), autonomous (the policy lets this call run alone), granted (a standing
    approval covers it: `approved_by` names who gave it), invalid (bad arguments)."""
    args: dict[str, Any] | None = None
    """The arguments to run: the frozen ones, or with the approver's edits (None unless approved)."""
    proposed_args: dict[str, Any] = Field(default_factory=dict)
    """The arguments as proposed; for arguments that did not validate, only what can be written back
    as JSON (see `_proposed`), else empty."""
    edits: dict[str, Any] | None = None
    approved_by: list[str] = Field(default_factory=list)
    reason: str | None = None
    decision_source: DecisionSource | None = None
    approval_id: str | None = None
    run_id: str
    index: int

    @property
    def approved(self) -> bool:
        return self.verdict in (Outcome.APPROVED, Outcome.APPROVED_WITH_EDITS, Outcome.AUTONOMOUS, Outcome.GRANTED)


class _Asked(Answer):
    """The journaled result of the caller's one step (`ask policy <tool> #<i>`): the gate's answer
    (`routing.Answer`, whose fields are this step's JSON shape; see countersign.compact)."""


_POLICY_STEP = RunOptions[Any](
    serde=Compact(_Asked), max_attempts=3, initial_retry_interval=timedelta(milliseconds=100)
)


async def _ask_and_read(
    tool_name: str,
    raw: dict[str, Any],
    requester: str,
    tenant: str,
    run_id: str,
    index: int,
    confidence: float | None = None,
    results: dict[str, Any] | None = None,
    facts: bool = True,
) -> _Asked:
    """The body of the policy step: the policy's answer (in a thread: an approver callable may
    block), then, for a gated call and with `facts`, the tool's facts on the event loop, where a
    tool's async functions run; in this step, they cost no round trip of their own before the email."""
    asked = _Asked(**dict(await asyncio.to_thread(ask, tool_name, raw, requester, tenant, confidence, results)))
    if asked.opening is not None and facts:
        asked.context = await read_facts(
            tool_name, asked.args, index, run_id=run_id, tenant=tenant, requester=requester
        )
    return asked


# Calls made by one invocation, in order: the default index of the next one. The count restarts
# with every attempt of the invocation and replays in the same order, so it is deterministic.
_CALLS: weakref.WeakKeyDictionary[restate.Context, int] = weakref.WeakKeyDictionary()


def _where(ctx: restate.Context, run_id: str | None, index: int | None) -> tuple[str, int]:
    if index is None:
        index = _CALLS.get(ctx, 0)
        _CALLS[ctx] = index + 1
    run_id = run_id or ctx.request().id
    # Refused before anything is sent: an approval whose link the pages refuse could only expire.
    if (problem := links.placement_problem(run_id, index)) is not None:
        raise TerminalError(problem, 400)
    return run_id, index


def _check_people(requester: str, tenant: str) -> None:
    if not re.fullmatch(EMAIL_PATTERN, requester):
        raise TerminalError(f"requester {requester[:80]!r} is not an email address", 400)
    if not re.fullmatch(NAME_PATTERN, tenant):
        raise TerminalError(f"tenant {tenant[:80]!r} must match {NAME_PATTERN}", 400)


def _tool_name(tool: object) -> str:
    """The name the policy step looks up. A name the process does not know is an answer of its own
    (an agent's model may guess one); a `Tool` object must be the one loaded under its name (the
    policy file may have changed its policy), else the caller's code is wrong: a terminal 400."""
    if isinstance(tool, str):
        return tool
    if not isinstance(tool, Tool):
        raise TerminalError(f"tool must be a tool's name or a countersign.Tool, not {type(tool).__name__}", 400)
    loaded = default_registry().get(tool.name)
    if loaded is None:
        raise TerminalError(
            f"tool {tool.name!r} is not loaded (loaded: {', '.join(default_registry().names())}): "
            "name it in COUNTERSIGN_TOOLS or give it to create_app(tools=...)",
            400,
        )
    if replace(tool, policy=loaded.policy) != loaded:
        raise TerminalError(f"tool {tool.name!r} differs from the tool loaded under that name: pass that one", 400)
    return tool.name


def _described(why: object, goal: object) -> tuple[str, str]:
    """`why` and `goal` as they are stored and shown: text (None is none), each cut to the contract's
    bound (`MAX_WHY`, `MAX_GOAL`, as an agent's task and script take them), the cut marked with "…".
    Cut, not refused: they tell the approver about the call but are never what is approved (the
    digest binds the arguments), and they are often the model's own words or a run's whole prompt,
    whose length should not fail the action. Anything but text is a terminal 400."""
    described = []
    for name, text, limit in (("why", why, MAX_WHY), ("goal", goal, MAX_GOAL)):
        if text is not None and not isinstance(text, str):
            raise TerminalError(f"{name} must be text, not {type(text).__name__}", 400)
        described.append(clipped(text or "", limit))
    return described[0], described[1]


async def _open(
    ctx: restate.Context,
    tool: str | Tool,
    args: Mapping[str, Any],
    requester: str,
    tenant: str,
    run_id: str | None,
    index: int | None,
    confidence: float | None = None,
    results: Mapping[str, Any] | Sequence[ActionRecord] | None = None,
    facts: bool = True,
    planned: bool = False,
) -> tuple[str, int, str, _Asked]:
    _check_people(requester, tenant)
    name = _tool_name(tool)
    where, at = _where(ctx, run_id, index)
    if (shape := not_a_mapping(args)) is not None:  # e.g. a list: an answer of its own, no step
        return where, at, name, _Asked(**dict(shape))
    earlier = results_of(results) if isinstance(results, Sequence) else dict(results or {})
    with tracing.step("policy", tool=name, run_id=where, tenant=tenant):
        asked = await ctx.run_typed(
            f"ask policy {name} #{at}",
            _ask_and_read,
            _POLICY_STEP,
            tool_name=name,
            raw=dict(args),
            requester=requester,
            tenant=tenant,
            run_id=where,
            index=at,
            confidence=confidence,
            results=earlier,
            facts=facts,
        )
    if not planned:  # under a plan, the plan's own rules decide (a grant is never asked there)
        asked.grant = await covering(
            ctx,
            name,
            asked.verdict,
            asked.opening,
            asked.args,
            use_id=f"{where}/{at}",
            requester=requester,
            tenant=tenant,
        )
        if asked.grant is not None and asked.grant.grant is not None:
            crash_point("crash-after-grant-use")  # the fault tests: a use counted, its effect not yet run
    return where, at, name, asked


async def _approval(
    ctx: restate.Context,
    facts: RunFacts,
    name: str,
    index: int,
    asked: _Asked,
    why: str,
    act: Act,
    trail: Sequence[ActionRecord | TrailStep],
    deviation: str | None = None,
) -> GateResult:
    assert asked.verdict is not None and asked.opening is not None
    tool = default_registry().get(name)
    assert tool is not None
    context = asked.context
    if context is None:  # not read in the policy step (see countersign.tools.context)
        context = await read_context(
            ctx, name, asked.args, index, run_id=facts.run_id, tenant=facts.tenant, requester=facts.requester
        )
    record = freeze(
        facts,
        tool,
        index,
        asked.args,
        why,
        asked.summary,
        asked.verdict,
        asked.opening,
        context=context,
        trail=trail_of(trail),
        confidence=asked.confidence,
    )
    record.deviation = deviation
    record.grant_missed = asked.grant.missed if asked.grant is not None else None
    # The request email goes out from this journal, so the approval's own start is not on the path
    # to it (the page waits, bounded, for the record if a person is faster than the workflow).
    # Never saved (the caller may be a Service, which keeps no state): it only carries the audit entries.
    book = RunBook(cast(restate.WorkflowContext, ctx), RunState(**facts.model_dump()))
    [delivered] = await ask_people(book, [Waiter(book, record, asked.verdict.policy)])
    request = ApprovalRequest(
        record=record, policy=asked.verdict, goal=facts.goal, model=facts.model, act=act, delivered=delivered
    )
    try:
        return await ctx.workflow_call(approval_run, key=record.approval_id, arg=request)
    except TerminalError as exc:
        # Restate runs a workflow once per key: this placement was asked before (its approval keeps
        # its own outcome, and nothing ran again). Say so in the caller's terms, not Restate's.
        if exc.status_code != 409:
            raise
        raise TerminalError(
            f"approval {record.approval_id} was already asked (run_id {record.run_id!r}, index {index}): "
            "a run_id and index place one approval, once; pass a new run_id or index to ask again",
            409,
        ) from None


async def request_approval(
    ctx: restate.Context,
    *,
    tool: str | Tool,
    args: Mapping[str, Any],
    requester: str,
    tenant: str = "default",
    why: str = "",
    goal: str = "",
    run_id: str | None = None,
    index: int | None = None,
    trail: Sequence[ActionRecord | TrailStep] = (),
    confidence: float | None = None,
    results: Mapping[str, Any] | Sequence[ActionRecord] | None = None,
    asked_by: AskedBy = "code",
) -> ApprovalOutcome:
    """Ask a person before `tool` runs with `args`, and wait (durably, for days if need be) for the
    decision. The policy of the tool decides whether to ask, whom, and how long to wait; nothing runs
    here: an approved outcome carries the arguments to run (edited by the approver, if allowed).

    `run_id` and `index` place the approval (its id is `<run_id>-a<index>`, the idempotency key of its
    effect `<run_id>/<index>`); by default the invocation id and the count of earlier calls.

    Checkpoints: `confidence` is what the model reported in this call (0..1; None: not reported) and
    `results` the earlier results of the same run (tool name -> result, or the earlier ActionRecords,
    whose latest result per tool counts), for a policy's `gate_below_confidence` and `checks`.

    `why` and `goal` are cut to 2,000 and 4,000 characters (`MAX_WHY`, `MAX_GOAL`). `asked_by` says
    who asks, for the email and page: `"code"` (your handler; the default) or `"agent"` (an agent
    proposed the call: they then say "An agent working for <requester>" and "the agent's words")."""
    why, goal = _described(why, goal)
    where, at, name, asked = await _open(ctx, tool, args, requester, tenant, run_id, index, confidence, results)
    base = ApprovalOutcome(verdict=Outcome.INVALID, run_id=where, index=at, proposed_args=asked.args or proposed(args))
    routed = route(asked, name)
    if routed.kind in ("invalid", "failed"):
        verdict = Outcome.FAILED if routed.kind == "failed" else Outcome.INVALID
        return base.model_copy(update={"verdict": verdict, "reason": routed.why})
    if routed.kind == "autonomous":
        return base.model_copy(update={"verdict": Outcome.AUTONOMOUS, "args": asked.args})
    if routed.kind == "question":
        raise TerminalError(f"{name} asks a person a question: call it with gated_call (or use ask_person)", 400)
    if routed.kind == "granted":
        assert asked.grant is not None and asked.grant.grant is not None
        grant = asked.grant.grant
        update: dict[str, Any] = {"verdict": Outcome.GRANTED, "args": asked.args, "approved_by": [grant.granted_by]}
        update.update(decision_source="grant", reason=f"standing approval {grant.grant_id}")
        return base.model_copy(update=update)
    facts = RunFacts(run_id=where, tenant=tenant, goal=goal, requester=requester, model="", asked_by=asked_by)
    result = await _approval(ctx, facts, name, at, asked, why, act="report", trail=trail)
    action = result.action
    return base.model_copy(
        update={
            "verdict": action.outcome,
            "args": action.args,
            "edits": action.edits,
            "approved_by": action.approved_by,
            "reason": action.reason,
            "decision_source": action.decision_source,
            "approval_id": action.approval_id,
        }
    )


async def gated_call(
    ctx: restate.Context,
    *,
    tool: str | Tool,
    args: Mapping[str, Any],
    requester: str,
    tenant: str = "default",
    why: str = "",
    goal: str = "",
    run_id: str | None = None,
    index: int | None = None,
    trail: Sequence[ActionRecord | TrailStep] = (),
    plan: ApprovedPlan | None = None,
    confidence: float | None = None,
    results: Mapping[str, Any] | Sequence[ActionRecord] | None = None,
    asked_by: AskedBy = "code",
) -> ActionRecord:
    """The whole gated action: policy, then (if it asks) the approval, the precondition re-check and
    the effect under its idempotency key `<run_id>/<index>`; the action's record (outcome, arguments as
    executed, result). A call the policy lets run alone runs at once, in the caller's own step.

    With `plan` (from `request_plan_approval`): a call inside the approved plan runs at once, linked
    to the plan's approval (`plan_approval_id`) and counted against it, unless a checkpoint stopped
    it or its tool needs a quorum or is high stakes for these arguments (then it is asked on its own,
    as without a plan, and not counted); a gated call outside it is a
    deviation, asked again (the email and page say how it deviates) or refused, as the plan says.
    `confidence` and `results` feed the policy's checkpoints, and `why`, `goal` and `asked_by` are as
    for `request_approval`."""
    why, goal = _described(why, goal)
    # Under a plan a gated call may run at once (inside it): its facts are read only if it is asked.
    where, at, name, asked = await _open(
        ctx,
        tool,
        args,
        requester,
        tenant,
        run_id,
        index,
        confidence,
        results,
        facts=plan is None,
        planned=plan is not None,
    )
    routed = route(asked, name, plan)
    if routed.kind in ("invalid", "failed"):
        return unrun(name, at, asked, args)
    assert asked.verdict is not None
    if routed.kind == "inside":
        assert plan is not None
        return await run_in_plan(
            ctx,
            name,
            asked.args,
            plan,
            run_id=where,
            index=at,
            tenant=tenant,
            requester=requester,
            webhooks=asked.verdict.webhooks,
        )
    if routed.kind == "autonomous":
        version, webhooks = asked.verdict.version, asked.verdict.webhooks
        return await run_alone(ctx, name, asked.args, where, at, tenant, requester, version, webhooks)
    if routed.kind == "granted":
        assert asked.grant is not None
        version, webhooks = asked.verdict.version, asked.verdict.webhooks
        grant = asked.grant.grant
        return await run_alone(ctx, name, asked.args, where, at, tenant, requester, version, webhooks, grant=grant)
    if routed.kind == "refused":
        assert plan is not None and routed.why is not None
        return refused_deviation(name, asked.args, at, plan, routed.why)
    facts = RunFacts(run_id=where, tenant=tenant, goal=goal, requester=requester, model="", asked_by=asked_by)
    if routed.kind == "question":
        assert asked.opening is not None
        return await ask_with_tool(ctx, facts, at, asked.args, asked.verdict, asked.opening, why)
    result = await _approval(ctx, facts, name, at, asked, why, act="execute", trail=trail, deviation=routed.why)
    mark_deviation(result.action, plan, routed)
    return result.action


async def request_plan_approval(
    ctx: restate.Context,
    *,
    plan: Plan | Mapping[str, Any],
    requester: str,
    tenant: str = "default",
    why: str = "",
    goal: str = "",
    run_id: str | None = None,
    index: int | None = None,
    on_deviation: OnDeviation | None = None,
    asked_by: AskedBy = "code",
) -> ApprovedPlan:
    """Ask a person to approve `plan` (an ordered list of intended calls with their arguments or
    bounds) once, and wait for the decision; the approver may drop steps or lower bounds and counts.
    Pass the result to `gated_call(plan=...)`: calls inside it then run without a new approval, and
    a gated call outside it is asked again or refused, as `on_deviation` (else each tool's
    `plan.on_deviation`, else `ask`) says. Placed as `request_approval` places an approval, and `why`,
    `goal` and `asked_by` as there."""
    why, goal = _described(why, goal)
    _check_people(requester, tenant)
    where, at = _where(ctx, run_id, index)
    facts = RunFacts(run_id=where, tenant=tenant, goal=goal, requester=requester, model="", asked_by=asked_by)
    return await ask_plan_approval(ctx, facts, plan, index=at, why=why, on_deviation=on_deviation)


async def ask_person(
    ctx: restate.Context,
    *,
    question: str,
    answer_model: type[M],
    to: Sequence[str],
    requester: str,
    default: M | None = None,
    deadline_seconds: int = 24 * 3600,
    reminders_seconds: Sequence[int] = (),
    escalate_after_seconds: int | None = None,
    escalate_to: Sequence[str] = (),
    channels: Sequence[ChannelName] = ("email",),
    approver_channels: Mapping[str, Sequence[ChannelName]] | None = None,
    slack_channel: str | None = None,
    tenant: str = "default",
    why: str = "",
    goal: str = "",
    run_id: str | None = None,
    index: int | None = None,
    asked_by: AskedBy = "code",
) -> PersonAnswer[M]:
    """Ask the people in `to` a question and wait (durably, for days if need be) for a typed answer:
    the emailed link opens a form made from `answer_model` (text, numbers, booleans, enums or
    Literals as choices, short lists of those); the answer is validated on the server and comes back
    as `PersonAnswer.answer`, an instance of `answer_model`. The first person to answer decides; one
    may decline with a reason instead. Reminders, escalation, cancel, reassign, the inbox and the
    audit trail are an approval's. At the deadline the question ends with `default` (if given:
    outcome `defaulted`), else `expired`.

    `channels`, `approver_channels` and `slack_channel` say how the question reaches each person, as
    a `ToolPolicy`'s do: by email (the default), in Slack (a message with the question and a link to
    its page, and a Decline button), or both; Slack needs `SLACK_BOT_TOKEN` and `SLACK_SIGNING_SECRET`.

    A model outside the form's subset raises `AnswerModelError` (a terminal 400) before anything is
    sent, and so do people, times or channels that are not valid (a terminal 400 that names them).
    Placed as `request_approval` places an approval, and `why`, `goal` and `asked_by` as there."""
    fields = form_of(answer_model)
    if not isinstance(question, str) or not question.strip():
        raise TerminalError("question must be text that says what to answer", 400)
    why, goal = _described(why, goal)
    _check_people(requester, tenant)
    policy = question_policy(
        to,
        deadline_seconds=deadline_seconds,
        reminders_seconds=tuple(reminders_seconds),
        escalate_after_seconds=escalate_after_seconds,
        escalate_to=escalate_to,
        has_default=default is not None,
        channels=channels,
        approver_channels=approver_channels,
        slack_channel=slack_channel,
    )
    asked = Question(clipped(question, MAX_WHY), fields, default_answer(answer_model, fields, default), policy, why)
    where, at = _where(ctx, run_id, index)
    facts = RunFacts(run_id=where, tenant=tenant, goal=goal, requester=requester, model="", asked_by=asked_by)
    return await ask_question(ctx, facts, answer_model, at, asked)
