"""`Approval`: one gated action's approval as its own Restate workflow (key = approval id).

Guarantee: the workflow owns everything the decision needs: the frozen record, the decision promise
of every approver slot and round, the reminders, escalation and deadline timers, the audit trail, and
(for `gated_call`) the precondition re-check and the effect under its idempotency key. A caller of any
kind (Workflow, Virtual Object, Service) starts it and awaits its result with `ctx.workflow_call`, so
the wait is as durable as the approval whatever the caller's own context can do. Links, pages,
`decide`, `cancel`, `reassign` and bounces address the approval by id; the first completion of a
slot's promise wins, and every later one is refused by Restate.
"""

from __future__ import annotations

import time
from datetime import timedelta

import restate
from pydantic import BaseModel
from restate import TerminalError, WorkflowContext, WorkflowSharedContext

from countersign import retention
from countersign.approval import ledger, tally
from countersign.approval.gate import Act, GateResult, decide_and_act
from countersign.approval.page_form import submit_form
from countersign.approval.run_state import RunBook, RunState, load_run
from countersign.approval.slack_decision import decide_from_slack
from countersign.approval.slots import LINK_STEP, check_link, complete, linked, record_of, settle_slot, verified
from countersign.approval.verdict import Verdict, cancel_promise, cancel_value, slot_promise
from countersign.channels.slack_interactions import SlackInteraction
from countersign.compact import Compact
from countersign.contract import (
    ApprovalRecord,
    CancelReceipt,
    CancelRequest,
    Decision,
    DecisionReceipt,
    PageSubmission,
    PageView,
    PendingApproval,
    ReassignReceipt,
    ReassignRequest,
    RunStatus,
    Submitted,
)
from countersign.errors import is_cancellation
from countersign.inputs import Body
from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntry
from countersign.objects.delivery import DeliveryFailure
from countersign.security import links
from countersign.security.links import LinkInvalid
from countersign.security.redact import clean_failures
from countersign.settings import get_settings
from countersign.tools import default_registry
from countersign.tools.policy import PolicyVerdict

SERVICE = "Approval"

approval = restate.Workflow(
    SERVICE,
    description="One gated action's approval: emailed, waited on durably, decided by a person, acted on.",
    invocation_context_managers=[clean_failures],
)


class ApprovalRequest(BaseModel):
    """Input of `Approval.run`: the call frozen by its caller, and how to proceed once decided."""

    record: ApprovalRecord
    policy: PolicyVerdict
    goal: str = ""
    model: str = ""
    act: Act = "execute"
    """What happens once decided: see `countersign.approval.gate.Act`."""
    delivered: int | None = None
    """Set when the caller already emailed the request (a batch): how many sends were accepted."""


# Private: a caller's own journaled step freezes what this runs; through the ingress anyone could
# start an approval of any arguments, for any approvers.
@approval.main(
    name="run",
    input_serde=Compact(ApprovalRequest),
    output_serde=Compact(GateResult),
    workflow_retention=retention.RUN,
    journal_retention=retention.RUN_JOURNAL,
    ingress_private=True,
)
async def run(ctx: WorkflowContext, request: ApprovalRequest) -> GateResult:
    """Ask, wait for the decision (reminders, escalation, quorum, deadline), then act on it."""
    record = request.record
    if ctx.key() != record.approval_id or not links.RUN_ID.match(record.run_id):
        raise TerminalError("the approval id must be the workflow key, and the run id well-formed", 400)
    if record.kind == "action" and default_registry().get(record.tool) is None:
        raise TerminalError(f"unknown tool {record.tool!r}", 400)
    state = RunState(
        run_id=record.run_id, tenant=record.tenant, goal=request.goal, requester=record.requester, model=request.model
    )
    book = RunBook(ctx, state)
    try:
        return await decide_and_act(book, record, request.policy, act=request.act, delivered=request.delivered)
    except TerminalError as exc:
        if is_cancellation(exc):  # a hard cancel: what the inboxes and the trail learned still reaches them
            ledger.flush(book)
        raise


@approval.handler(name="status", journal_retention=retention.NO_JOURNAL)
async def status(ctx: WorkflowSharedContext) -> RunStatus:
    """The approval as its workflow last saved it, in the shape of a run's status."""
    return await run_status(ctx, ctx.key())


