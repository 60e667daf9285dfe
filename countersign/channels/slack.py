"""Slack through the official `slack_sdk`: the approval message (Block Kit), its modal, and the Web
API calls, each meant to run as the body of a journaled step.

Guarantee: everything the agent or a tool wrote (summary, why, arguments, facts, goal) is put in
`plain_text` or preformatted rich-text elements, never in `mrkdwn`, after `textsafety.visible`, so
it cannot format, mention or link, and hidden characters show where they are; the arguments are
shown exactly (canonical JSON). The message carries no link token: its buttons name the approval,
round and slot only, and a decision is authenticated by Slack's request signature and the clicking
user's email (see `Approval.slack_decide`). A 429 is retried by the step after Slack's
`Retry-After`, a 5xx or a lost connection with the step's backoff (both bounded by
`SLACK_RETRIES`); any other Slack error ends the step at once with its `error` code. No call sleeps
in the process: waiting between attempts is Restate's.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel
from restate import RunOptions, TerminalError
from restate.exceptions import RetryableError
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from countersign.contract import ApprovalRecord
from countersign.security.textsafety import visible
from countersign.settings import Settings, get_settings
from countersign.timewords import duration
from countersign.tools.policy import grant_choices

APPROVE_ACTION = "countersign_approve"
REJECT_ACTION = "countersign_reject"
ANSWER_ACTION = "countersign_answer"
"""A question's "Answer…" button: a link to its page (Slack still reports the click, which is ignored)."""
MODAL_CALLBACK = "countersign_decide"
REASON_BLOCK, REASON_INPUT = "reason", "reason_input"
CONFIRM_BLOCK, CONFIRM_INPUT = "confirm", "confirm_input"
GRANT_BLOCK, GRANT_INPUT, NO_GRANT = "grant", "grant_input", "none"
MAX_GRANT_WORDS = 600
METADATA_EVENT = "countersign_approval"
REFUSED_STATUS = 422
MAX_TEXT = 2900  # Slack refuses a text object over 3000 characters
MAX_FACTS = 10  # a section holds at most 10 fields

# 5xx and lost connections back off 1 s doubling to 30 s; a 429 waits Slack's Retry-After. Ten
# minutes in all: Slack is a second channel, so its outage must end, not hold the approval's queue.
SLACK_RETRIES = RunOptions[Any](
    max_attempts=10,
    initial_retry_interval=timedelta(seconds=1),
    retry_interval_factor=2.0,
    max_retry_interval=timedelta(seconds=30),
    max_duration=timedelta(minutes=10),
)


class Posted(BaseModel):
    """One approval message in Slack, as posted (what `chat.update` needs to rewrite it)."""

    key: str
    round: int
    slot: int
    approver: str
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    closed: bool = False


class ButtonValue(BaseModel):
    """What a button carries: which decision point, nothing secret."""

    a: str
    r: int
    s: int
    c: str | None = None
    """High stakes: the label of what to type, and (`cv`) the value shown to type."""
    cv: str | None = None
    g: int | None = None
    """A standing approval may be given with the approval: its longest duration, and (`gw`) its scope in words."""
    gw: str | None = None
    q: bool | None = None
    """A question's Decline… button: its modal declines to answer rather than rejects an action."""


class ModalState(BaseModel):
    """The modal's `private_metadata`: the button's value, the verdict, and where the message is."""

    a: str
    r: int
    s: int
    v: str
    ch: str = ""
    ts: str = ""
    c: str | None = None
    g: int | None = None
    q: bool | None = None


def client(settings: Settings | None = None) -> WebClient:
    settings = settings or get_settings()
    token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
    if not token:
        raise TerminalError("SLACK_BOT_TOKEN is not set", REFUSED_STATUS)
    return WebClient(token=token, base_url=settings.slack_api_base, timeout=int(settings.slack_timeout_seconds))


def _header(headers: Any, name: str) -> str | None:
    for key, value in dict(headers or {}).items():
        if key.lower() == name:
            return str(value[0] if isinstance(value, list) else value)
    return None


async def call(method: str, **params: Any) -> dict[str, Any]:
    """One Web API call (in a thread: the SDK is synchronous), its errors mapped for the step."""
    web = client()
    try:
        response = await asyncio.to_thread(web.api_call, method, json=params)
    except SlackApiError as exc:
        status = exc.response.status_code
        error = str(exc.response.get("error", "") or status)
        if status == 429:
            after = _header(exc.response.headers, "retry-after") or "1"
            seconds = float(after) if after.replace(".", "", 1).isdigit() else 1.0
            raise RetryableError(f"slack {method}: rate limited", 429, retry_after=timedelta(seconds=seconds)) from None
        if status >= 500:
            raise RuntimeError(f"slack {method}: HTTP {status} {error}") from None
        raise TerminalError(f"slack {method}: {error}", REFUSED_STATUS) from None
    except (OSError, TimeoutError) as exc:  # connection refused/reset, timeouts: retried by the step
        raise RuntimeError(f"slack {method}: {type(exc).__name__}") from None
    except ValueError as exc:  # a body that is not JSON (a proxy's 502 page)
        raise RuntimeError(f"slack {method}: unreadable answer ({type(exc).__name__})") from None
    return dict(response.data) if isinstance(response.data, dict) else {}


