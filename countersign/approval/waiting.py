"""Waiting for decisions: reminders, escalation, quorum, deadlines, for one or several approvals.

Guarantee: every approver slot of every round has one decision promise, completed exactly once by
whichever comes first: the person, the deadline, a cancel, an escalation, or the close after the
approval was decided elsewhere. A verdict that raced in is honoured before any closing, so each
approval has a single winner. Several approvals (a batch from one model turn) are waited on in one
deterministic loop; every loop is bounded by the policies' finite events.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import restate
from restate import TerminalError

from countersign.approval import confirm, ledger, tally
from countersign.approval.deadlines import can_escalate, next_event
from countersign.approval.rounds import EMAIL_RETRIES, closing, open_round
from countersign.approval.run_state import RunBook
from countersign.approval.verdict import (
    Verdict,
    VerdictKind,
    cancel_promise,
    slot_promise,
    state_of,
)
from countersign.channels import ChannelRequest, channels_of, uses_slack
from countersign.channels.email import EMAIL
from countersign.channels.slack import final_line
from countersign.channels.slack_messages import SlackChannel, SlackNotice
from countersign.channels.slack_messages import notify as slack_notify
from countersign.contract import ApprovalRecord
from countersign.errors import is_already_completed, is_cancellation
from countersign.mail.approval_email import MailKind, idempotency_key, send_batch_request
from countersign.mail.receipt_email import send_decision_receipt
from countersign.observability import metrics
from countersign.tools.policy import ToolPolicy


class Waiter:
    """One approval's state machine. Never awaits a decision itself: `wait_all` multiplexes."""

    def __init__(self, book: RunBook, record: ApprovalRecord, policy: ToolPolicy) -> None:
        self.book, self.ctx, self.record, self.policy = book, book.ctx, record, policy
        self.clock = record.round_started_at
        # Set by a caller that acts on the decision and then tells the requester (`gate`): the receipt
        # of the vote that decides waits in `held_receipt` and goes out in the outcome notice's step.
        self.holds_deciding_receipt = False
        self.held_receipt: Verdict | None = None

    def promise(self, slot: int) -> restate.DurablePromise[Verdict]:
        return self.ctx.promise(slot_promise(self.record.approval_id, self.record.round, slot), type_hint=Verdict)

    def open_slots(self) -> list[int]:
        return tally.open_slots(self.record)

    def event_bound(self) -> int:
        return tally.event_bound(self.policy)

    def count(self, verdict: Verdict) -> Verdict | None:
        """Record one slot's verdict (audited if a person's; the caller saves it); the deciding
        verdict if the approval is now decided."""
        self.clock = max(self.clock, verdict.at)
        final = tally.record_vote(self.record, verdict)
        if verdict.slot >= 0 and verdict.source == "human":
            ledger.voted(self.book, self.record, verdict)
        return final

    async def take(self, verdict: Verdict) -> Verdict | None:
        """A verdict that arrived on a slot: count it, confirm a person's decision to them by email,
        and when an approver cannot be reached, go on without them if the others can still decide."""
        if verdict.kind == "undeliverable" and verdict.slot >= 0:
            self.count(verdict)
            self.book.save()
            if tally.quorum_reachable(self.record):
                return None
            return await self.escalate_or_give_up(verdict.reason)
        final = self.count(verdict)
        receipt = verdict.source == "human" and verdict.kind in ("approve", "reject")
        if receipt and final is not None and self.holds_deciding_receipt:
            self.held_receipt, receipt = verdict, False  # sent with the outcome notice, after the effect
        if final is None or receipt:
            # Saved before the approval waits again or a receipt's step runs; a deciding verdict with
            # neither is saved once, with the approval's conclusion, which every caller of `take` runs
            # next (`settle`, then `conclude`).
            self.book.save()
        if receipt:
            await self.send_receipt(verdict)
        return final

    async def send_receipt(self, verdict: Verdict) -> None:
        """The receipt of a person's vote, in a step of its own. In this workflow, not in `decide`: a
        mail provider that is slow or failing must never hold up (or time out) the approver's click."""
        name = f"email receipt #{self.record.index} round {verdict.round} slot {verdict.slot}"
        await send_step(self.ctx, name, send_decision_receipt, self.record, verdict.slot, verdict.client, verdict.edits)

    async def send_held_receipt(self) -> None:
        """The held receipt of the deciding vote, on its own, before the approval waits again."""
        if self.held_receipt is not None:
            verdict, self.held_receipt = self.held_receipt, None
            await self.send_receipt(verdict)

    def conclude(self, final: Verdict) -> Verdict:
        """Mark the approval decided as soon as it is, before the other items of a batch are."""
        self.record.state = state_of(final)
        self.record.decided_at = final.at
        self.book.save()
        ledger.closed(self.book, self.record, self.record.active_slots, why=self.record.state)
        by = ", ".join(sorted({v.by for v in self.record.approvals_in_round() if v.by})) or final.by
        via = final.via if final.source == "human" else None
        question = self.record.kind == "question"
        line = final_line(self.record.state, by, via, final.at, final.reason, question=question, source=final.source)
        self.slack(line, final=True)
        return final

    def slack(self, line: str, *, final: bool = False, reminder: bool = False) -> None:
        """Rewrite this approval's Slack messages in place, when its policy uses Slack."""
        if uses_slack(self.policy):
            notice = SlackNotice(round=self.record.round, line=line, final=final, reminder=reminder)
            slack_notify(self.ctx, self.record.approval_id, notice)

    async def settle(self, final: Verdict) -> Verdict:
        """Close the slots still open with a copy of the deciding verdict, so late clicks see it.
        A person's verdict that raced in was accepted (they were told so): it is recorded and audited.
        Saved by `conclude`, which every caller runs next."""
        copy = final.model_copy(update={"kind": "close", "closes_as": state_of(final)})
        for late in await self._close(self.open_slots(), copy):
            tally.record_vote(self.record, late)  # recorded, though the approval is decided already
            if late.source == "human":
                ledger.voted(self.book, self.record, late)
        return final

    async def _close(self, slots: list[int], verdict: Verdict) -> list[Verdict]:
        """Complete each slot's promise with `verdict`; returns the verdicts that had already won."""
        raced = []
        for slot in slots:
            try:
                await self.promise(slot).resolve(verdict.model_copy(update={"slot": slot}))
            except TerminalError as exc:
                if not is_already_completed(exc):
                    raise
                raced.append(await self.promise(slot).value())
        return raced

    async def close_all(self, kind: VerdictKind, reason: str) -> Verdict:
        """End the round with `kind`, unless a verdict that raced in decides it first."""
        ending = closing(self.record, kind, self.clock, reason)
        for verdict in await self._close(self.open_slots(), ending):
            if (final := await self.take(verdict)) is not None:
                return await self.settle(final)
        return ending

    async def on_timer(self) -> Verdict | None:
        at, event = next_event(self.record, self.policy)
        self.clock = max(self.clock, at)
        if event == "reminder":
            self.record.reminders_sent += 1
            self.book.save()
            ledger.reminded(self.book, self.record, self.open_slots(), self.clock)
            await self.notify("reminder", self.open_slots())
            metrics.record_reminder(self.record.tool)
            return None
        if event == "escalate":
            return await self._escalate()
        return await self._deadline()

    async def _deadline(self) -> Verdict:
        final = await self.close_all("expire", "the deadline passed without a decision")
        if final.kind != "expire":  # a person's verdict raced in before the deadline closed the slots
            return final
        return tally.at_deadline(final, self.policy)

    async def _escalate(self, reason: str | None = None) -> Verdict | None:
        record, policy = self.record, self.policy
        successor = policy.escalate_to[record.escalations]
        for verdict in await self._close(
            self.open_slots(), closing(record, "escalate", self.clock, f"escalated to {successor}")
        ):
            if (final := await self.take(verdict)) is not None:
                return await self.settle(final)
        opening = await self.ctx.run_typed(f"escalate approval #{record.index} to {successor}", open_round)
        metrics.record_escalation(record.tool)
        previous = record.active_slots
        record.approvers.append(successor)
        record.active_slots = [len(record.approvers) - 1]
        record.escalations += 1
        self.start_round(opening.nonce, opening.now, note=None)
        ledger.handed_over(self.book, record, previous, "escalated", opening.now)
        if not await self.notify("escalation", record.active_slots, reason):
            return await self.escalate_or_give_up()
        return None

    async def reassign(self, verdict: Verdict) -> Verdict | None:
        """An operator handed one approver's slot to someone else: a new round, fresh links for all
        still deciding, the approvals already given kept."""
        record = self.record
        others = [s for s in self.open_slots() if s != verdict.slot]
        handover = closing(record, "escalate", self.clock, f"reassigned to {verdict.to}; a newer email was sent")
        for raced in await self._close(others, handover):
            if (final := await self.take(raced)) is not None:
                return await self.settle(final)
        opening = await self.ctx.run_typed(f"reassign approval #{record.index} to {verdict.to}", open_round)
        previous = record.active_slots
        record.approvers.append(verdict.to or "")
        record.active_slots = [len(record.approvers) - 1 if s == verdict.slot else s for s in previous]
        self.start_round(opening.nonce, opening.now, note=None, keep_approvals=True)
        ledger.handed_over(
            self.book, record, previous, "reassigned", opening.now, actor=verdict.asked_by, reason=verdict.reason
        )
        await self.notify("request", self.open_slots())
        return None

    async def escalate_or_give_up(self, reason: str | None = None) -> Verdict | None:
        if can_escalate(self.record, self.policy):
            return await self._escalate(reason)
        return await self.close_all("undeliverable", reason or "no approval email could be delivered")

    def start_round(self, nonce: str, now: float, note: str | None, keep_approvals: bool = False) -> None:
        tally.begin_round(self.record, nonce, now, note, keep_approvals)
        self.clock = now
        self.book.state.phase = "awaiting_approval"
        self.book.save()

    async def notify(self, kind: MailKind, slots: list[int], reason: str | None = None) -> int:
        """Send these slots the request through their channels (`policy.channels`, email by
        default); returns how many slots at least one channel took."""
        record = self.record
        if kind == "reminder":
            awaited = "an answer" if record.kind == "question" else "a decision"
            self.slack(f"Reminder {record.reminders_sent}: still waiting for {awaited}.", reminder=True)
        elif record.round > 1:
            now_with = ", ".join(record.approvers[s] for s in record.active_slots)
            self.slack(f"Asked again, of {now_with}: this message no longer decides; see the newer one.")
        delivered = 0
        for slot in slots:
            request = self.request(kind, slot, reason)
            channels = channels_of(self.policy, record.approvers[slot])
            taken = False
            if "email" in channels:
                message_id = await EMAIL.deliver(self.ctx, request)
                if message_id is not None:
                    ledger.emailed(self.book, record, slot, kind, message_id, self.clock)
                    taken = True
            if "slack" in channels and kind != "reminder":  # a reminder rewrites the message in place
                slack = SlackChannel(self.policy.slack_channel, only="email" not in channels)
                taken = await slack.deliver(self.ctx, request) is not None or taken
            elif "slack" in channels:
                taken = True
            delivered += taken
        return delivered

    def channels(self) -> set[str]:
        """The channels that reach the approvers still deciding."""
        return {c for s in self.open_slots() for c in channels_of(self.policy, self.record.approvers[s])}

    def request(self, kind: MailKind, slot: int, reason: str | None = None) -> ChannelRequest:
        """What goes to one slot's approver, whichever channel carries it."""
        record = self.record
        name = f"email {kind} #{record.index} round {record.round} slot {slot}"
        if kind == "reminder":
            name += f" n{record.reminders_sent}"
        return ChannelRequest(
            record=record,
            slot=slot,
            goal=self.book.state.goal,
            kind=kind,
            at=self.clock,
            reason=reason,
            step=name,
            key=idempotency_key(record, slot, kind),
            confirm_label=confirm.label(record) if record.confirm_field else None,
            confirm_value=confirm.expected(record),
        )


