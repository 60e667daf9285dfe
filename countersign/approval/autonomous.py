"""A call that runs without a person (the policy lets it, or a standing approval covers it): one
journaled step of the caller, and its record.

Guarantee: the effect runs under its idempotency key `<run_id>/<index>`, and the audit trail gets
one `autonomous` entry naming the policy version that let it run alone, or one `granted` entry naming
the standing approval and who gave it (whose use is also one trust sample, apart from people's decisions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import restate

from countersign.approval.grants import Grant
from countersign.contract import (
    ActionRecord,
    Outcome,
)
from countersign.events import emit as events
from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntry
from countersign.objects.bookkeeping import Notices
from countersign.objects.trust import OutcomeSample
from countersign.security import links
from countersign.tools.execute import idempotency_key, run_tool


async def run_alone(
    ctx: restate.Context,
    tool: str,
    args: dict[str, Any],
    run_id: str,
    index: int,
    tenant: str,
    requester: str,
    policy_version: str = "",
    webhooks: bool = True,
    hold: Callable[[AuditEntry], None] | None = None,
    grant: Grant | None = None,
) -> ActionRecord:
    """A call the policy lets run without a person, as one step of the caller's journal; its audit
    trail (keyed like an approval, `<run_id>-a<index>`) gets one `autonomous` entry naming the policy
    version that let it run alone (and, if `webhooks`, an `action.executed` event). The entry is sent
    at once, or given to `hold` (an agent run's book, whose next bookkeeping call carries it).
    With `grant` (a standing approval that covers the call, its use already counted) the outcome is
    `granted`, and the entry (`granted`) names the grant and who gave it."""
    approved_by = [grant.granted_by] if grant is not None else []
    run = await run_tool(
        ctx, tool, args, index, run_id=run_id, tenant=tenant, requester=requester, approved_by=approved_by
    )
    ran = Outcome.AUTONOMOUS if grant is None else Outcome.GRANTED
    action = ActionRecord(
        index=index,
        tool=tool,
        proposed_args=args,
        args=args,
        outcome=ran if run.ok else Outcome.FAILED,
        result=run.result if run.ok else {"error": run.error},
        idempotency_key=idempotency_key(run_id, index),
        approved_by=approved_by,
        decision_source="grant" if grant is not None else None,
        grant_id=grant.grant_id if grant is not None else None,
    )
    if run.at is not None:  # the effect's step finished (a call given up after its retries has no time)
        approval_id = links.approval_id(run_id, index)
        details = {
            "tool": tool,
            "args": args,
            "outcome": action.outcome.value,
            "policy_version": policy_version,
            "idempotency_key": action.idempotency_key,
        }
        if grant is not None:
            details.update(grant_id=grant.grant_id, granted_by=grant.granted_by, grant_approval_id=grant.approval_id)
        entry = AuditEntry(
            entry_id=f"{'autonomous' if grant is None else 'granted'}/{index}",
            approval_id=approval_id,
            run_id=run_id,
            tenant=tenant,
            kind="autonomous" if grant is None else "granted",
            at=run.at,
            actor=grant.granted_by if grant is not None else None,
            details=details,
        )
        if grant is not None:  # a use of a standing approval: counted apart from people's decisions
            sample = OutcomeSample(approval_id=approval_id, outcome=action.outcome.value, human=False)
            bookkeeping.send(ctx, Notices(approval_id=approval_id, sample=sample, tool=tool))
        if hold is None:
            bookkeeping.send_entry(ctx, entry)
        else:  # the caller's own next bookkeeping call carries it
            hold(entry)
        if webhooks:
            events.autonomous_executed(ctx, tenant, run_id, approval_id, action, run.at)
    return action