def _plain(text: str, limit: int = MAX_TEXT) -> dict[str, Any]:
    shown = visible(text) or " "
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return {"type": "plain_text", "text": shown, "emoji": False}


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def request_blocks(
    record: ApprovalRecord,
    slot: int,
    goal: str,
    kind: str,
    confirm: tuple[str | None, str | None],
    answer_url: str | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """The message text (for notifications) and its blocks; a question's (`answer_url`: its page, for this slot)."""
    if record.kind == "question":
        return _question_blocks(record, slot, goal, kind, answer_url or "")
    title = {"reminder": "Reminder: approval needed", "escalation": "Escalated to you: approval needed"}.get(
        kind, "Approval needed"
    )
    text = visible(f"{title}: {record.summary}")[:MAX_TEXT]
    args = json.dumps(record.args, indent=2, sort_keys=True, ensure_ascii=False)
    if len(args) > MAX_TEXT:
        args = args[: MAX_TEXT - 60] + "\n… (cut here: the email shows every argument)"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": _plain(f"{title}: {record.summary}", 150)},
        {"type": "section", "text": _plain(f"Action: {record.tool}\nWhy: {record.why or '(not given)'}")},
        {
            "type": "rich_text",
            "elements": [{"type": "rich_text_preformatted", "elements": [{"type": "text", "text": visible(args)}]}],
        },
    ]
    facts = [_plain(f"{f.label}: {f.value}", 1900) for f in record.context[:MAX_FACTS]]
    if facts:
        blocks.append({"type": "section", "text": _plain("What the tool read for you:"), "fields": facts})
    elif record.context_error:
        blocks.append(
            {"type": "section", "text": _plain(f"The tool's facts could not be read: {record.context_error}")}
        )
    if goal:
        blocks.append({"type": "section", "text": _plain(f"The {record.asker}'s goal: {goal}")})
    blocks.append(
        {
            "type": "context",
            "elements": [
                _plain(
                    f"Deadline {_when(record.deadline)} · asked of {record.approvers[slot]} · "
                    f"policy: {record.policy} · fingerprint {record.digest[:12]}"
                )
            ],
        }
    )
    offer = record.grant_offer
    value = ButtonValue(
        a=record.approval_id,
        r=record.round,
        s=slot,
        c=confirm[0],
        cv=confirm[1],
        g=offer.max_seconds if offer else None,
        gw=offer.words[:MAX_GRANT_WORDS] if offer else None,
    )
    blocks.append(
        {
            "type": "actions",
            "block_id": "decide",
            "elements": [
                {
                    "type": "button",
                    "action_id": APPROVE_ACTION,
                    "style": "primary",
                    "text": _plain("Approve…"),
                    "value": value.model_dump_json(exclude_none=True),
                },
                {
                    "type": "button",
                    "action_id": REJECT_ACTION,
                    "style": "danger",
                    "text": _plain("Reject…"),
                    "value": value.model_dump_json(exclude_none=True),
                },
            ],
        }
    )
    return text, blocks


def _question_blocks(
    record: ApprovalRecord, slot: int, goal: str, kind: str, answer_url: str
) -> tuple[str, list[dict[str, Any]]]:
    """A question: its text, what the form asks, and two buttons: "Answer…" opens the question's
    page (the form is answered and checked there, as from the email) and "Decline…" the reason modal."""
    title = {"reminder": "Reminder: a question for you", "escalation": "Escalated to you: a question"}.get(
        kind, "A question for you"
    )
    question = str(record.args.get("question", ""))
    text = visible(f"{title}: {question}")[:MAX_TEXT]
    asks = [_field_words(f) for f in record.args.get("fields", []) if isinstance(f, dict)]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": _plain(title, 150)},
        {"type": "section", "text": _plain(question)},
        {"type": "section", "text": _plain("To answer: " + "; ".join(asks))},
    ]
    if record.why:  # as the email shows it: what the asker said it needs the answer for
        blocks.insert(2, {"type": "section", "text": _plain(f"Why: {record.why}")})
    if goal:
        blocks.append({"type": "section", "text": _plain(f"The {record.asker}'s goal: {goal}")})
    asked = f"Deadline {_when(record.deadline)} · asked of {record.approvers[slot]} · policy: {record.policy}"
    blocks.append({"type": "context", "elements": [_plain(asked)]})
    value = ButtonValue(a=record.approval_id, r=record.round, s=slot, q=True).model_dump_json(exclude_none=True)
    blocks.append(
        {
            "type": "actions",
            "block_id": "decide",
            "elements": [
                {
                    "type": "button",
                    "action_id": ANSWER_ACTION,
                    "style": "primary",
                    "text": _plain("Answer…"),
                    "url": answer_url,
                },
                {"type": "button", "action_id": REJECT_ACTION, "text": _plain("Decline…"), "value": value},
            ],
        }
    )
    return text, blocks


