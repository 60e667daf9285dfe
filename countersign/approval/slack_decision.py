"""A decision made in Slack's modal, decided in `Approval.slack_decide`.

Guarantee: Slack's signature is verified again in a journaled step, the clicking Slack user must be
the approver of the slot (by their Slack email), then the same slot promise as the email's link is
completed; every refusal is told to them in Slack, and a Slack failure never changes the answer.
"""

from __future__ import annotations

from restate import TerminalError, WorkflowSharedContext

from countersign.approval.slots import LinkCheck, record_of, settle_slot
from countersign.channels import slack, slack_interactions
from countersign.channels.slack_interactions import SlackInteraction, SlackSubmission
from countersign.contract import DecisionReceipt
from countersign.errors import is_cancellation
from countersign.faults import crash_point
from countersign.security.links import LinkState


async def decide_from_slack(ctx: WorkflowSharedContext, interaction: SlackInteraction) -> DecisionReceipt:
    """A decision made in Slack's modal: Slack's signature is verified again here, the clicking Slack
    user must be the approver of the slot the message was sent to (by their Slack email), then the
    same decision point as the email's link is completed. Every refusal is told to them in Slack."""
    submitted = await ctx.run_typed("verify slack request", slack_interactions.verified, interaction=interaction)
    record = await record_of(ctx) if submitted.approval_id == ctx.key() else None
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
            ctx, record, submitted.round, submitted.slot, check, submitted, edits={}, via="slack", grant=submitted.grant
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
