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
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol

import restate
from pydantic import BaseModel
from restate import DurablePromise, RunOptions, TerminalError, WorkflowContext, WorkflowSharedContext

from countersign import retention
from countersign import textdiff as diff
from countersign.approval import confirm, ledger, tally
from countersign.approval.edits import EditRejected, apply_edits
from countersign.approval.gate import Act, GateResult, decide_and_act
from countersign.approval.plan import apply_plan_edits
from countersign.approval.run_state import RunBook, RunState, load_approval, load_header, load_run
from countersign.approval.verdict import Verdict, cancel_promise, cancel_value, slot_promise
from countersign.channels import slack, slack_interactions
from countersign.channels.slack_interactions import SlackInteraction, SlackSubmission
from countersign.compact import Compact
from countersign.contract import (
    ApprovalRecord,
    CancelReceipt,
    CancelRequest,
    Decision,
    DecisionReceipt,
    PageNotice,
    PageSubmission,
    PageView,
    PendingApproval,
    ReassignReceipt,
    ReassignRequest,
    RunStatus,
    Submitted,
)
from countersign.errors import is_already_completed, is_cancellation
from countersign.faults import crash_point
from countersign.inputs import Body
from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntry
from countersign.objects.delivery import DeliveryFailure
from countersign.security import links
from countersign.security.links import LinkInvalid, LinkState
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
    if record.kind != "plan" and default_registry().get(record.tool) is None:
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


async def _record(ctx: WorkflowSharedContext) -> ApprovalRecord | None:
    header = await load_header(ctx)
    return await load_approval(ctx, header, ctx.key()) if header else None


class SlotDecision(Protocol):
    """What a person decided, from any channel (`Decision` from the page, `SlackDecision`)."""

    @property
    def verdict(self) -> Literal["approve", "reject"]: ...
    @property
    def reason(self) -> str: ...
    @property
    def confirm(self) -> str: ...
    @property
    def client(self) -> str: ...


class LinkCheck(BaseModel):
    """Journaled result of checking a token, so a key rotation cannot change a replayed branch."""

    state: LinkState | Literal["invalid"]
    reason: str = ""
    status: int = 200
    slot: int = -1
    now: float


# A link check is pure but for the clock and the keys; a failure can only be a bug of ours, so a
# click gets a few quick attempts and then a clear error, never the invocation's long retry policy.
_LINK_STEP = RunOptions[LinkCheck](max_attempts=3, initial_retry_interval=timedelta(milliseconds=50))


def _check_link(token: str, record: ApprovalRecord) -> LinkCheck:
    now = time.time()
    try:
        claims, state = links.check(token, record, get_settings().approvals_signing_keys, now)
    except LinkInvalid as exc:
        return LinkCheck(state="invalid", reason=exc.reason, status=exc.status, now=now)
    return LinkCheck(state=state, slot=claims.slot, now=now)


async def _linked(ctx: WorkflowSharedContext, token: str) -> tuple[links.LinkClaims, ApprovalRecord]:
    """What a link claims and the record of this approval it names; a 4xx unless it names this one."""
    try:
        claims = links.parse(token)
    except LinkInvalid as exc:
        raise TerminalError(exc.reason, exc.status) from None
    record = await _record(ctx) if links.approval_id(claims.run_id, claims.index) == ctx.key() else None
    if record is None:
        raise TerminalError("This link is not valid.", 403)
    return claims, record


async def _verified(ctx: WorkflowSharedContext, token: str, record: ApprovalRecord) -> LinkCheck:
    """The journaled check of the link's signature and standing; a 4xx when it is not authentic."""
    check = await ctx.run_typed("verify link", _check_link, _LINK_STEP, token=token, record=record)
    if check.state == "invalid":
        raise TerminalError(check.reason, check.status)
    return check


@approval.handler(name="decide", input_serde=Body(Decision), journal_retention=retention.NO_JOURNAL)
async def decide(ctx: WorkflowSharedContext, decision: Decision) -> DecisionReceipt:
    """Record one approver's verdict. Re-verifies the link token itself; the first completion wins."""
    claims, record = await _linked(ctx, decision.token)
    promise = ctx.promise(slot_promise(record.approval_id, claims.round, claims.slot), type_hint=Verdict)
    # Asked before the link check and answered alongside it (one round trip fewer after a click);
    # its answer is read only once the link is known to be authentic.
    peeked = promise.peek()
    check = await _verified(ctx, decision.token, record)
    return await settle_slot(
        ctx, record, claims.round, claims.slot, check, decision, edits=decision.edits, via="email", peeked=peeked
    )


