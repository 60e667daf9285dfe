"""A call the policy lets run without a person: one journaled step of the caller, and its record.

Guarantee: the effect runs under its idempotency key `<run_id>/<index>`, and the audit trail gets
one `autonomous` entry naming the policy version that let it run alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import restate

from countersign.contract import (
    ActionRecord,
    Outcome,
)
from countersign.events import emit as events
from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntry
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
) -> ActionRecord:
    """A call the policy lets run without a person, as one step of the caller's journal; its audit
    trail (keyed like an approval, `<run_id>-a<index>`) gets one `autonomous` entry naming the policy
    version that let it run alone (and, if `webhooks`, an `action.executed` event). The entry is sent
    at once, or given to `hold` (an agent run's book, whose next bookkeeping call carries it)."""
    run = await run_tool(ctx, tool, args, index, run_id=run_id, tenant=tenant, requester=requester)
    action = ActionRecord(
        index=index,
        tool=tool,
        proposed_args=args,
        args=args,
        outcome=Outcome.AUTONOMOUS if run.ok else Outcome.FAILED,
        result=run.result if run.ok else {"error": run.error},
        idempotency_key=idempotency_key(run_id, index),
    )
    if run.at is not None:  # the effect's step finished (a call given up after its retries has no time)
        approval_id = links.approval_id(run_id, index)
        entry = AuditEntry(
            entry_id=f"autonomous/{index}",
            approval_id=approval_id,
            run_id=run_id,
            tenant=tenant,
            kind="autonomous",
            at=run.at,
            details={
                "tool": tool,
                "args": args,
                "outcome": action.outcome.value,
                "policy_version": policy_version,
                "idempotency_key": action.idempotency_key,
            },
        )
        if hold is None:
            bookkeeping.send_entry(ctx, entry)
        else:  # the caller's own next bookkeeping call carries it
            hold(entry)
        if webhooks:
            events.autonomous_executed(ctx, tenant, run_id, approval_id, action, run.at)
    return action
