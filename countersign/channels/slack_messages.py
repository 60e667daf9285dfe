"""`SlackMessages`: the Slack messages of one approval (Virtual Object, key = approval id).

Guarantee: the approval's workflow only ever sends here (one-way, with an idempotency key per
delivery and per update), so a Slack outage or rate limit delays only this approval's Slack
messages, never its emails or its decision. Each post is one journaled step that first looks for a
message already carrying its idempotency key (message metadata) in the destination, so a retry
after a lost answer does not post twice; each post leaves a `slack_posted` audit entry. Calls for
one approval run in the order sent (a Virtual Object), so an update never overtakes its post.
"""

from __future__ import annotations

import logging

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, TerminalError

from countersign import retention
from countersign.channels import slack
from countersign.channels.base import ChannelRequest
from countersign.errors import is_cancellation
from countersign.mail.approval_email import page_url
from countersign.objects import bookkeeping
from countersign.objects.audit import AuditEntry
from countersign.objects.delivery import APPROVAL_HANDLER, APPROVAL_SERVICE, DeliveryFailure
from countersign.observability import metrics, tracing
from countersign.settings import get_settings

log = logging.getLogger("countersign.slack")
SERVICE = "SlackMessages"
STATE = "messages"
HISTORY_LIMIT = 100

slack_messages = restate.VirtualObject(
    SERVICE, description="The Slack messages of one approval: posted, then updated in place."
)


class SlackPost(BaseModel):
    request: ChannelRequest
    channel: str | None = None
    """A channel the policy names; None: a DM to the approver (looked up by email)."""
    only: bool = False
    """Slack is this approver's only channel: if the post fails, they cannot decide (as for a bounce)."""


class SlackNotice(BaseModel):
    """How the approval's messages should read now. `final`: decided/expired/cancelled (no buttons
    anywhere); otherwise messages of rounds before `round` lose their buttons, and `reminder`
    notes a reminder on the current round's messages, keeping their buttons."""

    round: int
    line: str
    final: bool = False
    reminder: bool = False


class Messages(BaseModel):
    items: list[slack.Posted] = Field(default_factory=list)


def _metadata(key: str) -> dict[str, object]:
    return {"event_type": slack.METADATA_EVENT, "event_payload": {"idempotency_key": key}}


async def post_message(post: SlackPost) -> slack.Posted:
    """Step body: find the destination, post unless a message with this key is already there."""
    r = post.request
    record, approver = r.record, r.record.approvers[r.slot]
    user = ""
    if post.channel:
        channel = post.channel
    else:
        found = await slack.call("users.lookupByEmail", email=approver)
        user = str(found.get("user", {}).get("id", ""))
        opened = await slack.call("conversations.open", users=user)
        channel = str(opened.get("channel", {}).get("id", ""))
    answer_url = page_url(record, r.slot, get_settings()) if record.kind == "question" else None
    text, blocks = slack.request_blocks(record, r.slot, r.goal, r.kind, (r.confirm_label, r.confirm_value), answer_url)
    history = await slack.call("conversations.history", channel=channel, limit=HISTORY_LIMIT, include_all_metadata=True)
    for message in history.get("messages", []):
        payload = (message.get("metadata") or {}).get("event_payload") or {}
        if payload.get("idempotency_key") == r.key:
            ts = str(message.get("ts", ""))
            break
    else:
        sent = await slack.call(
            "chat.postMessage", channel=channel, text=text, blocks=blocks, metadata=_metadata(r.key)
        )
        channel, ts = str(sent.get("channel", channel)), str(sent.get("ts", ""))
    return slack.Posted(
        key=r.key, round=record.round, slot=r.slot, approver=approver, channel=channel, ts=ts, text=text, blocks=blocks
    )


async def update_message(channel: str, ts: str, text: str, blocks: list[dict[str, object]]) -> None:
    await slack.call("chat.update", channel=channel, ts=ts, text=text, blocks=blocks)


