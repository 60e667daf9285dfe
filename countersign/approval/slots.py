"""One approver slot's decision: the link that names it, checked, and its promise completed.

Guarantee: a person's verdict, from any channel (the page, `decide`, Slack), completes the slot's
decision promise only after the channel checked who they are and the link was verified in a journaled
step (a key rotation cannot change a replayed branch); edits and the typed confirmation are checked
by `decide`'s rules, one place for every channel; a verdict that does not fit is a 4xx that decides
nothing, and the first completion of a slot wins.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any, Literal, Protocol

from pydantic import BaseModel
from restate import DurablePromise, RunOptions, TerminalError, WorkflowSharedContext

from countersign.approval import confirm
from countersign.approval.edits import EditRejected, apply_edits
from countersign.approval.plan import apply_plan_edits
from countersign.approval.question import fields_of, parse_answer
from countersign.approval.run_state import RunHeader, load_approval, load_header
from countersign.approval.standing import checked_seconds
from countersign.approval.verdict import Verdict, slot_promise
from countersign.contract import ApprovalRecord, DecisionReceipt
from countersign.errors import is_already_completed
from countersign.security import links
from countersign.security.links import LinkInvalid, LinkState
from countersign.settings import get_settings
from countersign.tools import default_registry


async def record_of(ctx: WorkflowSharedContext) -> ApprovalRecord | None:
    return await record_in(ctx, await load_header(ctx))


async def record_in(ctx: WorkflowSharedContext, header: RunHeader | None) -> ApprovalRecord | None:
    """This approval's record, listed in `header` (the run header already read); None without one."""
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
LINK_STEP = RunOptions[LinkCheck](max_attempts=3, initial_retry_interval=timedelta(milliseconds=50))


def check_link(token: str, record: ApprovalRecord) -> LinkCheck:
    now = time.time()
    try:
        claims, state = links.check(token, record, get_settings().approvals_signing_keys, now)
    except LinkInvalid as exc:
        return LinkCheck(state="invalid", reason=exc.reason, status=exc.status, now=now)
    return LinkCheck(state=state, slot=claims.slot, now=now)


async def linked(
    ctx: WorkflowSharedContext, token: str, header: RunHeader | None = None
) -> tuple[links.LinkClaims, ApprovalRecord]:
    """What a link claims and the record of this approval it names; a 4xx unless it names this one.
    `header`: the run header, if the caller already read it (read here otherwise, and only when the
    link names this approval)."""
    try:
        claims = links.parse(token)
    except LinkInvalid as exc:
        raise TerminalError(exc.reason, exc.status) from None
    record = None
    if links.approval_id(claims.run_id, claims.index) == ctx.key():
        record = await (record_of(ctx) if header is None else record_in(ctx, header))
    if record is None:
        raise TerminalError("This link is not valid.", 403)
    return claims, record


async def verified(ctx: WorkflowSharedContext, token: str, record: ApprovalRecord) -> LinkCheck:
    """The journaled check of the link's signature and standing; a 4xx when it is not authentic."""
    check = await ctx.run_typed("verify link", check_link, LINK_STEP, token=token, record=record)
    if check.state == "invalid":
        raise TerminalError(check.reason, check.status)
    return check


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
    grant: int | str | None = None,
) -> DecisionReceipt:
    """Complete one slot's decision promise with a person's verdict, whichever channel carried it
    (the channel checked who they are first); a 4xx that decides nothing when it does not fit.
    `peeked`: the slot's promise, already asked for by the caller. `grant`: the seconds of a standing
    approval given with the approval (checked against the record's offer)."""
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
    changed = checked_edits(record, decision.verdict, edits)
    grant_seconds = checked_seconds(record, decision.verdict, grant)
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
        grant_seconds=grant_seconds,
    )
    try:
        await promise.resolve(verdict)
    except TerminalError as exc:
        if not is_already_completed(exc):
            raise
        return _receipt(record, await promise.value(), accepted=False)
    return _receipt(record, verdict, accepted=True)


def checked_edits(record: ApprovalRecord, verdict: str, edits: dict[str, str]) -> dict[str, Any]:
    """The fields the approver actually changed, validated; a 400 that decides nothing otherwise."""
    if record.kind == "plan":
        return _checked_plan_edits(record, verdict, edits)
    if record.kind == "question":
        return _checked_answer(record, verdict, edits)
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


def _checked_answer(record: ApprovalRecord, verdict: str, values: dict[str, str]) -> dict[str, Any]:
    """A question's answer (the form's values), checked against its frozen form; a 400 that decides
    nothing otherwise. A decline (a reject) carries no answer. What is kept is the form's own values,
    so the approval's workflow checks the same answer again (`gate._approved_args`)."""
    if verdict != "approve":
        return {}
    try:
        parse_answer(fields_of(record.args), values)
    except EditRejected as exc:
        raise TerminalError(str(exc), 400) from None
    return dict(values)


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
        # A question's answer travels as its verdict's edits: answered is "approved", not "with edits".
        state="approved" if record.kind == "question" and verdict.kind == "approve" else _slot_state(verdict),
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


async def complete(promise: DurablePromise[Any], value: Any) -> bool:
    """Resolve unless already completed; True if this call's value won."""
    try:
        await promise.resolve(value)
    except TerminalError as exc:
        if not is_already_completed(exc):
            raise
        return False
    return True