def _field_words(field: dict[str, Any]) -> str:
    """One field of a question's frozen form, in words: its label and what it takes."""
    label = str(field.get("label") or field.get("name") or "answer")
    choices = [str(c) for c in field.get("choices") or []]
    match field.get("kind"):
        case "choice":
            return f"{label} (one of: {', '.join(choices)})"
        case "list":
            return f"{label} (a list" + (f" from: {', '.join(choices)})" if choices else ")")
        case "boolean":
            return f"{label} (yes or no)"
        case "integer" | "number":
            return f"{label} (a number)"
        case _:
            return f"{label} (text)"


def with_note(message: Posted, line: str, *, keep_buttons: bool) -> list[dict[str, Any]]:
    """The message's blocks with `line` as its status (and without buttons once it decides nothing)."""
    blocks = [b for b in message.blocks if keep_buttons or b.get("type") != "actions"]
    blocks = [b for b in blocks if b.get("block_id") != "status"]
    status = {"type": "section", "block_id": "status", "text": _plain(line)}
    if keep_buttons:
        blocks.insert(len(blocks) - 1, status)
    else:
        blocks.append(status)
    return blocks


def modal(state: ModalState, summary: str, confirm_value: str | None, grant_words: str | None = None) -> dict[str, Any]:
    """The confirmation step inside Slack: the reason field, when high stakes the typed value, and when
    the policy offers one a standing approval (its scope in words, and how long: "no" by default)."""
    approving = state.v == "approve"
    verb = "Approve" if approving else "Decline" if state.q else "Reject"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": _plain(f"{verb}: {summary}")},
        {
            "type": "input",
            "block_id": REASON_BLOCK,
            "optional": approving,
            "label": _plain("Reason" + ("" if approving else " (required)")),
            "element": {"type": "plain_text_input", "action_id": REASON_INPUT, "multiline": True, "max_length": 2000},
        },
    ]
    if approving and state.c:
        blocks.append(
            {
                "type": "input",
                "block_id": CONFIRM_BLOCK,
                "label": _plain(f"High stakes: type the {state.c} ({confirm_value}) to confirm", 2000),
                "element": {"type": "plain_text_input", "action_id": CONFIRM_INPUT, "max_length": 200},
            }
        )
    if approving and state.g:
        none = {"text": _plain("No: ask me each time", 75), "value": NO_GRANT}
        choices = [{"text": _plain(duration(d), 75), "value": str(d)} for d in grant_choices(state.g)]
        blocks.append(
            {
                "type": "input",
                "block_id": GRANT_BLOCK,
                "optional": True,
                "label": _plain("Also let calls like this one run without asking you?", 2000),
                **({"hint": _plain(grant_words, 2000)} if grant_words else {}),
                "element": {
                    "type": "static_select",
                    "action_id": GRANT_INPUT,
                    "initial_option": none,
                    "options": [none, *choices],
                },
            }
        )
    return {
        "type": "modal",
        "callback_id": MODAL_CALLBACK,
        "private_metadata": state.model_dump_json(exclude_none=True),
        "title": _plain(verb, 24),
        "submit": _plain(verb, 24),
        "close": _plain("Cancel", 24),
        "blocks": blocks,
    }


def final_line(
    state: str,
    by: str | None,
    via: str | None,
    at: float | None,
    reason: str | None,
    *,
    question: bool = False,
    source: str = "human",
) -> str:
    """The status a decided (or otherwise closed) approval's messages show: who, how, when. A question
    is answered or declined, and nothing was to run. `source` is the decision's (DecisionSource): an
    approval the deadline let through was approved by nobody."""
    when = f" at {_when(at)}" if at is not None else ""
    how = {"slack": " (decided in Slack)", "email": " (decided by email)"}.get(via or "", "")
    because = f" Reason: {reason}" if reason else ""
    by_deadline = source == "deadline_default" and state in ("approved", "approved_with_edits")
    if question:
        match state:
            case _ if by_deadline:
                return f"Nobody answered before the deadline{when}: the default answer stands."
            case "approved" | "approved_with_edits":
                return f"Answered by {by or 'the approver'}{how}{when}."
            case "rejected":
                return f"Declined by {by or 'the approver'}{how}{when}.{because}"
            case "expired":
                return f"Expired: nobody answered before the deadline{when}."
            case "cancelled":
                return f"Cancelled{when}: it takes no answer now.{because}"
    if by_deadline:
        return f"Nobody decided before the deadline{when}: the policy let it run."
    match state:
        case "approved" | "approved_with_edits":
            edited = " with edits" if state == "approved_with_edits" else ""
            return f"Approved{edited} by {by or 'the approvers'}{how}{when}."
        case "rejected":
            return f"Rejected by {by or 'an approver'}{how}{when}. Nothing ran.{because}"
        case "expired":
            return f"Expired: nobody decided before the deadline{when}. Nothing ran."
        case "cancelled":
            return f"Cancelled{when}: nothing ran.{because}"
        case _:
            return f"No longer waiting ({state.replace('_', ' ')}){when}.{because}"