# Private: only the approval's workflow sends here.
@slack_messages.handler(name="post", ingress_private=True, journal_retention=retention.NO_JOURNAL)
async def post(ctx: ObjectContext, request: SlackPost) -> None:
    r = request.request
    ids = {"tool": r.record.tool, "approval_id": r.record.approval_id, "run_id": r.record.run_id}
    try:
        with tracing.step(f"slack {r.kind}", channel="slack", tenant=r.record.tenant, kind=r.kind, **ids):
            posted = await ctx.run_typed(f"slack {r.key}", post_message, slack.SLACK_RETRIES, post=request)
    except TerminalError as exc:
        if is_cancellation(exc):
            raise
        metrics.record_delivery_failed("slack", "refused")
        log.warning("slack message for %s not posted: %s", r.record.approval_id, exc.message)
        if request.only:
            _undeliverable(ctx, r, exc.message)
        # Otherwise the other channels carry the request: the approver can still decide by email.
        return
    messages = await ctx.get(STATE, type_hint=Messages) or Messages()
    messages.items.append(posted)
    ctx.set(STATE, messages)
    entry = AuditEntry(
        entry_id=f"slack_posted/{r.key}",
        approval_id=r.record.approval_id,
        run_id=r.record.run_id,
        tenant=r.record.tenant,
        kind="slack_posted",
        at=r.at,
        details={"to": posted.approver, "channel": posted.channel, "ts": posted.ts, "message": r.kind},
    )
    bookkeeping.send_entry(ctx, entry, once_per_entry=True)


def _undeliverable(ctx: ObjectContext, r: ChannelRequest, error: str) -> None:
    """Tell the approval that this approver cannot be reached, as a bounce would (by name: the
    approval's workflow imports this module)."""
    failure = DeliveryFailure(
        run_id=r.record.run_id,
        approval_id=r.record.approval_id,
        round=r.record.round,
        slot=r.slot,
        kind=r.kind,
        event="email.failed",
        email_id=r.key,
        detail=f"Slack: {error}"[:300],
        failed_slots=[r.slot],
    )
    ctx.generic_send(
        APPROVAL_SERVICE,
        APPROVAL_HANDLER,
        failure.model_dump_json().encode(),
        key=r.record.approval_id,
        idempotency_key=f"delivery-failed/{r.record.approval_id}/{r.key}",
        headers={"content-type": "application/json"},
    )


@slack_messages.handler(name="update", ingress_private=True, journal_retention=retention.NO_JOURNAL)
async def update(ctx: ObjectContext, notice: SlackNotice) -> None:
    messages = await ctx.get(STATE, type_hint=Messages) or Messages()
    for n, message in enumerate(messages.items):
        if message.closed:
            continue
        current = message.round >= notice.round
        if current and not notice.final and not notice.reminder:
            continue
        keep = current and not notice.final
        blocks = slack.with_note(message, notice.line, keep_buttons=keep)
        try:
            await ctx.run_typed(
                f"slack update {n}",
                update_message,
                slack.SLACK_RETRIES,
                message.channel,
                message.ts,
                message.text,
                blocks,
            )
        except TerminalError as exc:
            if is_cancellation(exc):
                raise
            log.warning("slack message of %s not updated: %s", ctx.key(), exc.message)
            continue
        message.closed = not keep
        if keep:
            message.blocks = blocks
    ctx.set(STATE, messages)


class SlackChannel:
    """The Slack channel: hands the post to `SlackMessages` (one-way, under the delivery's key)."""

    name = "slack"

    def __init__(self, channel: str | None, *, only: bool = False) -> None:
        self.channel, self.only = channel, only

    async def deliver(self, ctx: restate.Context, request: ChannelRequest) -> str | None:
        post_ = SlackPost(request=request, channel=self.channel, only=self.only)
        ctx.object_send(post, key=request.record.approval_id, arg=post_, idempotency_key=f"slack/{request.key}")
        return request.key


def notify(ctx: restate.Context, approval_id: str, notice: SlackNotice) -> None:
    """Rewrite the approval's Slack messages (one-way; a journaled send, so exactly once)."""
    ctx.object_send(update, key=approval_id, arg=notice)
