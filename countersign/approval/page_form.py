"""An approval page's POST, decided in `Approval.submit`: the refusal pages and their words.

Guarantee: the page decides with `decide`'s own checks (`countersign.approval.slots`), in the page's
order: the link, then the form (verdict, reason, edits to review), then the decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from restate import TerminalError, WorkflowSharedContext

from countersign import textdiff as diff
from countersign.approval.run_state import load_header
from countersign.approval.slots import checked_edits, linked, settle_slot, verified
from countersign.approval.standing import checked_seconds
from countersign.approval.verdict import Verdict, slot_promise
from countersign.contract import PageNotice, PageSubmission, Submitted
from countersign.errors import is_cancellation
from countersign.security import links
from countersign.security.links import LinkInvalid


async def submit_form(ctx: WorkflowSharedContext, form: PageSubmission) -> Submitted:
    """An approval page's POST in one invocation: the approval's status, and its decision made with
    `decide`'s own checks (the link re-verified here, the first completion wins), or why it was not
    made (the refusal page to show), or what the page does itself (`Submitted.takeover`). The page
    checked the request's origin, CSRF value and size before calling; the order of the checks here
    is the page's: the link, then the form (verdict, reason, edits to review), then the decision."""
    try:
        links.parse(form.token)
    except LinkInvalid as exc:  # not a link at all (the page never sends one): bad input, a 400
        raise TerminalError(exc.reason, exc.status) from None
    header = await load_header(ctx)
    if header is None:
        # Not saved yet (the email goes out just before), or never: the page waits for the record
        # with reads, as for a GET; nothing is verified, nothing decided.
        return Submitted(takeover="unknown")
    try:
        # The header just read serves the record's lookup too: one state read where there were two.
        claims, record = await linked(ctx, form.token, header)
    except TerminalError as exc:
        return Submitted(refused=_link_refusal(exc))
    if len(record.batch) > 1:
        # The batch page reads its items afresh, checks the link and decides item by item (`decide`).
        return Submitted(record=record, takeover="batch")
    promise = ctx.promise(slot_promise(record.approval_id, claims.round, claims.slot), type_hint=Verdict)
    peeked = promise.peek()  # as in `decide`: asked alongside the link check, read once it passed
    try:
        check = await verified(ctx, form.token, record)
    except TerminalError as exc:
        return Submitted(record=record, refused=_link_refusal(exc))
    verdict: Literal["approve", "reject"]
    match form.verdict:
        case "approve":
            verdict = "approve"
        case "reject":
            verdict = "reject"
        case _:
            return Submitted(record=record, refused=PageNotice(status=400, title="Choose a verdict", text=_PRESS))
    reason = form.reason.strip()
    if verdict == "reject" and not reason:
        why = _WHY_DECLINE if record.kind == "question" else _WHY
        return Submitted(record=record, refused=PageNotice(status=400, title="Reason required", text=why))
    if len(reason) > 2000:
        return Submitted(record=record, refused=PageNotice(status=400, title="Reason too long", text=_SHORTER))
    # Every field the form carries, offered or not: `decide`'s rules refuse one that may not be edited
    # (a 400 that decides nothing), where dropping it would approve what the approver did not ask.
    edits = {k: diff.normalized(v).strip() for k, v in form.edits.items()}
    # A standing approval asked for where none is offered, or out of its bounds (a forged form): a
    # 400 that decides nothing, before any review.
    try:
        checked_seconds(record, verdict, form.grant)
    except TerminalError as exc:
        notice = PageNotice(status=400, title="Not decided", text=f"{exc.message} Nothing was decided.")
        return Submitted(record=record, refused=notice)
    read = {"verdict": verdict, "reason": reason, "edits": edits, "confirm": form.confirm, "grant": form.grant}
    # A long text changed: the approver sees the diff first; only the review's own form, carrying
    # the fingerprint of exactly these edits, decides.
    if (
        verdict == "approve"
        and record.kind != "question"  # an answer is typed, not an edit of what was frozen: nothing to review
        and diff.changes(record.args, edits)
        and form.reviewed != diff.marker(edits)
    ):
        # Only edits that would be accepted are shown for review; others are refused here, by the
        # decision's own check, before a person spends time on a diff of them.
        try:
            checked_edits(record, verdict, edits)
        except TerminalError as exc:
            notice = PageNotice(status=400, title="Not decided", text=f"{exc.message} Nothing was decided.")
            return Submitted(record=record, refused=notice)
        return Submitted.model_validate({"record": record, "takeover": "review", **read})
    decision = _PageDecision(verdict=verdict, reason=reason, confirm=form.confirm, client=form.client)
    # Its refusals (a replaced or expired link, edits or a confirmation that do not fit) are 4xx
    # errors, as `decide`'s are: the page shows them as "Not decided".
    try:
        receipt = await settle_slot(
            ctx,
            record,
            claims.round,
            claims.slot,
            check,
            decision,
            edits=edits,
            via="email",
            peeked=peeked,
            grant=form.grant,
        )
    except TerminalError as exc:
        # A question's answer that does not validate is shown back on its form, with what is wrong.
        if record.kind != "question" or exc.status_code != 400 or is_cancellation(exc):
            raise
        return Submitted(record=record, refused=PageNotice(status=400, title="Not decided", text=exc.message))
    return Submitted.model_validate({"record": record, "receipt": receipt, **read})


_PRESS = "Press Approve or Reject."


_WHY = "Say why you reject, so the agent can act on it. Nothing was decided."
_WHY_DECLINE = "Say why you decline, so the workflow that asked can act on it. Nothing was answered."


_SHORTER = "Keep the reason under 2000 characters. Nothing was decided."


@dataclass(frozen=True)
class _PageDecision:
    """A page's verdict as `settle_slot` takes it (a `SlotDecision`)."""

    verdict: Literal["approve", "reject"]
    reason: str
    confirm: str
    client: str


def _link_refusal(exc: TerminalError) -> PageNotice:
    """The page for a link that does not verify, as a page that checked it itself shows it."""
    if is_cancellation(exc) or exc.status_code >= 500:
        raise exc
    title = "Link expired" if exc.status_code == 410 else "Link not valid"
    return PageNotice(status=exc.status_code, title=title, text=exc.message)
