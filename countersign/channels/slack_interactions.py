"""Slack's interactivity payloads: verified, then read into what a person decided.

Guarantee: nothing is read from a payload unless `slack_sdk`'s `SignatureVerifier` accepts its raw
body's signature under `SLACK_SIGNING_SECRET` with a timestamp within Slack's 5 minutes; the web
tier checks this before it answers, and `Approval.slack_decide` checks it again inside a journaled
step (the ingress is not the authority), so a forged or replayed payload decides nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, Field, ValidationError
from restate import TerminalError
from slack_sdk.signature import SignatureVerifier

from countersign.channels import slack
from countersign.contract import Strict
from countersign.settings import Settings, get_settings

MAX_BODY = 64 * 1024
SIGNATURE_REFUSED = "Slack's request signature or timestamp was not accepted; nothing was decided."


class SlackInteraction(Strict):
    """Input of `Approval.slack_decide`: a modal submission exactly as Slack sent it."""

    body: str = Field(max_length=MAX_BODY)
    timestamp: str = Field(max_length=20)
    signature: str = Field(max_length=200)


class SlackSubmission(BaseModel):
    """A verified modal submission: who clicked (Slack user id) and what they decided, where."""

    user: str
    view_id: str
    approval_id: str
    round: int
    slot: int
    verdict: Literal["approve", "reject"]
    reason: str = Field(default="", max_length=2000)
    confirm: str = Field(default="", max_length=200)
    grant: str = Field(default="", max_length=20)
    """The standing approval's seconds picked in the modal ("" for none)."""
    channel: str = ""
    ts: str = ""
    now: float

    @property
    def client(self) -> str:
        return f"slack:{self.user}"


def verifier(settings: Settings | None = None) -> SignatureVerifier | None:
    secret = (settings or get_settings()).slack_signing_secret
    return SignatureVerifier(secret.get_secret_value()) if secret else None


def authentic(body: str, timestamp: str, signature: str, settings: Settings | None = None) -> bool:
    """Whether Slack signed `body` at `timestamp` (within its 5 minutes); the one check of both the
    web route and `Approval.slack_decide`'s step."""
    check = verifier(settings)
    if check is None:
        return False
    try:
        return check.is_valid(body=body, timestamp=timestamp, signature=signature)
    except (ValueError, OverflowError, TypeError):
        # slack_sdk does `int(timestamp)` (ValueError when missing or not a number, OverflowError when
        # too long for its float arithmetic) and compares the signature as text (TypeError when it is
        # not ASCII). Anyone can send those: they are not authentic, and in the workflow's step an
        # exception other than a refusal would be retried until the invocation pauses.
        return False


class NotOurs(ValueError):
    """A well-formed interaction that is not a Countersign decision (another modal of the app)."""


def payload_of(body: str) -> dict[str, Any]:
    """The JSON `payload` field of Slack's form-encoded body; ValueError when there is none."""
    values = parse_qs(body, max_num_fields=10).get("payload")
    if not values:
        raise ValueError("no payload field")
    payload = json.loads(values[0])
    if not isinstance(payload, dict):
        raise ValueError("the payload is not an object")
    return payload


def field_at(payload: dict[str, Any], *path: str) -> Any:
    """The value at `path` in a payload, None where a key is missing; ValueError (naming where) when
    a step of the path is not an object: a signed payload is still anyone's JSON to Slack's shape."""
    value: Any = payload
    for depth, key in enumerate(path):
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"{'.'.join(path[:depth])} is not an object")
        value = value.get(key)
    return value


def _input(payload: dict[str, Any], block: str, action: str) -> str:
    return str(field_at(payload, "view", "state", "values", block, action, "value") or "")


def _picked(payload: dict[str, Any], block: str, action: str) -> str:
    """A select's chosen value ("" when none, or the "no" option)."""
    value = str(field_at(payload, "view", "state", "values", block, action, "selected_option", "value") or "")
    return "" if value == slack.NO_GRANT else value[:20]


def submission(payload: dict[str, Any], now: float) -> SlackSubmission:
    """What a modal submission decided; NotOurs for another modal, ValueError (or pydantic's
    ValidationError) for one that is malformed."""
    if payload.get("type") != "view_submission" or field_at(payload, "view", "callback_id") != slack.MODAL_CALLBACK:
        raise NotOurs("not a Countersign decision")
    state = slack.ModalState.model_validate_json(field_at(payload, "view", "private_metadata") or "{}")
    return SlackSubmission(
        user=str(field_at(payload, "user", "id") or ""),
        view_id=str(field_at(payload, "view", "id") or ""),
        approval_id=state.a,
        round=state.r,
        slot=state.s,
        verdict=state.v,  # type: ignore[arg-type]  # validated by the model
        reason=_input(payload, slack.REASON_BLOCK, slack.REASON_INPUT).strip(),
        confirm=_input(payload, slack.CONFIRM_BLOCK, slack.CONFIRM_INPUT),
        grant=_picked(payload, slack.GRANT_BLOCK, slack.GRANT_INPUT),
        channel=state.ch,
        ts=state.ts,
        now=now,
    )


def verified(interaction: SlackInteraction) -> SlackSubmission:
    """Step body of `Approval.slack_decide`: the signature again, then the submission (401/400)."""
    if not authentic(interaction.body, interaction.timestamp, interaction.signature):
        raise TerminalError(SIGNATURE_REFUSED, 401)
    try:
        return submission(payload_of(interaction.body), time.time())
    except (ValueError, ValidationError) as exc:
        raise TerminalError(f"not a decision this service can read: {type(exc).__name__}", 400) from None


async def user_email(user: str) -> str:
    """Step body: the clicking Slack user's email (lower case; empty if Slack has none)."""
    info = await slack.call("users.info", user=user)
    return str(((info.get("user") or {}).get("profile") or {}).get("email") or "").lower()


async def tell(channel: str, user: str, text: str) -> None:
    """Step body: a message only `user` sees (in the approval message's conversation)."""
    if channel:
        await slack.call("chat.postEphemeral", channel=channel, user=user, text=text)
    else:
        await slack.call("chat.postMessage", channel=user, text=text)