Sent = TypeVar("Sent")


async def send_step(ctx: restate.Context, name: str, action: Callable[..., Sent], *args: Any) -> Sent | None:
    """One email step; None when the provider refused it for good (the step's retries are bounded)."""
    try:
        return await ctx.run_typed(name, action, EMAIL_RETRIES, *args)
    except TerminalError as exc:
        if is_cancellation(exc):
            raise
        return None


async def notify_batch(book: RunBook, waiters: list[Waiter]) -> dict[int, int]:
    """One email per approver covering every item they are asked about, and for an approver the
    policy reaches in Slack one Slack message per item (Slack has no batch message); per item, how
    many slots at least one channel took. The caller of a batch sends it (one model turn's gated
    calls), then each item's workflow waits."""
    by_person: dict[str, list[tuple[int, int]]] = {}
    taken: dict[int, set[int]] = {i: set() for i in range(len(waiters))}
    for i, waiter in enumerate(waiters):
        for slot in waiter.open_slots():
            channels = channels_of(waiter.policy, waiter.record.approvers[slot])
            if "email" in channels:
                by_person.setdefault(waiter.record.approvers[slot], []).append((i, slot))
            if "slack" in channels:  # Slack has no batch message: each item is posted on its own
                slack = SlackChannel(waiter.policy.slack_channel, only="email" not in channels)
                if await slack.deliver(book.ctx, waiter.request("request", slot)) is not None:
                    taken[i].add(slot)
    first = waiters[0].record
    for person, items in by_person.items():
        records = [waiters[i].record for i, _ in items]
        slots = [slot for _, slot in items]
        name = f"email batch #{first.index} to {person}"
        receipt = await send_step(book.ctx, name, send_batch_request, records, slots, book.state.goal)
        if receipt is None:
            metrics.record_delivery_failed("email", "refused")
        else:
            for i, slot in items:
                ledger.emailed(book, waiters[i].record, slot, "batch", receipt.message_id, waiters[i].clock)
                taken[i].add(slot)
    return {i: len(slots) for i, slots in taken.items()}


