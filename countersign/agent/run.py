"""`AgentRun`: one agent run as a Restate workflow (key = run id).

Guarantee: every model turn, policy answer, email and tool effect is a journaled step, so a run
resumes after any crash or restart without repeating what already happened; the loop is bounded by
`AGENT_MAX_TURNS`, a model turn's retries by `MODEL_MAX_ATTEMPTS` and malformed replies in a row by
`MODEL_MAX_MALFORMED_TURNS`; a malformed task ends at once with a 400 carrying the validation message.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import restate
from pydantic import BaseModel, ValidationError
from restate import RunOptions, TerminalError, WorkflowContext, WorkflowSharedContext
from restate.exceptions import RetryableError
from restate.serde import Serde

from countersign import retention
from countersign.agent.turn import PolicyAnswer, RunMustFail, ask_policy, handle_turn, read_gated_facts
from countersign.approval import ledger
from countersign.approval.plan import PLAN_TOOL, ApprovedPlan
from countersign.approval.plan_calls import ask_plan_approval
from countersign.approval.run_state import RunBook, RunState, load_header, load_run, pending_ids
from countersign.approval.slots import complete
from countersign.approval.verdict import cancel_promise, cancel_value
from countersign.approval.workflow import cancel_approval, pending_of, run_status
from countersign.approval.workflow import decide as approval_decide
from countersign.approval.workflow import delivery_failed as approval_delivery_failed
from countersign.approval.workflow import reassign as approval_reassign
from countersign.approval.workflow import status as approval_status
from countersign.compact import Compact
from countersign.contract import (
    ActionRecord,
    AgentTask,
    ApprovalRecord,
    CancelReceipt,
    CancelRequest,
    Decision,
    DecisionReceipt,
    ModelRetiredChoice,
    ModelSwitch,
    Outcome,
    ReassignReceipt,
    ReassignRequest,
    RunResult,
    RunStatus,
    Successor,
)
from countersign.errors import is_cancellation
from countersign.events import emit as events
from countersign.faults import delay_point
from countersign.inputs import Body, validation_summary
from countersign.llm import ModelUnavailable, check_model, confidence, load_model
from countersign.llm.base import (
    AssistantTurn,
    Feedback,
    ModelRetired,
    ProviderBusy,
    ProviderRefused,
    ToolCall,
    ToolResult,
    ToolSpec,
    Transcript,
    bounded,
)
from countersign.llm.planning import SUBMIT_PLAN, PlanReply, ask_for_plan
from countersign.llm.prompt import EMPTY_REPLY
from countersign.objects.audit import AuditEntry
from countersign.objects.delivery import DeliveryFailure
from countersign.security import links
from countersign.security.links import LinkInvalid
from countersign.security.redact import clean_failures, scrubbed
from countersign.settings import get_settings
from countersign.tools import default_registry
from countersign.tools.checkpoints import results_of


class TaskSerde(Serde[AgentTask]):
    """Parses `AgentTask`, turning a validation failure into a refused task instead of an exception
    (the SDK would wrap it as a 500); `run` then ends with a 400 that carries the message."""

    def deserialize(self, buf: bytes) -> AgentTask | None:
        try:
            return AgentTask.model_validate_json(buf or b"null")
        except ValidationError as exc:
            return AgentTask.refused(validation_summary("AgentTask", exc))

    def serialize(self, obj: AgentTask | None) -> bytes:
        return obj.model_dump_json().encode() if obj is not None else b""


agent_run = restate.Workflow(
    "AgentRun",
    description="An agent run that stops for a person's emailed approval before gated tool calls.",
    invocation_context_managers=[clean_failures],
)


def _tool_specs() -> list[ToolSpec]:
    specs = []
    for t in default_registry():
        # A tool whose policy gates on the model's confidence asks the model for it (an optional argument).
        asked = confidence.asking(t.schema()) if t.policy.gate_below_confidence is not None else None
        specs.append(
            ToolSpec(
                name=t.name,
                description=t.description,
                parameters=asked or t.schema(),
                approval=t.policy.describe(t.name),
                gated=t.policy.gated,
                confidence=asked is not None,
            )
        )
    return specs


def _model_retries() -> RunOptions[Any]:
    """How one model turn is journaled (compactly: see countersign.compact) and retried: exponential
    from 1 s (or the provider's retry-after), bounded."""
    return RunOptions[Any](
        serde=Compact(Turn),
        max_attempts=get_settings().model_max_attempts,
        initial_retry_interval=timedelta(seconds=1),
        max_retry_interval=timedelta(seconds=30),
        max_duration=timedelta(minutes=15),
    )


class Retired(BaseModel):
    """The model was gone on this turn (provider 404), and what the run's (or policy's) choice says."""

    detail: str
    choice: ModelRetiredChoice
    successor_problem: str | None = None
    """Why the named successor cannot be used (not a known model id, no key for its provider)."""


class Turn(BaseModel):
    """One journaled model turn: the model that answered (pinned by the first turn), its reply, and
    the policy's answer for each of the reply's tool calls; or, when the run asks for a plan first,
    the model's plan (`plan`, and an empty reply); or, when the model was gone, `retired`."""

    model: str
    reply: AssistantTurn
    policies: list[PolicyAnswer | None]
    plan: PlanReply | None = None
    retired: Retired | None = None
    webhooks: bool = True
    """Whether the tenant had webhook endpoints then (decides whether the run's end is sent)."""


def _wants_plan(task: AgentTask) -> bool:
    """Post-plan gating: asked for by the task, or by the policy of a loaded tool."""
    return task.plan is not None or any(t.policy.plan is not None for t in default_registry())


@scrubbed
def _model_turn(
    model_id: str | None,
    task: AgentTask,
    transcript: Transcript,
    results: dict[str, Any] | None = None,
    last_gated: str | None = None,
    planning: bool = False,
) -> Turn:
    """One model turn (the body of a journaled step): final refusals end the step, the rest retry.
    A retired model is an answer, not a failure: the choice of what follows is journaled with it.
    With `planning`, a run that wants a plan (decided here, so a replay takes the same branch) asks
    the model for one instead. The turn also journals whether the tenant has webhooks now."""
    model_id = model_id or _pick_model(task.model)
    webhooks = events.wanted(task.tenant)
    try:
        specs = _tool_specs()
        if planning and _wants_plan(task):
            model = load_model(model_id, task.script, task.plan.script if task.plan else None)
            plan = ask_for_plan(model, transcript, specs)
            return Turn(model=model_id, reply=AssistantTurn(), policies=[], plan=plan, webhooks=webhooks)
        reply = bounded(confidence.take(load_model(model_id, task.script).next_turn(transcript, specs), specs))
        return Turn(
            model=model_id,
            reply=reply,
            policies=ask_policy(reply.tool_calls, requester=task.requester, tenant=task.tenant, results=results),
            webhooks=webhooks,
        )
    except ModelRetired as exc:
        choice = retired_choice(task.on_model_retired, last_gated)
        problem = None
        if isinstance(choice, Successor):
            try:
                check_model(choice.successor)
            except ModelUnavailable as unavailable:
                problem = str(unavailable)
        return Turn(
            model=model_id,
            reply=AssistantTurn(),
            policies=[],
            retired=Retired(detail=exc.message, choice=choice, successor_problem=problem),
            webhooks=webhooks,
        )
    except (ProviderRefused, ModelUnavailable) as exc:
        raise TerminalError(str(exc), 400) from None
    except ProviderBusy as exc:
        if exc.retry_after:
            raise RetryableError(exc.message, 503, timedelta(seconds=exc.retry_after)) from None
        raise


async def _turn_step(run_id: str, base: int, planned: bool, task: AgentTask, **turn: Any) -> Turn:
    """The body of a model turn's journaled step: the turn (in a thread: the model clients block),
    then, on the event loop where a tool's async functions run, the facts of the calls the policy
    gates (see `read_gated_facts`; `planned`: the run has an approved plan). Call `i` of the reply
    gets index `base + i`."""
    taken = await asyncio.to_thread(_model_turn, task=task, **turn)
    await read_gated_facts(
        taken.reply.tool_calls,
        taken.policies,
        run_id=run_id,
        base=base,
        tenant=task.tenant,
        requester=task.requester,
        planned=planned,
    )
    return taken


def retired_choice(run_choice: ModelRetiredChoice | None, tool: str | None) -> ModelRetiredChoice:
    """What follows a retired model: the run's own choice, else the policy of the tool whose approval
    the run last asked for, else "end". For a user's own loop too (pass the tool it last gated)."""
    if run_choice is not None:
        return run_choice
    found = default_registry().get(tool) if tool else None
    return (found.policy.on_model_retired if found else None) or "end"


def _pick_model(requested: str | None) -> str:
    return requested or get_settings().model


def _check_task(run_id: str, task: AgentTask) -> None:
    if task.refusal:
        raise TerminalError(task.refusal, 400)
    if not links.RUN_ID.match(run_id):
        raise TerminalError("run id must be 1-128 characters of A-Z a-z 0-9 . _ : - (starting alphanumeric)", 400)
    if task.model is not None:
        try:
            check_model(task.model)
        except ModelUnavailable as exc:
            raise TerminalError(str(exc), 400) from None
    if task.script is not None and (task.model or "scripted") != "scripted":
        raise TerminalError("script is only for the scripted model", 400)
    if isinstance(task.on_model_retired, Successor):
        try:
            check_model(task.on_model_retired.successor)
        except ModelUnavailable as exc:
            raise TerminalError(f"on_model_retired: {exc}", 400) from None


@agent_run.main(
    name="run", input_serde=TaskSerde(), workflow_retention=retention.RUN, journal_retention=retention.RUN_JOURNAL
)
async def run(ctx: WorkflowContext, task: AgentTask) -> RunResult:
    """Run the agent loop until the model answers, the run is cancelled, or the turn budget ends."""
    _check_task(ctx.key(), task)
    book = RunBook(
        ctx,
        RunState(
            run_id=ctx.key(), tenant=task.tenant, goal=task.goal, requester=task.requester, model=task.model or ""
        ),
    )
    book.save()
    try:
        return await _agent_loop(ctx, task, book)
    except TerminalError:
        # A hard cancel, or a failure: what was audited until now (the entries of calls that ran alone
        # among it, held for the run's next bookkeeping call) still reaches the trail.
        ledger.flush(book)
        raise


async def _agent_loop(ctx: WorkflowContext, task: AgentTask, book: RunBook) -> RunResult:
    model_id = task.model
    transcript = Transcript(goal=task.goal, requester=task.requester)
    cancel = cancel_promise(ctx)

    malformed = 0
    planned = False  # the run has its plan (or needs none)
    plan: ApprovedPlan | None = None
    answered = False  # whether the current model has answered in this run (a 404 after is a retirement)
    for turn in range(get_settings().agent_max_turns):
        book.state.phase = "planning"
        # Asked before the model turn and answered alongside it: no round trip of its own.
        cancel_asked = cancel.peek()
        try:
            taken = await ctx.run_typed(
                f"model turn {turn}",
                _turn_step,
                _model_retries(),
                run_id=book.state.run_id,
                base=len(book.state.actions),
                planned=plan is not None,
                model_id=model_id,
                task=task,
                transcript=transcript,
                planning=not planned,
                results=results_of(book.state.actions),
                last_gated=_last_gated(book),
            )
            book.state.webhooks = taken.webhooks
        except TerminalError as exc:
            if is_cancellation(exc):
                raise
            retried = "" if exc.status_code == 400 else f" (gave up after {get_settings().model_max_attempts} attempts)"
            if not book.state.model:
                book.state.model = await ctx.run_typed("pin model", _pick_model, requested=task.model)
            return _finish(book, "failed", f"The model call failed{retried}: {exc.message}")
        if taken.retired is not None:
            if (request := await cancel_asked) is not None:
                return _finish(book, "cancelled", f"Cancelled: {request.reason}")
            if not answered and not book.state.model_switches:  # never answered: a wrong name, as before
                book.state.model = taken.model
                return _finish(book, "failed", f"The model call failed: {taken.retired.detail}")
            successor = _after_retirement(book, turn, taken.model, taken.retired)
            if successor is None:
                return _finish(book, "model_retired", _retired_answer(book))
            model_id, answered = successor, False
            continue
        answered = True
        model_id = book.state.model = taken.model
        if (request := await cancel_asked) is not None:
            return _finish(book, "cancelled", f"Cancelled: {request.reason}")
        if taken.plan is not None and not planned:
            plan, unusable = await _plan_approval(book, task, taken.plan)
            if plan is not None and plan.verdict is Outcome.CANCELLED:
                return _finish(book, "cancelled", f"Cancelled while waiting for the plan's approval: {plan.reason}")
            transcript.turns.append(Feedback(text=unusable or (plan.told() if plan else "")))
            planned = unusable is None
            malformed = 0 if planned else malformed + 1
            if malformed >= get_settings().model_max_malformed_turns:
                return _finish(
                    book, "failed", f"The model gave {malformed} unusable plans in a row (last: {unusable})."
                )
            continue
        planned = True
        reply = taken.reply
        transcript.turns.append(reply)
        problem: str | None = None
        if reply.empty:
            problem = "the reply was empty"
            transcript.turns.append(Feedback(text=EMPTY_REPLY))
        elif not reply.tool_calls:
            return _finish(book, "completed", reply.text)
        book.state.phase = "acting"
        try:
            actions = await _act_on(book, reply.tool_calls, taken.policies, plan)
        except RunMustFail as exc:
            return _finish(book, "failed", f"Stopped: {exc}")
        for call, action in zip(reply.tool_calls, actions, strict=True):
            transcript.turns.append(_tool_result(call.id, action))
            if action.outcome is Outcome.INVALID:
                problem = f"{call.name}: {(action.result or {}).get('error', 'invalid call')}"
        if cancelled := [a for a in actions if a.outcome is Outcome.CANCELLED]:
            return _finish(book, "cancelled", f"Cancelled while waiting for approval: {cancelled[0].reason}")
        malformed = malformed + 1 if problem else 0
        if malformed >= get_settings().model_max_malformed_turns:
            return _finish(book, "failed", f"The model gave {malformed} malformed replies in a row (last: {problem}).")
    return _finish(book, "failed", f"The agent did not finish within {get_settings().agent_max_turns} turns.")


async def _plan_approval(book: RunBook, task: AgentTask, reply: PlanReply) -> tuple[ApprovedPlan | None, str | None]:
    """The model's plan put to its approvers (as the run's next action, so it is in the history and
    `show`); or what to tell the model when there is no usable plan."""
    if reply.plan is None:
        return None, f"No plan could be read ({reply.problem}). Call {SUBMIT_PLAN} again."
    index = len(book.state.actions)
    on_deviation = task.plan.on_deviation if task.plan else None
    approved = await ask_plan_approval(
        book.ctx, book.state, reply.plan, index=index, why=reply.plan.why, on_deviation=on_deviation, book=book
    )
    if approved.verdict is Outcome.INVALID:
        return None, f"Your plan cannot be used ({approved.reason}). Call {SUBMIT_PLAN} again."
    book.state.actions.append(
        ActionRecord(
            index=index,
            tool=PLAN_TOOL,
            proposed_args=reply.plan.model_dump(mode="json"),
            args=approved.plan.model_dump(mode="json") if approved.plan else None,
            edits=approved.edits,
            outcome=approved.verdict,
            approval_id=approved.approval_id,
            approved_by=approved.approved_by,
            reason=approved.reason,
        )
    )
    book.state.phase = "acting"
    book.save()
    return approved, None


async def _act_on(
    book: RunBook, calls: list[ToolCall], policies: list[PolicyAnswer | None], plan: ApprovedPlan | None = None
) -> list[ActionRecord]:
    """The turn's actions in the order of `calls`: unreadable calls (e.g. arguments that are not JSON)
    are recorded as `invalid` first, without reaching a tool; the rest go to `handle_turn` together."""
    unreadable: dict[int, ActionRecord] = {}
    for position, call in enumerate(calls):
        if call.problem is not None:
            index = len(book.state.actions)
            unreadable[position] = ActionRecord(
                index=index, tool=call.name, proposed_args={}, outcome=Outcome.INVALID, result={"error": call.problem}
            )
            book.state.actions.append(unreadable[position])
    if unreadable:
        book.save()
    readable = [p for p, call in enumerate(calls) if call.problem is None]
    answers = [policies[p] for p in readable]
    handled = iter(await handle_turn(book, [calls[p] for p in readable], answers, plan) if readable else [])
    return [unreadable[p] if p in unreadable else next(handled) for p in range(len(calls))]


def _last_gated(book: RunBook) -> str | None:
    """The tool of the run's latest approval (whose policy may say what follows a retired model)."""
    latest = max(book.state.approvals.values(), key=lambda r: r.index, default=None)
    return latest.tool if latest else None


def _after_retirement(book: RunBook, turn: int, model: str, retired: Retired) -> str | None:
    """Record the retirement (run state and audit trail); the successor to go on with, or None to end."""
    choice = retired.choice
    go_on = isinstance(choice, Successor) and retired.successor_problem is None and choice.successor != model
    successor = choice.successor if isinstance(choice, Successor) else None
    detail = retired.detail
    if retired.successor_problem:
        detail += f"; successor {successor}: {retired.successor_problem}"
    switch = ModelSwitch(retired=model, successor=successor if go_on else None, turn=turn, detail=detail)
    book.state.model_switches.append(switch)
    if go_on:
        book.state.model = successor or model
    book.save()
    latest = max(book.state.approvals.values(), key=lambda r: r.index, default=None)
    approval_id = latest.approval_id if latest else links.approval_id(book.state.run_id, len(book.state.actions))
    ledger.note(
        book,
        AuditEntry(
            entry_id=f"model_retired/t{turn}",
            approval_id=approval_id,
            run_id=book.state.run_id,
            tenant=book.state.tenant,
            kind="model_retired",
            at=(latest.decided_at or latest.requested_at) if latest else 0.0,
            details={**switch.model_dump(), "outcome": "successor" if go_on else "ended: a fresh plan is needed"},
        ),
    )
    return successor if go_on else None


def _retired_answer(book: RunBook) -> str:
    switch = book.state.model_switches[-1]
    ran = sum(1 for a in book.state.actions if a.args is not None)
    return (
        f"The model {switch.retired} is no longer available ({switch.detail}). The {ran} action(s) already "
        "approved or run have run from their frozen arguments; nothing further was planned. A fresh plan "
        "is needed: start a new run (or set on_model_retired to a successor model)."
    )


def _tool_result(call_id: str, action: ActionRecord) -> ToolResult:
    content: dict[str, Any] = {"outcome": action.outcome.value}
    if action.result is not None:
        content["result"] = action.result
    if action.reason:
        content["reason"] = action.reason
    if action.result and "error" in action.result:
        content["error"] = action.result["error"]
    if action.edits:
        content["edited_by_approver"] = {
            name: {"proposed": action.proposed_args.get(name), "approved": value}
            for name, value in action.edits.items()
        }
    if action.decision_source == "deadline_default":
        content["decided_by"] = "the deadline's default, not a person"
    if action.plan_approval_id and not action.deviation:
        content["inside_plan"] = action.plan_approval_id
    if action.deviation:
        content["deviation_from_plan"] = action.deviation
    return ToolResult(call_id=call_id, name=action.tool, outcome=action.outcome.value, content=content)


def _finish(book: RunBook, status: str, answer: str) -> RunResult:
    book.state.phase = status  # type: ignore[assignment]
    book.state.answer = answer
    book.save()
    ledger.flush(book)
    result = RunResult(
        run_id=book.state.run_id,
        status=status,  # type: ignore[arg-type]
        answer=answer,
        model=book.state.model,
        actions=book.state.actions,
    )
    if book.state.webhooks:
        events.run_finished(book.ctx, book.state.tenant, result)
    return result


@agent_run.handler(name="status", journal_retention=retention.NO_JOURNAL)
async def status(ctx: WorkflowSharedContext) -> RunStatus:
    """Where the run is: phase, pending approvals with their age, and what happened so far. A
    pending approval is read live from its own workflow (once the run has called that workflow, it
    stores the record again only when it returns decided)."""
    found = await run_status(ctx, ctx.key())
    stored = {a.approval_id: a for a in found.approvals}
    live = {i: r for i in pending_ids(await load_header(ctx), stored) if (r := await _live(ctx, i)) is not None}
    approvals = sorted({**stored, **live}.values(), key=lambda a: a.index)
    now = time.time()
    pending = [pending_of(a, now) for a in approvals if a.state == "pending"]
    return found.model_copy(update={"approvals": approvals, "pending": pending})


# `status` may ask in the moment between the run handing an approval over (clearing its own copy)
# and the approval's workflow saving the record (milliseconds, normally): it asks again, at most
# this often, this far apart (a count, not a clock: a replay takes the same branches).
_SETUP_POLLS = 20
_SETUP_POLL = timedelta(milliseconds=50)


async def _live(ctx: WorkflowSharedContext, approval_id: str) -> ApprovalRecord | None:
    """The approval's record from its own workflow; None if that has saved none after `_SETUP_POLLS` asks."""
    for _ in range(_SETUP_POLLS):
        current = await ctx.workflow_call(approval_status, key=approval_id, arg=None)
        if (record := next((a for a in current.approvals if a.approval_id == approval_id), None)) is not None:
            return record
        await ctx.sleep(_SETUP_POLL)
    return None


def _own(ctx: WorkflowSharedContext, approval_id: str) -> str:
    """The approval id, if it is one of this run's; a 403 that decides nothing otherwise."""
    if not approval_id.startswith(f"{ctx.key()}-a"):
        raise TerminalError("This link is not valid.", 403)
    return approval_id


@agent_run.handler(name="decide", input_serde=Body(Decision), journal_retention=retention.NO_JOURNAL)
async def decide(ctx: WorkflowSharedContext, decision: Decision) -> DecisionReceipt:
    """Record one approver's verdict: handed to the approval's own workflow, which re-verifies the
    token and lets the first completion win."""
    try:
        claims = links.parse(decision.token)
    except LinkInvalid as exc:
        raise TerminalError(exc.reason, exc.status) from None
    if claims.run_id != ctx.key():
        raise TerminalError("This link is not valid.", 403)
    key = links.approval_id(claims.run_id, claims.index)
    return await ctx.workflow_call(approval_decide, key=key, arg=decision)


_SLOW_CANCEL_SECONDS = 3.0
"""How long the `slow-cancel` fault point holds a cancel between its read of the run and its promise."""


@agent_run.handler(name="cancel", input_serde=Body(CancelRequest), journal_retention=retention.NO_JOURNAL)
async def cancel(ctx: WorkflowSharedContext, request: CancelRequest) -> CancelReceipt:
    """Stop the run: a pending approval resolves as `cancelled` and nothing further executes."""
    state = await load_run(ctx, with_actions=False)
    if state is None or state.phase in ("completed", "failed", "cancelled", "model_retired"):
        return CancelReceipt(run_id=ctx.key(), accepted=False, cancelled_approvals=[])
    # Read as of this call's start: a turn that froze its approvals since is told by its promise
    # below, and passes it on (countersign.approval.handover).
    await delay_point("slow-cancel", _SLOW_CANCEL_SECONDS)
    cancelled = []
    for approval_id in pending_ids(await load_header(ctx), state.approvals):
        receipt = await cancel_approval(ctx, approval_id, state.approvals.get(approval_id), request)
        cancelled += receipt.cancelled_approvals
    # Last, so that a run between turns stops at its next one; a waiting run hears from its approvals.
    accepted = await complete(cancel_promise(ctx), cancel_value(request))
    return CancelReceipt(run_id=ctx.key(), accepted=accepted, cancelled_approvals=cancelled)


@agent_run.handler(name="reassign", input_serde=Body(ReassignRequest), journal_retention=retention.NO_JOURNAL)
async def reassign(ctx: WorkflowSharedContext, request: ReassignRequest) -> ReassignReceipt:
    """Hand a pending approval (one approver's part of it) to someone else, through the approval."""
    return await ctx.workflow_call(approval_reassign, key=_own(ctx, request.approval_id), arg=request)


# Private: kept for deployments whose deliveries still name the run; only Countersign calls it.
@agent_run.handler(name="delivery_failed", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def delivery_failed(ctx: WorkflowSharedContext, failure: DeliveryFailure) -> bool:
    """An approver's email bounced or was refused: handed to the approval (which decides what follows)."""
    return await ctx.workflow_call(approval_delivery_failed, key=_own(ctx, failure.approval_id), arg=failure)