async def run_status(ctx: WorkflowSharedContext, key: str) -> RunStatus:
    """A run's (or an approval's) status from the workflow state it keeps; `AgentRun.status` shares it."""
    state = await load_run(ctx)
    if state is None:
        return RunStatus(run_id=key, phase="unknown")
    # A read-only answer that nothing decides on; journaling the clock would cost a round trip per read.
    now = time.time()
    return RunStatus(
        run_id=state.run_id,
        phase=state.phase,
        goal=state.goal,
        requester=state.requester,
        model=state.model or None,
        pending=[pending_of(a, now) for a in state.approvals.values() if a.state == "pending"],
        approvals=list(state.approvals.values()),
        history=state.actions,
        answer=state.answer,
        model_switches=state.model_switches,
    )


def pending_of(record: ApprovalRecord, now: float) -> PendingApproval:
    return PendingApproval(
        approval_id=record.approval_id,
        tool=record.tool,
        args=record.args,
        digest=record.digest,
        approvers=[record.approvers[s] for s in record.active_slots],
        quorum=record.quorum,
        approvals=len(record.approvals_in_round()),
        round=record.round,
        escalated=record.escalations > 0,
        deadline=record.deadline,
        age_seconds=round(now - record.requested_at, 3),
    )


@approval.handler(name="decide", input_serde=Body(Decision), journal_retention=retention.NO_JOURNAL)
async def decide(ctx: WorkflowSharedContext, decision: Decision) -> DecisionReceipt:
    """Record one approver's verdict. Re-verifies the link token itself; the first completion wins."""
    claims, record = await linked(ctx, decision.token)
    promise = ctx.promise(slot_promise(record.approval_id, claims.round, claims.slot), type_hint=Verdict)
    # Asked before the link check and answered alongside it (one round trip fewer after a click);
    # its answer is read only once the link is known to be authentic.
    peeked = promise.peek()
    check = await verified(ctx, decision.token, record)
    return await settle_slot(
        ctx,
        record,
        claims.round,
        claims.slot,
        check,
        decision,
        edits=decision.edits,
        via="email",
        peeked=peeked,
        grant=decision.grant_seconds,
    )


@approval.handler(name="submit", input_serde=Body(PageSubmission), journal_retention=retention.NO_JOURNAL)
async def submit(ctx: WorkflowSharedContext, form: PageSubmission) -> Submitted:
    """An approval page's POST in one invocation: the approval's status, and its decision made with
    `decide`'s own checks (the link re-verified here, the first completion wins), or why it was not
    made (the refusal page to show), or what the page does itself (`Submitted.takeover`)."""
    return await submit_form(ctx, form)


@approval.handler(name="cancel", input_serde=Body(CancelRequest), journal_retention=retention.NO_JOURNAL)
async def cancel(ctx: WorkflowSharedContext, request: CancelRequest) -> CancelReceipt:
    """Close a pending approval as `cancelled`: nothing executes. Not accepted once it is decided,
    nor for an id under which nothing is waiting: a caller emails its request just before it starts
    the approval's workflow, so a cancel that finds no record waits, bounded, for that workflow to
    save one; if none appears, nothing is cancelled and nothing is held for a later request."""
    record = await record_of(ctx)
    for pause in _RECORD_WAITS:
        if record is not None:
            break
        await ctx.sleep(timedelta(seconds=pause))
        # A call, not a state read: this invocation's own reads would not see a later save.
        answer = await ctx.workflow_call(status, key=ctx.key(), arg=None)
        record = next((r for r in answer.approvals if r.approval_id == ctx.key()), None)
    if record is None:
        return CancelReceipt(run_id="", accepted=False, cancelled_approvals=[])
    return await _cancel(ctx, record, request)


_RECORD_WAITS = (0.05, 0.1, 0.25, 0.5, 1.0, 1.5)
"""The pauses (3.4 s in all) of a cancel that waits for an approval's workflow to save its record."""


class FrozenCancel(BaseModel):
    """Input of `Approval.cancel_frozen`: a run's cancel of an approval it froze and asked for."""

    request: CancelRequest
    digest: str
    approvers: int