async def wait_all(
    book: RunBook, waiters: list[Waiter], mail_kind: MailKind, delivered: list[int] | None = None
) -> list[Verdict]:
    """Notify (unless the caller already did: `delivered` accepted sends per approval), then wait until
    every approval is decided; the deciding verdict of each, in order."""
    finals: dict[int, Verdict] = {}
    if delivered is None:
        delivered = [await w.notify(mail_kind, w.open_slots()) for w in waiters]
    for i, waiter in enumerate(waiters):
        # Nobody could be emailed: hand over to the escalation chain now, or end `undeliverable`.
        if not delivered[i] and (final := await waiter.escalate_or_give_up()) is not None:
            finals[i] = waiter.conclude(final)
    cancelled = cancel_promise(book.ctx).value()
    clock = max(w.clock for w in waiters)
    for _ in range(sum(w.event_bound() for w in waiters)):
        pending = [i for i in range(len(waiters)) if i not in finals]
        if not pending:
            break
        for waiter in waiters:
            waiter.clock = max(waiter.clock, clock)
        futures: dict[str, Any] = {
            f"{i}:{slot}": waiters[i].promise(slot).value() for i in pending for slot in waiters[i].open_slots()
        }
        at, due = min((next_event(waiters[i].record, waiters[i].policy)[0], i) for i in pending)
        futures["timer"] = book.ctx.sleep(timedelta(seconds=max(0.0, at - clock)))
        futures["cancel"] = cancelled
        ledger.flush(book)
        name, value = await restate.select(**futures)
        if name == "cancel":
            for i in pending:
                finals[i] = waiters[i].conclude(await waiters[i].close_all("cancel", value.reason))
            break
        if name == "timer":
            clock = max(clock, at)
            outcome = await waiters[due].on_timer()
            i = due
        else:
            i = int(name.split(":")[0])
            clock = max(clock, value.at)
            if value.kind == "reassign":
                outcome = await waiters[i].reassign(value)
            elif (outcome := await waiters[i].take(value)) is not None:
                outcome = await waiters[i].settle(outcome)
        if outcome is not None:
            finals[i] = waiters[i].conclude(outcome)
    if len(finals) != len(waiters):
        raise TerminalError("an approval did not settle within its policy's events; this is a bug", 500)
    return [finals[i] for i in range(len(waiters))]