@approval.handler(name="submit", input_serde=Body(PageSubmission), journal_retention=retention.NO_JOURNAL)
async def submit(ctx: WorkflowSharedContext, form: PageSubmission) -> Submitted:
    """An approval page's POST in one invocation: the approval's status, and its decision made with
    `decide`'s own checks (the link re-verified here, the first completion wins), or why it was not
    made (the refusal page to show), or what the page does itself (`Submitted.takeover`). The page
    checked the request's origin, CSRF value and size before calling; the order of the checks here
    is the page's: the link, then the form (verdict, reason, edits to review), then the decision."""
    try:
        links.parse(form.token)
    except LinkInvalid as exc:  # not a link at all (the page never sends one): bad input, a 400
        raise TerminalError(exc.reason, exc.status) from None
    if await load_header(ctx) is None:
        # Not saved yet (the email goes out just before), or never: the page waits for the record
        # with reads, as for a GET; nothing is verified, nothing decided.
        return Submitted(takeover="unknown")
    try:
        claims, record = await _linked(ctx, form.token)
    except TerminalError as exc:
        return Submitted(refused=_link_refusal(exc))
    if len(record.batch) > 1:
        # The batch page reads its items afresh, checks the link and decides item by item (`decide`).
        return Submitted(record=record, takeover="batch")
    promise = ctx.promise(slot_promise(record.approval_id, claims.round, claims.slot), type_hint=Verdict)
    peeked = promise.peek()  # as in `decide`: asked alongside the link check, read once it passed
    try:
        check = await _verified(ctx, form.token, record)
    except TerminalError as exc:
        return Submitted(record=record, refused=_link_refusal(exc))
    verdict: Literal["approve", "reject"]
    match form.verdict:
        case "approve":
            verdict = "approve"
        case "reject":
            verdict = "reject"
        case _:
            return Submitted(record=record, refused=PageNotice(status=400, title="Choose a verdict", text=_PRESS))
    reason = form.reason.strip()
    if verdict == "reject" and not reason:
        return Submitted(record=record, refused=PageNotice(status=400, title="Reason required", text=_WHY))
    if len(reason) > 2000:
        return Submitted(record=record, refused=PageNotice(status=400, title="Reason too long", text=_SHORTER))
    # Every field the form carries, offered or not: `decide`'s rules refuse one that may not be edited
    # (a 400 that decides nothing), where dropping it would approve what the approver did not ask.
    edits = {k: diff.normalized(v).strip() for k, v in form.edits.items()}
    read = {"verdict": verdict, "reason": reason, "edits": edits, "confirm": form.confirm}
    # A long text changed: the approver sees the diff first; only the review's own form, carrying
    # the fingerprint of exactly these edits, decides.
    if verdict == "approve" and diff.changes(record.args, edits) and form.reviewed != diff.marker(edits):
        # Only edits that would be accepted are shown for review; others are refused here, by the
        # decision's own check, before a person spends time on a diff of them.
        try:
            _checked_edits(record, verdict, edits)
        except TerminalError as exc:
            notice = PageNotice(status=400, title="Not decided", text=f"{exc.message} Nothing was decided.")
            return Submitted(record=record, refused=notice)
        return Submitted.model_validate({"record": record, "takeover": "review", **read})
    decision = _PageDecision(verdict=verdict, reason=reason, confirm=form.confirm, client=form.client)
    # Its refusals (a replaced or expired link, edits or a confirmation that do not fit) are 4xx
    # errors, as `decide`'s are: the page shows them as "Not decided".
    receipt = await settle_slot(
        ctx, record, claims.round, claims.slot, check, decision, edits=edits, via="email", peeked=peeked
    )
    return Submitted.model_validate({"record": record, "receipt": receipt, **read})


_PRESS = "Press Approve or Reject."
_WHY = "Say why you reject, so the agent can act on it. Nothing was decided."
_SHORTER = "Keep the reason under 2000 characters. Nothing was decided."


@dataclass(frozen=True)
class _PageDecision:
    """A page's verdict as `settle_slot` takes it (a `SlotDecision`)."""

    verdict: Literal["approve", "reject"]
    reason: str
    confirm: str
    client: str


def _link_refusal(exc: TerminalError) -> PageNotice:
    """The page for a link that does not verify, as a page that checked it itself shows it."""
    if is_cancellation(exc) or exc.status_code >= 500:
        raise exc
    title = "Link expired" if exc.status_code == 410 else "Link not valid"
    return PageNotice(status=exc.status_code, title=title, text=exc.message)


