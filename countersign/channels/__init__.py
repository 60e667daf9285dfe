"""Channels: the ways an approval request reaches its approvers (email, Slack).

Guarantee: which channels carry a request is the policy's choice (`ToolPolicy.channels`, per tool,
or `approver_channels`, per approver; `("email",)` by default, so nothing changes for a policy that
names none). Every delivery is its own journaled step under its own idempotency key and leaves an
audit entry; whatever channel a person decides through completes the same decision promise of their
slot (`Approval.decide` or `Approval.slack_decide`), so the first decision wins on every channel.
"""

from __future__ import annotations

from countersign.channels.base import Channel, ChannelRequest
from countersign.settings import Settings
from countersign.tools.policy import ChannelName, ToolPolicy

__all__ = ["Channel", "ChannelName", "ChannelRequest", "channels_of", "missing_slack_setting", "uses_slack"]


def channels_of(policy: ToolPolicy, approver: str) -> tuple[ChannelName, ...]:
    """The channels that carry `approver`'s request under `policy`, in the order they are sent."""
    return policy.channels_for(approver)


def uses_slack(policy: ToolPolicy) -> bool:
    return policy.uses_channel("slack")


def missing_slack_setting(settings: Settings) -> str | None:
    """The first setting Slack needs that is not set (the bot token to post, the signing secret to
    take clicks); None when both are."""
    for setting, value in (
        ("SLACK_BOT_TOKEN", settings.slack_bot_token),
        ("SLACK_SIGNING_SECRET", settings.slack_signing_secret),
    ):
        if value is None or not value.get_secret_value():
            return setting
    return None
