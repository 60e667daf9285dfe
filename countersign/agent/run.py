"""`AgentRun`: one agent run as a Restate workflow (key = run id).

Guarantee: every model turn, policy answer, email and tool effect is a journaled step, so a run
resumes after any crash or restart without repeating what already happened; the loop is bounded by
`AGENT_MAX_TURNS`, a model turn's retries by `MODEL_MAX_ATTEMPTS` and malformed replies in a row by
`MODEL_MAX_MALFORMED_TURNS`; a malformed task ends at once with a 400 carrying the validation message.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import restate
from pydantic import ValidationError
from restate import TerminalError, WorkflowContext, WorkflowSharedContext
from restate.serde import Serde

from countersign import retention
from countersign.agent.model_turn import model_retries, pick_model, turn_step
from countersign.agent.retirement import after_retirement, last_gated, retired_answer
from countersign.agent.turn import PolicyAnswer, RunMustFail, handle_turn
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
from countersign.contract import (
    ActionRecord,
    AgentTask,
    ApprovalRecord,
    CancelReceipt,
    CancelRequest,
    Decision,
    DecisionReceipt,
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
from countersign.llm import ModelUnavailable, check_model
from countersign.llm.base import (
    Feedback,
    ToolCall,
    ToolResult,
    Transcript,
)
from countersign.llm.planning import SUBMIT_PLAN, PlanReply
from countersign.llm.prompt import EMPTY_REPLY
from countersign.objects.delivery import DeliveryFailure
from countersign.observability import metrics, tracing
from countersign.security import links
from countersign.security.links import LinkInvalid
from countersign.security.redact import clean_failures
from countersign.settings import get_settings
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
            with tracing.step("model turn", run_id=book.state.run_id, tenant=task.tenant):
                taken = await ctx.run_typed(
                    f"model turn {turn}",
                    turn_step,
                    model_retries(),
                    run_id=book.state.run_id,
                    base=len(book.state.actions),
                    planned=plan is not None,
                    model_id=model_id,
                    task=task,
                    transcript=transcript,
                    planning=not planned,
                    results=results_of(book.state.actions),
                    last_gated=last_gated(book),
                )
            book.state.webhooks = taken.webhooks
        except TerminalError as exc:
            if is_cancellation(exc):
                raise
            retried = "" if exc.status_code == 400 else f" (gave up after {get_settings().model_max_attempts} attempts)"
            if not book.state.model:
                book.state.model = await ctx.run_typed("pin model", pick_model, requested=task.model)
            return _finish(book, "failed", f"The model call failed{retried}: {exc.message}")
        if taken.retired is not None:
            if (request := await cancel_asked) is not None:
                return _finish(book, "cancelled", f"Cancelled: {request.reason}")
            if not answered and not book.state.model_switches:  # never answered: a wrong name, as before
                book.state.model = taken.model
                return _finish(book, "failed", f"The model call failed: {taken.retired.detail}")
            successor = after_retirement(book, turn, taken.model, taken.retired)
            if successor is None:
                return _finish(book, "model_retired", retired_answer(book))
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
    metrics.record_run_finished(status)
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