async def settle_slot(
    ctx: WorkflowSharedContext,
    record: ApprovalRecord,
    round_: int,
    slot: int,
    check: LinkCheck,
    decision: SlotDecision,
    *,
    edits: dict[str, str],
    via: str,
    peeked: Awaitable[Verdict | None] | None = None,
) -> DecisionReceipt:
    """Complete one slot's decision promise with a person's verdict, whichever channel carried it
    (the channel checked who they are first); a 4xx that decides nothing when it does not fit.
    `peeked`: the slot's promise, already asked for by the caller."""
    promise = ctx.promise(slot_promise(record.approval_id, round_, slot), type_hint=Verdict)
    if peeked is None:
        peeked = promise.peek()
    # An authentic link whose slot is already decided learns by whom, whatever its round or expiry.
    if (winner := await peeked) is not None:
        return _receipt(record, winner, accepted=False)
    if check.state == "replaced":
        raise TerminalError("This link was replaced by a newer one; use the most recent email.", 410)
    if check.state == "expired":
        raise TerminalError("This link has expired.", 410)
    reason = decision.reason.strip()
    if decision.verdict == "reject" and not reason:
        raise TerminalError("A reason is required to reject.", 400)
    changed = _checked_edits(record, decision.verdict, edits)
    wanted = confirm.expected(record, changed) if decision.verdict == "approve" else None
    if wanted is not None and not confirm.matches(decision.confirm, wanted):
        raise TerminalError(confirm.REFUSAL, 400)
    verdict = Verdict(
        kind=decision.verdict,
        slot=slot,
        round=round_,
        digest=record.digest,
        at=check.now,
        by=record.approvers[slot],
        reason=reason or None,
        edits=changed or None,
        client=decision.client,
        via=via,
    )
    try:
        await promise.resolve(verdict)
    except TerminalError as exc:
        if not is_already_completed(exc):
            raise
        return _receipt(record, await promise.value(), accepted=False)
    return _receipt(record, verdict, accepted=True)


def _checked_edits(record: ApprovalRecord, verdict: str, edits: dict[str, str]) -> dict[str, Any]:
    """The fields the approver actually changed, validated; a 400 that decides nothing otherwise."""
    if record.kind == "plan":
        return _checked_plan_edits(record, verdict, edits)
    proposed = {k: v for k, v in edits.items() if str(record.args.get(k)) != v}
    if not proposed:
        return {}
    if verdict != "approve":
        raise TerminalError("Edits go with an approval, not a rejection.", 400)
    tool = default_registry().get(record.tool)
    if tool is None or not record.editable:
        raise TerminalError("This action cannot be edited.", 400)
    try:
        return apply_edits(tool, record.args, proposed)[1]
    except EditRejected as exc:
        raise TerminalError(str(exc), 400) from None


def _checked_plan_edits(record: ApprovalRecord, verdict: str, edits: dict[str, str]) -> dict[str, Any]:
    """A plan's edits (drop a step, lower a count or a bound), validated; a 400 otherwise."""
    if not edits:
        return {}
    try:
        changed = apply_plan_edits(record.args, edits)[1]
    except EditRejected as exc:
        raise TerminalError(str(exc), 400) from None
    if changed and verdict != "approve":
        raise TerminalError("Edits go with an approval, not a rejection.", 400)
    # What is kept is the approver's own form values for exactly what changed, so the approval's
    # workflow applies the same edits again.
    return {k: v for k, v in edits.items() if k in changed}


_SLOT_STATE = {
    "reassign": "reassigned",
    "reject": "rejected",
    "expire": "expired",
    "cancel": "cancelled",
    "escalate": "escalated",
    "undeliverable": "undeliverable",
}


def _receipt(record: ApprovalRecord, verdict: Verdict, *, accepted: bool) -> DecisionReceipt:
    return DecisionReceipt(
        accepted=accepted,
        approval_id=record.approval_id,
        state=_slot_state(verdict),
        decided_by=verdict.by,
        decided_at=verdict.at,
        decided_via=verdict.via if verdict.source == "human" else None,
        reason=verdict.reason,
        edits=verdict.edits,
        quorum=record.quorum,
    )


def _slot_state(verdict: Verdict) -> str:
    """How one approver's decision point ended (a receipt's `state`), which may differ from the
    approval's: a slot closed by a reassignment or an escalation says so."""
    if verdict.kind == "approve":
        return "approved_with_edits" if verdict.edits else "approved"
    if verdict.kind == "close":
        return verdict.closes_as or "closed"
    return _SLOT_STATE[verdict.kind]


