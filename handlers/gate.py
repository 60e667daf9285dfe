"""One gated call: freeze the action, ask the approvers, wait for a verdict, then act on it.

Guarantee: the action is frozen (canonical JSON + SHA-256 digest) before anyone is asked. Each
approver slot of each round has one decision promise, completed exactly once by whichever comes
first: the person, the deadline, a cancel, an escalation, or the close after the approval was
decided elsewhere; a verdict that raced in is honoured before any closing. The frozen (or
validated, edited) arguments run only on approval, after a fresh precondition check, exactly once
under `<run_id>/<index>`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import restate
from pydantic import BaseModel
from restate import RunOptions, TerminalError

from handlers import links
from handlers.contract import ActionRecord, ApprovalRecord, ApprovalState, CancelRequest, Outcome, Vote
from handlers.deadlines import can_escalate, next_event
from handlers.edits import EditRejected, apply_edits
from handlers.execute import idempotency_key, recheck, run_tool
from handlers.llm.base import ToolCall
from handlers.mail.approval_email import MailKind, send_approval_request
from handlers.policy import PolicyVerdict, ToolPolicy
from handlers.run_state import RunBook
from handlers.tools.registry import Tool
from handlers.verdict import CANCEL_PROMISE, Verdict, VerdictKind, is_already_completed, is_cancellation, slot_promise

_DIGEST_DOMAIN = b"countersign.action.v1\x00"
EMAIL_RETRIES = RunOptions[Any](
    max_attempts=8, initial_retry_interval=timedelta(seconds=1), max_duration=timedelta(hours=6)
)
MAX_REAPPROVALS = 2
_OUTCOME_OF: dict[ApprovalState, Outcome] = {
    "approved": Outcome.APPROVED,
    "approved_with_edits": Outcome.APPROVED_WITH_EDITS,
    "rejected": Outcome.REJECTED,
    "expired": Outcome.EXPIRED,
    "cancelled": Outcome.CANCELLED,
    "superseded": Outcome.SUPERSEDED,
    "undeliverable": Outcome.UNDELIVERABLE,
    "failed": Outcome.FAILED,
}


class Opening(BaseModel):
    """Journaled facts of a new round: a nonce from a cryptographic source, and the time."""

    nonce: str
    now: float


@dataclass
class GateResult:
    action: ActionRecord
    fail_run: bool = False


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def action_digest(run_id: str, index: int, tool: str, args: dict[str, Any]) -> str:
    frozen = canonical_json({"run": run_id, "index": index, "tool": tool, "args": args})
    return hashlib.sha256(_DIGEST_DOMAIN + frozen.encode()).hexdigest()


def _open_round() -> Opening:
    return Opening(nonce=secrets.token_urlsafe(16), now=time.time())


async def approval_round(
    book: RunBook, tool: Tool, call: ToolCall, args: dict[str, Any], index: int, verdict: PolicyVerdict, summary: str
) -> GateResult:
    ctx, state, policy = book.ctx, book.state, verdict.policy
    opening = await ctx.run_typed(f"open approval #{index}", _open_round)
    record = ApprovalRecord(
        approval_id=links.approval_id(state.run_id, index),
        run_id=state.run_id,
        tenant=state.tenant,
        index=index,
        tool=call.name,
        args=args,
        digest=action_digest(state.run_id, index, call.name, args),
        summary=summary,
        why=call.why,
        policy=verdict.rule,
        requester=state.requester,
        approvers=list(policy.approvers),
        quorum=policy.quorum,
        active_slots=list(range(len(policy.approvers))),
        nonces=[opening.nonce],
        requested_at=opening.now,
        round_started_at=opening.now,
        deadline=opening.now + policy.deadline_seconds,
        editable={name: rule.describe() for name, rule in tool.editable.items()} if policy.quorum == 1 else {},
    )
    state.approvals[record.approval_id] = record
    state.phase = "awaiting_approval"
    book.save()
    waiter = _Waiter(book, record, policy)
    mail_kind: MailKind = "request"
    for attempt in range(MAX_REAPPROVALS + 1):
        final = await waiter.wait(mail_kind)
        if final.kind != "approve":
            return waiter.finish(final)
        try:
            executed, changed = apply_edits(tool, record.args, final.edits or {})
        except EditRejected as exc:
            return waiter.finish(final, failure=f"the approved edits are no longer valid: {exc}")
        change = await recheck(ctx, tool.name, executed, index) if tool.precondition else None
        if change is None:
            return await waiter.execute(final, executed, changed)
        if policy.on_superseded == "tell_model" or attempt == MAX_REAPPROVALS:
            return waiter.finish(_closing(record, "close", final.at, change, "superseded"))
        await waiter.new_round(change)
        mail_kind = "reapproval"
    raise AssertionError("unreachable: the last attempt always returns")


def _closing(
    record: ApprovalRecord, kind: VerdictKind, at: float, reason: str, closes_as: ApprovalState | None = None
) -> Verdict:
    return Verdict(
        kind=kind,
        slot=-1,
        round=record.round,
        digest=record.digest,
        at=at,
        reason=reason,
        source="system",
        closes_as=closes_as,
    )


class _Waiter:
    """The waiting part of one approval: notify, then react to verdicts and timers until it is final."""

    def __init__(self, book: RunBook, record: ApprovalRecord, policy: ToolPolicy) -> None:
        self.book, self.ctx, self.record, self.policy = book, book.ctx, record, policy
        self.clock = record.round_started_at

    def _promise(self, slot: int, round_: int | None = None) -> restate.DurablePromise[Verdict]:
        name = slot_promise(self.record.approval_id, round_ or self.record.round, slot)
        return self.ctx.promise(name, type_hint=Verdict)

    def _open_slots(self) -> list[int]:
        voted = {v.slot for v in self.record.votes if v.round == self.record.round}
        return [s for s in self.record.active_slots if s not in voted]

    async def wait(self, mail_kind: MailKind) -> Verdict:
        """Until the approval is decided: returns the deciding verdict (approve means quorum reached)."""
        delivered = await self._notify(mail_kind, self._open_slots())
        if not delivered and (escalated := await self._escalate_or_give_up()) is not None:
            return escalated
        policy = self.policy
        rounds = 1 + len(policy.escalate_to)
        events = 2 + len(policy.approvers) + len(policy.escalate_to) + rounds * (1 + len(policy.reminders_seconds))
        for _ in range(events):
            if await self.ctx.promise(CANCEL_PROMISE, type_hint=CancelRequest).peek() is not None:
                return await self._close_all("cancel", "the run was cancelled")
            futures: dict[str, Any] = {f"s{slot}": self._promise(slot).value() for slot in self._open_slots()}
            at, event = next_event(self.record, self.policy)
            futures["timer"] = self.ctx.sleep(timedelta(seconds=max(0.0, at - self.clock)))
            name, value = await restate.select(**futures)
            if name != "timer":
                if (final := self._count(value)) is not None:
                    return await self._settle(final)
                continue
            self.clock = at
            if event == "reminder":
                self.record.reminders_sent += 1
                self.book.save()
                await self._notify("reminder", self._open_slots())
            elif event == "escalate":
                if (final := await self._escalate()) is not None:
                    return final
            else:
                return await self._deadline()
        raise TerminalError(f"approval {self.record.approval_id} did not settle; this is a bug", 500)

    def _count(self, verdict: Verdict) -> Verdict | None:
        """Record one slot's verdict; return the deciding verdict if the approval is now decided."""
        record = self.record
        self.clock = max(self.clock, verdict.at)
        if verdict.slot >= 0:
            record.votes.append(
                Vote(
                    slot=verdict.slot,
                    round=verdict.round,
                    kind=verdict.kind,
                    by=verdict.by,
                    at=verdict.at,
                    reason=verdict.reason,
                )
            )
            self.book.save()
        if verdict.kind == "approve" and verdict.source == "human":
            return verdict if len(record.approvals_in_round()) >= record.quorum else None
        return verdict

    async def _settle(self, final: Verdict) -> Verdict:
        """Close the slots still open with a copy of the deciding verdict, so late clicks see it."""
        closing = final.model_copy(update={"kind": "close", "closes_as": self._state_of(final)})
        for late in await self._close(self._open_slots(), closing):
            self.record.votes.append(
                Vote(slot=late.slot, round=late.round, kind=late.kind, by=late.by, at=late.at, reason=late.reason)
            )
        self.book.save()
        return final

    async def _close(self, slots: list[int], verdict: Verdict) -> list[Verdict]:
        """Complete each slot's promise with `verdict`; returns the verdicts that had already won."""
        raced = []
        for slot in slots:
            try:
                await self._promise(slot).resolve(verdict.model_copy(update={"slot": slot}))
            except TerminalError as exc:
                if not is_already_completed(exc):
                    raise
                raced.append(await self._promise(slot).value())
        return raced

    async def _close_all(self, kind: VerdictKind, reason: str) -> Verdict:
        """End the round with `kind`, unless a verdict that raced in decides it first."""
        closing = _closing(self.record, kind, self.clock, reason)
        for verdict in await self._close(self._open_slots(), closing):
            if (final := self._count(verdict)) is not None:
                return await self._settle(final)
        return closing

    async def _deadline(self) -> Verdict:
        final = await self._close_all("expire", "the deadline passed without a decision")
        if final.kind != "expire":
            return final
        timeout = self.policy.timeout_outcome
        final = final.model_copy(update={"source": "deadline_default"})
        if timeout == "allow":
            return final.model_copy(update={"kind": "approve", "reason": "the deadline passed; policy allows it"})
        if timeout == "fail":
            return final.model_copy(update={"reason": "the deadline passed; policy fails the run"})
        return final

    async def _escalate(self) -> Verdict | None:
        record, policy = self.record, self.policy
        successor = policy.escalate_to[record.escalations]
        escalation = _closing(record, "escalate", self.clock, f"escalated to {successor}")
        for verdict in await self._close(self._open_slots(), escalation):
            if (final := self._count(verdict)) is not None:
                return await self._settle(final)
        opening = await self.ctx.run_typed(f"escalate approval #{record.index} to {successor}", _open_round)
        record.approvers.append(successor)
        record.active_slots = [len(record.approvers) - 1]
        record.escalations += 1
        self._start_round(opening, note=None)
        if not await self._notify("escalation", record.active_slots):
            return await self._escalate_or_give_up()
        return None

    async def _escalate_or_give_up(self) -> Verdict | None:
        if can_escalate(self.record, self.policy):
            return await self._escalate()
        return await self._close_all("undeliverable", "no approval email could be delivered")

    async def new_round(self, change: str) -> None:
        """Ask the current approvers again, showing what changed; older links stop working."""
        opening = await self.ctx.run_typed(f"reopen approval #{self.record.index}", _open_round)
        self.record.deadline = opening.now + self.policy.deadline_seconds
        self.record.state = "pending"
        self._start_round(opening, note=change)

    def _start_round(self, opening: Opening, note: str | None) -> None:
        record = self.record
        record.round += 1
        record.nonces.append(opening.nonce)
        record.round_started_at = opening.now
        record.reminders_sent = 0
        record.change_note = note
        self.clock = opening.now
        self.book.state.phase = "awaiting_approval"
        self.book.save()

    async def _notify(self, kind: MailKind, slots: list[int]) -> int:
        """Email these slots; returns how many sends the mail backend accepted."""
        delivered = 0
        for slot in slots:
            name = f"email {kind} #{self.record.index} round {self.record.round} slot {slot}"
            if kind == "reminder":
                name += f" n{self.record.reminders_sent}"
            try:
                await self.ctx.run_typed(
                    name, send_approval_request, EMAIL_RETRIES, self.record, slot, self.book.state.goal, kind
                )
                delivered += 1
            except TerminalError as exc:
                if is_cancellation(exc):
                    raise
        return delivered

    @staticmethod
    def _state_of(final: Verdict) -> ApprovalState:
        if final.closes_as is not None:
            return final.closes_as
        match final.kind:
            case "approve":
                return "approved_with_edits" if final.edits else "approved"
            case "reject":
                return "rejected"
            case "expire":
                return "expired"
            case "cancel":
                return "cancelled"
            case _:
                return "undeliverable"

    def _decided(self, final: Verdict, state: ApprovalState) -> None:
        record = self.record
        record.state = state
        record.decision_source = final.source
        record.decided_at = final.at
        record.reason = final.reason
        record.approved_by = sorted({v.by for v in record.approvals_in_round() if v.by})
        record.decided_by = ", ".join(record.approved_by) if final.kind == "approve" and final.by else final.by
        self.book.state.phase = "acting"
        self.book.save()

    def finish(self, final: Verdict, failure: str | None = None) -> GateResult:
        state: ApprovalState = "failed" if failure else self._state_of(final)
        self._decided(final, state)
        action = ActionRecord(
            index=self.record.index,
            tool=self.record.tool,
            proposed_args=self.record.args,
            outcome=_OUTCOME_OF[state],
            decision_source=final.source,
            approval_id=self.record.approval_id,
            approved_by=self.record.approved_by,
            reason=failure or final.reason,
        )
        fail_run = final.kind == "expire" and self.policy.timeout_outcome == "fail"
        return GateResult(action, fail_run=fail_run)

    async def execute(self, final: Verdict, executed: dict[str, Any], changed: dict[str, Any]) -> GateResult:
        record = self.record
        if action_digest(record.run_id, record.index, record.tool, record.args) != record.digest or (
            final.source == "human" and final.digest != record.digest
        ):
            return self.finish(final, failure="the approval did not match the frozen action")
        record.edits = changed or None
        self._decided(final, "approved_with_edits" if changed else "approved")
        run = await run_tool(self.ctx, record.tool, executed, record.index)
        action = ActionRecord(
            index=record.index,
            tool=record.tool,
            proposed_args=record.args,
            args=executed,
            edits=record.edits,
            outcome=Outcome.APPROVED_WITH_EDITS if changed else Outcome.APPROVED,
            decision_source=final.source,
            approval_id=record.approval_id,
            approved_by=record.approved_by,
            reason=final.reason,
            idempotency_key=idempotency_key(record.run_id, record.index),
            result=run.result if run.ok else {"error": run.error},
        )
        if not run.ok:
            action.outcome = Outcome.FAILED
        return GateResult(action)
