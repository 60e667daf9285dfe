"""What the approval pages say: the deadline in plain words, each state's headline, and what happens next.

Guarantee: pure functions of the record, the run's history and a given clock; they choose words and
never decide anything. Every sentence about an action's fate is true for the state it describes
(nothing claims an action ran unless the run's history says it did).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from countersign.contract import ActionRecord, ApprovalRecord, Outcome
from countersign.timewords import duration

ABSOLUTE_FORMAT = "%Y-%m-%d %H:%M UTC"  # the same format the approval email uses


@dataclass(frozen=True)
class Moment:
    """A point in time as the pages show it: `2026-11-02 14:03 UTC`, plus ISO 8601 for `<time>`."""

    text: str
    iso: str


@dataclass(frozen=True)
class Deadline:
    relative: str
    absolute: Moment
    passed: bool


@dataclass(frozen=True)
class StateView:
    """A decided (or otherwise closed) approval: a title, one headline sentence, what it means now."""

    title: str
    headline: str
    consequence: str
    reason: str | None = None


def moment(timestamp: float) -> Moment:
    at = datetime.fromtimestamp(timestamp, UTC)
    return Moment(text=at.strftime(ABSOLUTE_FORMAT), iso=at.strftime("%Y-%m-%dT%H:%M:%SZ"))


def deadline(deadline_at: float, now: float) -> Deadline:
    left = deadline_at - now
    relative = f"in {duration(left)}" if left > 0 else "passed"
    return Deadline(relative=relative, absolute=moment(deadline_at), passed=left <= 0)


def action_of(history: list[ActionRecord], record: ApprovalRecord) -> ActionRecord | None:
    for action in history:
        if action.approval_id == record.approval_id:
            return action
    return None


def _result_text(result: dict[str, Any] | None) -> str:
    if not result:
        return ""
    return ", ".join(f"{name} {value}" for name, value in sorted(result.items()))


def _after_approval(action: ActionRecord | None, who_asked: str) -> str:
    if action is None:
        return f"The {who_asked} runs it once, with exactly the arguments that were approved."
    if action.outcome in (Outcome.APPROVED, Outcome.APPROVED_WITH_EDITS):
        done = _result_text(action.result)
        return "It has run, once." + (f" Result: {done}." if done else "")
    error = (action.result or {}).get("error") or action.reason or "no reason given"
    return f"It was approved but did not complete: {error}."


_REASON_SHOWN = ("approved", "approved_with_edits", "rejected", "cancelled", "superseded", "failed")


def closed_state(
    state: str,
    by: str | None,
    at: float | None,
    reason: str | None,
    action: ActionRecord | None,
    via: str | None = None,
    who_asked: str = "agent",
) -> StateView:
    """Words for an approval that no longer waits: who closed it and when (and, when it was decided
    in Slack, that it was), and what that means now. `who_asked` is the record's `asker`."""
    view = _closed_words(state, by, at, action, who_asked)
    if via == "slack" and by and state in ("approved", "approved_with_edits", "rejected"):
        when = f" at {moment(at).text}" if at is not None else ""
        verb = view.headline.removeprefix("This action was ").split(" by ", 1)[0]
        view = StateView(view.title, f"This action was {verb}{when}: decided in Slack by {by}.", view.consequence)
    if state in _REASON_SHOWN and reason:
        return StateView(view.title, view.headline, view.consequence, reason)
    return view


def question_closed(state: str, by: str | None, at: float | None, reason: str | None, source: str | None) -> StateView:
    """Words for a question that no longer waits for an answer (`source`: the record's decision source)."""
    when = f" at {moment(at).text}" if at is not None else ""
    who = f" by {by}" if by else ""
    if state in ("approved", "approved_with_edits") and source == "deadline_default":
        return StateView(
            "Answered by default",
            f"Nobody answered by the deadline{when}; the default answer stands.",
            "The workflow that asked carries on with its default answer.",
        )
    match state:
        case "approved" | "approved_with_edits":
            view = StateView("Already answered", f"This question was answered{who}{when}.", "Its answer was sent.")
        case "rejected":
            view = StateView("Declined", f"This question was declined{who}{when}.", "The reason was sent instead.")
        case "expired":
            view = StateView(
                "Expired", f"Nobody answered this question by its deadline{when}.", "It expired unanswered."
            )
        case _:
            view = StateView(f"Closed ({state})", f"This question was {state}{who}{when}.", "It takes no answer now.")
    return StateView(view.title, view.headline, view.consequence, reason if state != "expired" else None)