# Private: only an agent run calls it, for an approval it froze (so its request is on its way).
@approval.handler(
    name="cancel_frozen",
    input_serde=Body(FrozenCancel),
    journal_retention=retention.NO_JOURNAL,
    ingress_private=True,
)
async def cancel_frozen(ctx: WorkflowSharedContext, order: FrozenCancel) -> CancelReceipt:
    """`cancel`, for an approval its caller froze: when its workflow has not saved the record yet,
    the cancel is held ahead for exactly that request. The slots of its first round are closed as
    cancelled by whoever asked (the trail names them) and the approval ends `cancelled` as soon as
    it waits. Only the run that froze it can hold one, so no id is cancelled before it is asked."""
    record = await record_of(ctx)
    if record is not None:
        return await _cancel(ctx, record, order.request)
    now = await ctx.time()
    won = False
    for slot in range(order.approvers):
        verdict = _cancelled(order.request, slot, 1, order.digest, now)
        won = await complete(ctx.promise(slot_promise(ctx.key(), 1, slot), type_hint=Verdict), verdict) or won
    await complete(cancel_promise(ctx), cancel_value(order.request))
    return CancelReceipt(run_id="", accepted=won, cancelled_approvals=[ctx.key()] if won else [])


async def cancel_approval(
    ctx: restate.Context, approval_id: str, frozen: ApprovalRecord | None, request: CancelRequest
) -> CancelReceipt:
    """A run's cancel of one of its approvals: held ahead if the run still holds its `frozen` record
    (its workflow may not have saved one yet), else the approval's own `cancel`."""
    if frozen is None:
        return await ctx.workflow_call(cancel, key=approval_id, arg=request)
    order = FrozenCancel(request=request, digest=frozen.digest, approvers=len(frozen.approvers))
    return await ctx.workflow_call(cancel_frozen, key=approval_id, arg=order)


async def _cancel(ctx: WorkflowSharedContext, record: ApprovalRecord, request: CancelRequest) -> CancelReceipt:
    if record.state != "pending":
        return CancelReceipt(run_id=record.run_id, accepted=False, cancelled_approvals=[])
    now = await ctx.time()
    won = False
    for slot in record.active_slots:
        verdict = _cancelled(request, slot, record.round, record.digest, now)
        promise = ctx.promise(slot_promise(record.approval_id, record.round, slot), type_hint=Verdict)
        won = await complete(promise, verdict) or won
    # Last, so that the waiting workflow sees its slots closed as cancelled by this call.
    await complete(cancel_promise(ctx), cancel_value(request))
    return CancelReceipt(run_id=record.run_id, accepted=won, cancelled_approvals=[record.approval_id] if won else [])


def _cancelled(request: CancelRequest, slot: int, round_: int, digest: str, now: float) -> Verdict:
    return Verdict(
        kind="cancel",
        slot=slot,
        round=round_,
        digest=digest,
        at=now,
        reason=request.reason,
        source="system",
        asked_by=request.by,  # named only when the caller says who (the CLI always does)
    )


@approval.handler(name="reassign", input_serde=Body(ReassignRequest), journal_retention=retention.NO_JOURNAL)
async def reassign(ctx: WorkflowSharedContext, request: ReassignRequest) -> ReassignReceipt:
    """Hand a pending approval (one approver's part of it) to someone else: a new round starts and
    older links stop working. A 400 that changes nothing when the request does not fit."""
    record = await record_of(ctx) if request.approval_id == ctx.key() else None
    if record is None or record.state != "pending":
        raise TerminalError(f"no pending approval {request.approval_id}", 404)
    to = request.to.lower()
    # Journaled: the policy file and the settings decide this branch, and a replay must take the same one.
    refusal = await ctx.run_typed("check reassign target", _reassign_refusal, tool=record.tool, to=to)
    if refusal:
        raise TerminalError(refusal, 403)
    if to in (record.approvers[s] for s in record.active_slots):
        raise TerminalError(f"{to} already decides this approval (one person counts once)", 400)
    voted = {v.slot for v in record.votes if v.round == record.round}
    open_slots = [s for s in record.active_slots if s not in voted]
    if request.replacing:
        open_slots = [s for s in open_slots if record.approvers[s] == request.replacing.lower()]
    if len(open_slots) != 1:
        raise TerminalError("say which approver to replace (--from): several, or none, are still deciding", 400)
    slot = open_slots[0]
    now = await ctx.time()
    verdict = Verdict(
        kind="reassign",
        slot=slot,
        round=record.round,
        digest=record.digest,
        at=now,
        source="system",
        reason=request.reason or f"reassigned to {to}",
        to=to,
        asked_by=request.by or "operator",
    )
    accepted = await complete(
        ctx.promise(slot_promise(record.approval_id, record.round, slot), type_hint=Verdict), verdict
    )
    return ReassignReceipt(
        approval_id=record.approval_id, accepted=accepted, replaced=record.approvers[slot], to=to, by=verdict.asked_by
    )


