"""Standing approvals on the gate's path: what is offered, whether a grant covers a call, giving one.

Guarantee: the offer is derived, pure, from the journaled policy answer and the frozen arguments,
and is never made for a high-stakes call, a quorum tool or a call a checkpoint stopped. Whether a
grant covers a call is asked once per call, as a durable call to the call's `Grants` object whose
answer is journaled right after the policy's step: a replay or a retry re-uses it, so a use is
counted once. A grant is given only with a person's approval that asked for it and only within the
offer (the decision's checks refuse anything else with a 400 that decides nothing).
"""

from __future__ import annotations

from typing import Any

import restate
from restate import TerminalError

from countersign.approval.grants import GivenGrant, Grant, GrantAsk, GrantCheck, add_given, grant_key, number
from countersign.approval.grants import create as create_grant
from countersign.approval.grants import use as use_grant
from countersign.approval.rounds import Opening
from countersign.approval.waiting import send_step
from countersign.contract import ApprovalRecord, GrantOffer, GrantScope
from countersign.events import emit as events
from countersign.mail.grant_email import send_grant_receipt
from countersign.objects.audit import AuditEntry
from countersign.timewords import duration
from countersign.tools.policy import PolicyVerdict

MIN_GRANT_SECONDS = 1


def grant_id(approval_id: str) -> str:
    return f"g-{approval_id}"


def eligible(verdict: PolicyVerdict | None) -> bool:
    """Whether a gated call with this journaled answer may be covered by (or give) a grant."""
    if verdict is None or not verdict.gated or verdict.policy.grants is None:
        return False
    return not verdict.high_stakes and not verdict.stopped_because and verdict.policy.quorum == 1


def offer(tool: str, verdict: PolicyVerdict, args: dict[str, Any], *, requester: str, tenant: str) -> GrantOffer | None:
    """The standing approval an approver of this call may give, or None (not offered)."""
    if not eligible(verdict):
        return None
    grants = verdict.policy.grants
    assert grants is not None
    same = {name: args[name] for name in grants.same if name in args}
    at_most: dict[str, str] = {}
    for name in grants.at_most:
        value = number(args.get(name))
        if value is None:
            return None  # a bound that cannot be derived from this call: nothing is offered
        at_most[name] = str(value)
    if len(same) != len(grants.same):
        return None
    who = requester.lower() if grants.scope == "requester" else tenant
    bounds = [f"{k} = {v}" for k, v in sorted(same.items())] + [f"{k} ≤ {v}" for k, v in sorted(at_most.items())]
    asked_for = f"asked for {who}" if grants.scope == "requester" else f"asked for anyone in tenant {who}"
    uses = "1 call" if grants.max_uses == 1 else f"{grants.max_uses} calls"
    words = (
        f"Calls of {tool} {asked_for}"
        + (f" with {', '.join(bounds)}" if bounds else "")
        + f" run without asking you: at most {uses}, for the time you pick (up to {duration(grants.max_seconds)})."
    )
    return GrantOffer(
        max_seconds=grants.max_seconds,
        max_uses=grants.max_uses,
        scope=grants.scope,
        scope_value=who,
        same=same,
        at_most=at_most,
        words=words,
    )


def checked_seconds(record: ApprovalRecord, verdict: str, raw: int | str | None) -> int | None:
    """The grant's duration a decision asks for, checked against the record's offer; a 400 that
    decides nothing when it is not offered, not a whole number of seconds or out of bounds."""
    if raw is None or raw == "":
        return None
    if verdict != "approve":
        raise TerminalError("A standing approval goes with an approval, not a rejection.", 400)
    if record.grant_offer is None:
        raise TerminalError("This approval offers no standing approval.", 400)
    try:
        seconds = int(raw)
    except ValueError:
        raise TerminalError("The standing approval's duration must be a whole number of seconds.", 400) from None
    if not MIN_GRANT_SECONDS <= seconds <= record.grant_offer.max_seconds:
        most = duration(record.grant_offer.max_seconds)
        raise TerminalError(f"A standing approval lasts from 1 second to {most}.", 400)
    return seconds


async def covering(
    ctx: restate.Context,
    tool: str,
    verdict: PolicyVerdict | None,
    opening: Opening | None,
    args: dict[str, Any],
    *,
    use_id: str,
    requester: str,
    tenant: str,
) -> GrantCheck | None:
    """Whether a live grant covers this gated call (its use then counted, once); None when the
    tool's policy offers no grants or this call may not be covered by one."""
    if opening is None or not eligible(verdict):
        return None
    assert verdict is not None and verdict.policy.grants is not None
    scope = verdict.policy.grants.scope
    key = grant_key(tool, scope, requester if scope == "requester" else tenant)
    ask = GrantAsk(use_id=use_id, args=args, at=opening.now)
    return await ctx.object_call(use_grant, key=key, arg=ask, idempotency_key=f"grant-use/{key}/{use_id}")


async def give(ctx: restate.Context, record: ApprovalRecord, by: str, at: float, seconds: int) -> Grant:
    """Keep the standing approval `by` gave with their approval of `record` (once per approval)."""
    offer_ = record.grant_offer
    assert offer_ is not None
    grant = Grant(
        **GrantScope.model_validate(offer_.model_dump()).model_dump(),
        grant_id=grant_id(record.approval_id),
        tool=record.tool,
        tenant=record.tenant,
        granted_by=by,
        granted_at=at,
        expires_at=at + seconds,
        approval_id=record.approval_id,
    )
    kept = await ctx.object_call(create_grant, key=grant.key, arg=grant)
    record.grant_id = kept.grant_id
    if record.webhooks:
        events.grant_changed(ctx, "grant.created", kept.model_dump(mode="json"), at)
    ctx.object_send(add_given, key=by, arg=GivenGrant(key=kept.key, grant_id=kept.grant_id))  # their inbox page
    # The receipt, with the link that revokes it, to the person who gave it.
    shown = {**kept.model_dump(mode="json"), "key": kept.key}
    await send_step(ctx, f"email grant receipt #{record.index}", send_grant_receipt, record, shown)
    return kept


def created_entry(record: ApprovalRecord, by: str, at: float, seconds: int) -> AuditEntry:
    """The approval's audit entry for the standing approval given with it."""
    offer_ = record.grant_offer
    assert offer_ is not None
    return AuditEntry(
        entry_id=f"grant_created/{record.round}",
        approval_id=record.approval_id,
        run_id=record.run_id,
        tenant=record.tenant,
        kind="grant_created",
        at=at,
        actor=by,
        details={"grant_id": grant_id(record.approval_id), "expires_at": at + seconds, **offer_.model_dump()},
    )