def _closed_words(
    state: str, by: str | None, at: float | None, action: ActionRecord | None, who_asked: str
) -> StateView:
    when = f" at {moment(at).text}" if at is not None else ""
    who = f" by {by}" if by else ""
    match state:
        case "approved" | "approved_with_edits":
            edited = " with edits" if state == "approved_with_edits" else ""
            return StateView(
                "Already approved", f"This action was approved{edited}{who}{when}.", _after_approval(action, who_asked)
            )
        case "rejected":
            return StateView(
                "Already rejected",
                f"This action was rejected{who}{when}.",
                f"It did not run. The {who_asked} was told the reason and may propose something else; "
                "anything else that needs approval comes in a new email.",
            )
        case "expired":
            deadline_text = f", {moment(at).text}," if at is not None else ""
            return StateView(
                "Expired",
                f"Nobody decided before the deadline{deadline_text} so this action expired.",
                "It did not run and cannot be approved any more.",
            )
        case "cancelled":
            return StateView(
                "Cancelled",
                f"The run was cancelled{who}{when} while this action waited for a decision.",
                "It did not run, and nothing further will run in this run.",
            )
        case "superseded":
            return StateView(
                "Superseded",
                f"Something this action depends on changed while it waited{when}, so it was superseded.",
                f"It did not run. The {who_asked} was told what changed.",
            )
        case "failed":
            return StateView(
                "Approved but not run",
                f"This action was approved{who}{when}, but it could not run as approved.",
                f"Nothing was changed by it. The {who_asked} was told why.",
            )
        case "escalated":
            return StateView(
                "Handed on",
                f"This decision was handed to another approver{when} because it was not decided in time.",
                "Your link no longer decides it; the new approver has their own email.",
            )
        case "undeliverable":
            return StateView(
                "Not delivered",
                f"No approval email could be delivered{when}, so this request was closed.",
                f"The action did not run. The {who_asked} was told no approver could be reached.",
            )
        case _:
            return StateView(
                "No longer waiting",
                f"This action is {state.replace('_', ' ')}{who}{when}.",
                "It can no longer be decided.",
            )


UNCONFIRMED_HINT = (
    "Your decision may or may not have been recorded. Open the link from the email again: "
    "the page shows whether this action is still waiting, and if it is, you can decide again safely."
)


def notice_hint(status: int, message: str) -> str:
    """The line under a refusal or error: that nothing was decided, and what the person can do."""
    if status >= 500:
        return ""
    nothing = "" if "Nothing was decided" in message else "Nothing was decided. "
    if status == 410:
        return nothing + "Use the most recent approval email, or ask the person who requested the action."
    return nothing + (
        "Open the link from the approval email again, exactly as it was sent; "
        "if this keeps happening, ask the person who requested the action."
    )


def next_steps(state: str, tool: str, fingerprint: str, *, quorum: int = 1, who_asked: str = "agent") -> str:
    """After the person's own decision was recorded: what happens now (`who_asked`: the record's `asker`)."""
    if not state.startswith("approved"):
        return (
            f"The action will not run. The {who_asked} is told your reason and may propose something else; "
            "anything else that needs approval comes in a new email."
        )
    if quorum > 1:
        return (
            f"Your approval is recorded. It runs only once {quorum} approvers have approved; "
            "one rejection stops it. You don't need to do anything else."
        )
    edited = state == "approved_with_edits"
    what = "your edited arguments" if edited else f"exactly the arguments you saw (fingerprint {fingerprint})"
    return (
        f"The {who_asked} now runs {tool} with {what}, once. "
        "If something it depends on changed while it waited, it does not run as approved; "
        "opening this link again shows what happened. You don't need to do anything else."
    )