def _reassign_refusal(tool: str, to: str) -> str:
    """Empty when the policy lets `to` decide `tool`: one of its approvers or escalation chain, or an
    address or domain in APPROVALS_REASSIGN_ALLOWED. Otherwise why not (nothing is changed)."""
    known = default_registry().get(tool)
    policy_people = set(known.policy.approvers) | set(known.policy.escalate_to) if known else set()
    if to in policy_people or get_settings().may_reassign_to(to):
        return ""
    return (
        f"{to} may not decide {tool}: reassign only to its approvers or escalation chain, "
        "or to an address or @domain listed in APPROVALS_REASSIGN_ALLOWED"
    )


@approval.handler(name="viewed", input_serde=Body(PageView), journal_retention=retention.NO_JOURNAL)
async def viewed(ctx: WorkflowSharedContext, view: PageView) -> RunStatus:
    """An approval page was opened (GET): what `status` answers, and, when the link is authentic for
    this approval (re-verified here: the audit trail cannot be written from the ingress), a
    `page_viewed` audit entry, at most one per approver slot, round and minute. Before the workflow
    has saved its record, or for a well-formed link that is not authentic for it, it records nothing
    and answers the status alone: the page checks the link itself and says what is wrong with it; a
    malformed token is a 400. One invocation per page view, where a status read and a separate view
    note were two."""
    try:
        claims = links.parse(view.token)
    except LinkInvalid as exc:  # not a link at all (the page never sends one): bad input, a 400
        raise TerminalError(exc.reason, exc.status) from None
    answer = await run_status(ctx, ctx.key())
    record = next((r for r in answer.approvals if r.approval_id == ctx.key()), None)
    if record is None or links.approval_id(claims.run_id, claims.index) != ctx.key():
        return answer
    # Journaled, as for `decide`: a key rotation between attempts cannot change what was recorded.
    check = await ctx.run_typed("verify link", check_link, LINK_STEP, token=view.token, record=record)
    if check.state == "invalid":
        return answer
    entry = AuditEntry(
        entry_id=f"page_viewed/r{record.round}/s{claims.slot}/m{int(check.now // 60)}",
        approval_id=record.approval_id,
        run_id=record.run_id,
        tenant=record.tenant,
        kind="page_viewed",
        at=check.now,
        actor=record.approvers[claims.slot],
        details={"user_agent": view.client[:200]},
    )
    # The idempotency key folds the views of one minute into the first: a second view is not a
    # conflicting entry with the same id, it is not sent at all.
    bookkeeping.send_entry(ctx, entry, once_per_entry=True)
    return answer


# Private: only `EmailDelivery.record` calls it, after a verified provider event.
@approval.handler(name="delivery_failed", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def delivery_failed(ctx: WorkflowSharedContext, failure: DeliveryFailure) -> bool:
    """An approver's email bounced or was refused: that approver cannot decide this round. The
    workflow then waits for the others, escalates, or ends the approval `undeliverable`. False for a
    stale failure. A failure of the first request, which the caller sends before this workflow has
    saved its record, is held ahead: the slot starts undeliverable when the workflow waits."""
    record = await record_of(ctx)
    if record is None:
        if failure.approval_id != ctx.key() or failure.round != 1:
            return False
        ahead = tally.undeliverable(failure, "", await ctx.time())
        return await complete(ctx.promise(slot_promise(ctx.key(), 1, failure.slot), type_hint=Verdict), ahead)
    verdict = tally.slot_verdict(record, failure, await ctx.time())
    if verdict is None:
        return False
    return await complete(
        ctx.promise(slot_promise(record.approval_id, record.round, failure.slot), type_hint=Verdict), verdict
    )


@approval.handler(name="slack_decide", input_serde=Body(SlackInteraction), journal_retention=retention.NO_JOURNAL)
async def slack_decide(ctx: WorkflowSharedContext, interaction: SlackInteraction) -> DecisionReceipt:
    """A decision made in Slack's modal (see `countersign.approval.slack_decision`)."""
    return await decide_from_slack(ctx, interaction)