@approval.handler(name="cancel", input_serde=Body(CancelRequest), journal_retention=retention.NO_JOURNAL)
async def cancel(ctx: WorkflowSharedContext, request: CancelRequest) -> CancelReceipt:
    """Close a pending approval as `cancelled`: nothing executes. Not accepted once it is decided,
    nor for an id under which nothing is waiting: a caller emails its request just before it starts
    the approval's workflow, so a cancel that finds no record waits, bounded, for that workflow to
    save one; if none appears, nothing is cancelled and nothing is held for a later request."""
    record = await _record(ctx)
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
    record = await _record(ctx)
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
        asked_by=request.by or "operator",
    )


@approval.handler(name="reassign", input_serde=Body(ReassignRequest), journal_retention=retention.NO_JOURNAL)
async def reassign(ctx: WorkflowSharedContext, request: ReassignRequest) -> ReassignReceipt:
    """Hand a pending approval (one approver's part of it) to someone else: a new round starts and
    older links stop working. A 400 that changes nothing when the request does not fit."""
    record = await _record(ctx) if request.approval_id == ctx.key() else None
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
    check = await ctx.run_typed("verify link", _check_link, _LINK_STEP, token=view.token, record=record)
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
    record = await _record(ctx)
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


async def complete(promise: DurablePromise[Any], value: Any) -> bool:
    """Resolve unless already completed; True if this call's value won."""
    try:
        await promise.resolve(value)
    except TerminalError as exc:
        if not is_already_completed(exc):
            raise
        return False
    return True


@approval.handler(name="slack_decide", input_serde=Body(SlackInteraction), journal_retention=retention.NO_JOURNAL)
async def slack_decide(ctx: WorkflowSharedContext, interaction: SlackInteraction) -> DecisionReceipt:
    """A decision made in Slack's modal: Slack's signature is verified again here, the clicking Slack
    user must be the approver of the slot the message was sent to (by their Slack email), then the
    same decision point as the email's link is completed. Every refusal is told to them in Slack."""
    submitted = await ctx.run_typed("verify slack request", slack_interactions.verified, interaction=interaction)
    record = await _record(ctx) if submitted.approval_id == ctx.key() else None
    if record is None or not 0 <= submitted.slot < len(record.approvers):
        raise TerminalError("This Slack message does not belong to a known approval.", 403)
    email = await ctx.run_typed(
        "slack user email", slack_interactions.user_email, slack.SLACK_RETRIES, user=submitted.user
    )
    approver = record.approvers[submitted.slot]
    if email != approver:
        who = email or "your Slack account (it has no email)"
        await _tell_slack(ctx, submitted, f"This request is for {approver}, not {who}: nothing was decided.")
        raise TerminalError("the Slack user is not the approver of this request; nothing was decided", 403)
    stale = submitted.round != record.round or submitted.slot not in record.active_slots
    state: LinkState = "replaced" if stale else "expired" if submitted.now >= record.deadline else "valid"
    check = LinkCheck(state=state, slot=submitted.slot, now=submitted.now)
    # The fault tests stop here: the click is verified and journaled, the decision not yet recorded.
    crash_point("crash-before-slack-decision")
    try:
        receipt = await settle_slot(
            ctx, record, submitted.round, submitted.slot, check, submitted, edits={}, via="slack"
        )
    except TerminalError as exc:
        if is_cancellation(exc):
            raise
        await _tell_slack(ctx, submitted, f"{exc.message} Nothing was decided.")
        raise
    if receipt.accepted:
        await _tell_slack(ctx, submitted, f"Recorded: you {receipt.state.replace('_', ' ')} {record.summary}.")
    else:
        by = f" by {receipt.decided_by}" if receipt.decided_by else ""
        await _tell_slack(ctx, submitted, f"Already closed ({receipt.state}{by}): your click changed nothing.")
    return receipt


async def _tell_slack(ctx: WorkflowSharedContext, submitted: SlackSubmission, text: str) -> None:
    """A note to the clicking person in Slack; a Slack failure here must not change the answer."""
    try:
        await ctx.run_typed(
            "tell slack user",
            slack_interactions.tell,
            slack.SLACK_RETRIES,
            channel=submitted.channel,
            user=submitted.user,
            text=text,
        )
    except TerminalError as exc:
        if is_cancellation(exc):
            raise
