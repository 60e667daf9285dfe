"""The four events, built from the records the runs keep, and sent one way to `WebhookEvents`.

Guarantee: each emit is one journaled one-way send (nothing the run awaits), under an idempotency
key made from the event's `webhook-id`, which is derived from what the event is about (the approval
and its round, the run): a replayed run journals the same send, and the same event sent again by
another handler (a deferred approval is decided in its workflow and acted on by its caller) is
deduplicated by Restate. Sent only when the journaled answer the event belongs to (the policy's
answer for a call, a model turn for a run) says the tenant had endpoints then (`wanted`), so that a
tenant without webhooks pays nothing for them and changing COUNTERSIGN_WEBHOOKS never changes what a
replay must journal.
"""

from __future__ import annotations

from typing import Any, Literal

from restate import Context

from countersign.contract import ActionRecord, ApprovalRecord, RunResult
from countersign.events.delivery import WebhookEvent, event_id, publish
from countersign.security import links
from countersign.settings import WebhookEventType, get_settings


def wanted(tenant: str) -> bool:
    """Whether `tenant` has any webhook endpoint: read inside a journaled step (the policy's answer,
    the model turn), whose journaled result then decides whether the events are sent."""
    return bool(get_settings().webhook_endpoints(tenant))


def _send(
    ctx: Context, type: WebhookEventType, about: str, of: tuple[str, str, str], at: float, data: dict[str, Any]
) -> None:
    tenant, run_id, subject = of
    event = WebhookEvent(
        id=event_id(tenant, about), type=type, tenant=tenant, run_id=run_id, subject=subject, at=at, data=data
    )
    ctx.object_send(publish, key=f"{tenant}:{subject}", arg=event, idempotency_key=f"webhook/{event.id}")


def approval_requested(ctx: Context, record: ApprovalRecord) -> None:
    """A round of `record` went out to its approvers (the first one, a re-approval, an escalation...)."""
    if not record.webhooks:
        return
    data = {
        "approval_id": record.approval_id,
        "run_id": record.run_id,
        "tenant": record.tenant,
        "round": record.round,
        "tool": record.tool,
        "summary": record.summary,
        "args": record.args,
        "digest": record.digest,
        "approvers": [record.approvers[s] for s in record.active_slots],
        "quorum": record.quorum,
        "requested_at": record.round_started_at,
        "deadline": record.deadline,
    }
    about = f"approval.requested/{record.approval_id}/r{record.round}"
    _send(ctx, "approval.requested", about, _subject(record), record.round_started_at, data)


def approval_decided(ctx: Context, record: ApprovalRecord) -> None:
    """`record` was decided (its state, who and when already set on it)."""
    if not record.webhooks:
        return
    at = record.decided_at or record.round_started_at
    data = {
        "approval_id": record.approval_id,
        "run_id": record.run_id,
        "tenant": record.tenant,
        "tool": record.tool,
        "verdict": record.state,
        "decided_by": record.decided_by,
        "approved_by": record.approved_by,
        "source": record.decision_source,
        "reason": record.reason,
        "edits": record.edits,
        "decided_at": at,
    }
    _send(ctx, "approval.decided", f"approval.decided/{record.approval_id}", _subject(record), at, data)


def action_executed(ctx: Context, record: ApprovalRecord, action: ActionRecord, at: float) -> None:
    """The approved effect of `record` ran (successfully or not: `ok` says)."""
    if not record.webhooks:
        return
    _executed(ctx, (record.tenant, record.run_id, record.approval_id), action, at, approval_id=record.approval_id)


def autonomous_executed(ctx: Context, tenant: str, run_id: str, subject: str, action: ActionRecord, at: float) -> None:
    """A call the policy let run without a person ran (`autonomous: true`, no approval id);
    `subject` is the key its audit trail has (`<run_id>-a<index>`)."""
    _executed(ctx, (tenant, run_id, subject), action, at, approval_id=None)


def in_plan_executed(ctx: Context, tenant: str, run_id: str, action: ActionRecord, at: float) -> None:
    """A call inside an approved plan ran without an approval of its own (`plan_approval_id` names
    the plan's); keyed like an autonomous call, `<run_id>-a<index>`."""
    _executed(ctx, (tenant, run_id, links.approval_id(run_id, action.index)), action, at, approval_id=None)


def _executed(
    ctx: Context, of: tuple[str, str, str], action: ActionRecord, at: float, *, approval_id: str | None
) -> None:
    tenant, run_id, subject = of
    error = (action.result or {}).get("error") if action.outcome.value == "failed" else None
    data = {
        "approval_id": approval_id,
        "autonomous": approval_id is None and action.plan_approval_id is None and action.grant_id is None,
        "plan_approval_id": action.plan_approval_id,
        "grant_id": action.grant_id,
        "run_id": run_id,
        "tenant": tenant,
        "index": action.index,
        "tool": action.tool,
        "args": action.args,
        "ok": action.outcome.value != "failed",
        "outcome": action.outcome.value,
        "result": None if error is not None else action.result,
        "error": error,
        "idempotency_key": action.idempotency_key,
        "executed_at": at,
    }
    _send(ctx, "action.executed", f"action.executed/{subject}", of, at, data)


def run_finished(ctx: Context, tenant: str, result: RunResult) -> None:
    """An agent run ended (completed, failed or cancelled). Its time is stamped by `publish` (the run
    would otherwise journal a clock read of its own)."""
    data = {
        "run_id": result.run_id,
        "tenant": tenant,
        "status": result.status,
        "answer": result.answer,
        "actions": [
            {"index": a.index, "tool": a.tool, "outcome": a.outcome.value, "approval_id": a.approval_id}
            for a in result.actions
        ],
    }
    _send(ctx, "run.finished", f"run.finished/{result.run_id}", (tenant, result.run_id, result.run_id), 0.0, data)


def grant_changed(
    ctx: Context, type: Literal["grant.created", "grant.revoked"], grant: dict[str, Any], at: float
) -> None:
    """A standing approval was given (with its approval) or revoked; `grant` is its JSON."""
    of = (str(grant["tenant"]), run_of(str(grant["approval_id"])), str(grant["grant_id"]))
    _send(ctx, type, f"{type}/{grant['grant_id']}", of, at, dict(grant))


def run_of(approval_id: str) -> str:
    """The run of an approval id `<run_id>-a<index>`."""
    return approval_id.rsplit("-a", 1)[0]


def _subject(record: ApprovalRecord) -> tuple[str, str, str]:
    return record.tenant, record.run_id, record.approval_id
