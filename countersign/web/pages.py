"""The approval pages: `GET`/`HEAD /approvals/{token}` show, only `POST` decides.

Guarantee: GET and HEAD never change decision state, whoever sends them; a POST decides only with a
valid link, a CSRF value bound to that link, a same-origin request and an explicit verdict. The page
checks the origin, the CSRF value and the form before any call, then hands a single approval's POST to
`Approval.submit` (which verifies the link itself and decides with `decide`'s rules), one invocation.
A link whose approval has no record yet waits for it (bounded) only if it carries our keys' seal; any
other is refused at once as not valid, so a forged link cannot hold a request open.
Every failure is a 4xx/503 page that says what happened; no stack trace, no token, ever reaches a response or a log.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import FormData
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from countersign import textdiff as diff
from countersign.approval import confirm
from countersign.approval.plan import step_text
from countersign.approval.question import fields_of
from countersign.contract import (
    ActionRecord,
    ApprovalRecord,
    DecisionReceipt,
    PageSubmission,
    Plan,
    RunStatus,
    Submitted,
)
from countersign.security import links
from countersign.security.links import LinkInvalid
from countersign.settings import Settings
from countersign.web import batch, wording
from countersign.web.runs_client import RunCallFailed, RunsClient
from countersign.web.views import Failure, notice, page

log = logging.getLogger("countersign.pages")


_MAX_FORM_FIELDS = 60
_MAX_FORM_BYTES = 64 * 1024
# How long a page waits for an approval whose email is out but whose workflow has not saved it yet
# (milliseconds, normally); then it answers 503 "still being set up". Only a sealed link waits.
_SETUP_WAIT_SECONDS = 3.0

StatusCall = Callable[[str], Awaitable[RunStatus]]
"""Reads one approval's status by id: `RunsClient.status`, or `RunsClient.viewed` for a page's GET
(which answers the same and records the view; before the record is saved it records nothing)."""


class ApprovalPages:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.origin = "{0.scheme}://{0.netloc}".format(urlsplit(settings.approvals_public_url))

    def routes(self) -> list[Route]:
        return [Route("/approvals/{token}", self.dispatch, methods=["GET", "HEAD", "POST"])]

    async def dispatch(self, request: Request) -> Response:
        token = request.path_params["token"]
        runs: RunsClient = request.app.state.runs
        if request.method == "POST":
            return await self._submit(request, runs, token)
        # A GET reads the approval and records its view in one `Approval` invocation; HEAD only
        # reads (a HEAD is no view).
        main: StatusCall = runs.status
        if request.method == "GET":
            main = functools.partial(runs.viewed, token=token, client=request.headers.get("user-agent", ""))
        checked = await self._checked(runs, main, token)
        if isinstance(checked, Response):
            return checked
        status, record, claims, link_state = checked

        approver = record.approvers[claims.slot]
        if (stale := stale_for_read(record, claims.slot, link_state)) is not None:
            return shown(stale)
        if len(record.batch) > 1:
            return batch.render(self.settings, token, status, record, approver, claims.round)
        if record.state != "pending":
            return self._decided(200, record, action=wording.action_of(status.history, record))
        if batch.voted(record, claims.slot):
            return notice(
                200, "Already recorded", "Your decision is recorded; the other approvers have not all decided."
            )
        if record.kind == "question":
            return self._question(200, token, record, claims.slot, goal=status.goal or "")
        if record.kind == "plan":
            return page(
                "plan.html",
                record=record,
                plan=Plan.model_validate(record.args),
                step_text=step_text,
                approver=record.approvers[claims.slot],
                goal=status.goal or "",
                intent=request.query_params.get("intent", ""),
                csrf=links.csrf_token(token, self.settings.approvals_signing_keys, self.settings.signing_kid),
                deadline=wording.deadline(record.deadline, time.time()),
                requested=wording.moment(record.requested_at),
                fingerprint=record.digest[:12],
            )
        return page(
            "confirm.html",
            record=record,
            approver=record.approvers[claims.slot],
            goal=status.goal or "",
            intent=request.query_params.get("intent", ""),
            csrf=links.csrf_token(token, self.settings.approvals_signing_keys, self.settings.signing_kid),
            confirm_label=confirm.label(record),
            confirm_value=confirm.expected(record),
            deadline=wording.deadline(record.deadline, time.time()),
            requested=wording.moment(record.requested_at),
            fingerprint=record.digest[:12],
        )

    def _question(
        self,
        status: int,
        token: str,
        record: ApprovalRecord,
        slot: int,
        *,
        goal: str = "",
        values: dict[str, str] | None = None,
        problem: str | None = None,
        reason: str = "",
    ) -> Response:
        """A question's form (`values`: what was sent, shown back with `problem` when it did not validate)."""
        return page(
            "question.html",
            status,
            record=record,
            question=record.args.get("question", ""),
            fields=fields_of(record.args),
            default=record.args.get("default"),
            values=values or {},
            problem=problem,
            reason=reason,
            approver=record.approvers[slot],
            goal=goal,
            csrf=links.csrf_token(token, self.settings.approvals_signing_keys, self.settings.signing_kid),
            deadline=wording.deadline(record.deadline, time.time()),
            requested=wording.moment(record.requested_at),
            fingerprint=record.digest[:12],
        )

    async def _submit(self, request: Request, runs: RunsClient, token: str) -> Response:
        """A POST: the link's form, once, and its decision. A single approval's POST is one
        `Approval.submit` invocation whether it decides or refuses; a batch (or an approval whose
        record is not saved yet) takes the reads it needs, and each item is decided by `decide`."""
        try:
            claims = links.parse(token)
        except LinkInvalid as exc:
            return _link_notice(exc)
        form = await self.check_post(request, token)  # before any call: a refused form costs none
        if isinstance(form, Response):
            return form
        client = request.headers.get("user-agent", "")[:300]
        submission = PageSubmission(
            token=token,
            verdict=str(form.get("verdict", ""))[:20],
            reason=str(form.get("reason", "")),
            # Later values of a repeated field win, as a dict of the form's fields always did.
            edits={k.removeprefix("edit."): str(v) for k, v in form.multi_items() if k.startswith("edit.")},
            confirm=str(form.get("confirm", ""))[:200],
            client=client,
            reviewed=str(form.get("reviewed", ""))[:100],
            grant=str(form.get("grant", ""))[:20],
        )
        submitted = await submit_once(self.settings, runs, token, claims, submission)
        if isinstance(submitted, Failure):
            return shown(submitted)
        record = submitted.record
        refused = submitted.refused
        if refused is not None and refused.status == 400 and record is not None and record.kind == "question":
            # The form again, with the answer as sent and what is wrong with it.
            return self._question(
                400, token, record, claims.slot, values=submission.edits, problem=refused.text, reason=submission.reason
            )
        if submitted.refused is not None:
            return notice(submitted.refused.status, submitted.refused.title, submitted.refused.text)
        if submitted.takeover == "batch":
            return await self._batch_post(runs, token, form, client)
        if submitted.takeover == "review" and record is not None:
            return page(
                "review.html",
                record=record,
                changes=diff.changes(record.args, submitted.edits),
                edits=submitted.edits,
                csrf=str(form.get("csrf", "")),
                marker=diff.marker(submitted.edits),
                confirm=submitted.confirm,
                reason=submitted.reason,
                grant=submitted.grant,
                back=f"{self.settings.approvals_public_url}/approvals/{token}",
            )
        receipt = submitted.receipt
        if record is None or receipt is None:  # not an answer `submit` gives: decide nothing, say so
            log.error("Approval.submit answered without a record or a receipt")
            return notice(503, "Not confirmed", "The approval service gave no answer.", hint=wording.UNCONFIRMED_HINT)
        if not receipt.accepted:
            return self._decided(409, record, receipt, attempted=submitted.verdict)
        if record.kind == "question":
            when = wording.moment(receipt.decided_at) if receipt.decided_at is not None else None
            return page("answered.html", 200, record=record, receipt=receipt, when=when, answer=receipt.edits or {})
        return page(
            "decided.html",
            200,
            record=record,
            receipt=receipt,
            approved=receipt.state.startswith("approved"),
            when=wording.moment(receipt.decided_at) if receipt.decided_at is not None else None,
            edits=receipt.edits or {},
            next_steps=wording.next_steps(
                receipt.state, record.tool, record.digest[:12], quorum=receipt.quorum, who_asked=record.asker
            ),
        )

    async def _batch_post(self, runs: RunsClient, token: str, form: FormData, client: str) -> Response:
        """A batch page's POST (see `decide_batch`), its answer as a page."""
        decided = await decide_batch(self.settings, runs, token, batch.choices_of(form), client)
        return shown(decided) if isinstance(decided, Failure) else batch.done_page(decided)

    async def _checked(
        self, runs: RunsClient, main: StatusCall, token: str
    ) -> tuple[RunStatus, ApprovalRecord, links.LinkClaims, links.LinkState] | Response:
        """As `checked_link`, its failure as a page."""
        checked = await checked_link(self.settings, runs, main, token)
        return shown(checked) if isinstance(checked, Failure) else checked

    async def check_post(self, request: Request, token: str) -> FormData | Response:
        """The form of a same-origin POST carrying this link's CSRF value, or the refusal page."""
        if not self._same_origin(request):
            return notice(403, "Request refused", "This form must be sent from the approval page itself.")
        form = await self._form(request)
        if form is None:
            return notice(400, "Request refused", "The form could not be read. Open the link again and retry.")
        if not links.csrf_ok(token, str(form.get("csrf", "")), self.settings.approvals_signing_keys):
            return notice(403, "Request refused", "This form has expired. Open the link again and retry.")
        return form

    @staticmethod
    async def _load(
        runs: RunsClient, main: StatusCall, claims: links.LinkClaims, sealed: bool
    ) -> tuple[RunStatus, ApprovalRecord] | None:
        """The approval the link points to, from its own workflow (read with `main`); for a batch,
        with the other items of the batch beside it (each in its own workflow, read with `status`).
        `sealed`: whether the link may wait for a record not saved yet (see `_approval_status`)."""
        wanted = links.approval_id(claims.run_id, claims.index)
        status = await _approval_status(main, wanted, claims.exp, sealed)
        record = next((r for r in status.approvals if r.approval_id == wanted), None)
        if record is None:
            return None
        return await _with_batch(runs, status, record, claims, sealed), record

    def _decided(
        self,
        status: int,
        record: ApprovalRecord,
        receipt: DecisionReceipt | None = None,
        *,
        action: ActionRecord | None = None,
        attempted: str | None = None,
    ) -> Response:
        if receipt is not None and record.decision_source == "deadline_default":
            receipt = None  # the deadline's default decided it: the record says so, not the closed slot
        state = receipt.state if receipt else record.state
        by = receipt.decided_by if receipt else record.decided_by
        at = receipt.decided_at if receipt else record.decided_at
        reason = receipt.reason if receipt else record.reason
        via = receipt.decided_via if receipt else record.decided_via
        if record.kind == "question":
            closed = wording.question_closed(state, by, at, reason, record.decision_source)
        else:
            closed = wording.closed_state(state, by, at, reason, action, via, record.asker)
        return page("already.html", status, record=record, state=state, closed=closed, attempted=attempted)

    def _same_origin(self, request: Request) -> bool:
        return same_origin(request, self.origin)

    @staticmethod
    async def _form(request: Request) -> FormData | None:
        body = await read_body(request, "application/x-www-form-urlencoded")
        if body is None:
            return None
        try:
            fields = parse_qsl(body.decode(), keep_blank_values=True, errors="strict", max_num_fields=_MAX_FORM_FIELDS)
        except ValueError:  # invalid UTF-8 (raw or percent-encoded), or too many fields
            return None
        return FormData([(name, value) for name, value in fields])


def same_origin(request: Request, origin: str) -> bool:
    """Whether a browser sent this request from a page of `origin` (see DESIGN: with a same-origin
    referrer policy Chromium may send `Origin: null` on a form POST, with `Sec-Fetch-Site: same-origin`)."""
    sent = request.headers.get("origin")
    fetch_site = request.headers.get("sec-fetch-site")
    if sent == origin:
        return fetch_site in (None, "same-origin")
    return sent == "null" and fetch_site == "same-origin"


async def read_body(request: Request, content_type: str) -> bytes | None:
    """A POST's body, if it is of `content_type` and at most 64 KiB (None otherwise, and when the
    client went away before it arrived)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != content_type:
        return None
    length = request.headers.get("content-length", "0")
    if not length.isdigit() or int(length) > _MAX_FORM_BYTES:
        return None
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM_BYTES:  # a body sent without its length (chunked) stops here too
                return None
    except ClientDisconnect:
        # A closed tab or a dropped connection, not our failure: nobody reads the answer, and left
        # to the app's error handler this would be an ERROR with two tracebacks.
        log.info("a client disconnected before its form arrived; nothing was decided")
        return None
    return body


async def submit_once(
    settings: Settings, runs: RunsClient, token: str, claims: links.LinkClaims, submission: PageSubmission
) -> Submitted | Failure:
    """A POST's submission (from the page's form or the API's JSON, after the checks each makes of
    its request), decided in one `Approval.submit` call by `decide`'s rules; an approval whose record
    is not saved yet is waited for (bounded) and submitted again. The same submission sent twice (a
    double click, a retried request) is one decision, and both are told it was theirs."""
    key = links.token_fingerprint(f"{token}|{submission.model_dump_json(exclude={'client'})}")
    wanted = links.approval_id(claims.run_id, claims.index)
    try:
        submitted = await runs.submit(wanted, submission, key)
    except RunCallFailed as exc:
        return _not_decided(exc)
    if submitted.takeover != "unknown":
        return submitted
    # Not saved yet: wait for the record with reads, as a GET does (503 or 410 if it does not come;
    # 403 at once if our keys did not seal the link), then submit again; under a key of its own,
    # since Restate keeps the first answer for the first key.
    sealed = links.sealed(token, settings.approvals_signing_keys)
    try:
        _may_wait_for_record(sealed, claims.exp)  # refused before any read, as a GET is after one
        await _approval_status(runs.status, wanted, claims.exp, sealed)
    except LinkInvalid as exc:
        return link_failure(exc)
    except RunCallFailed as exc:
        return Failure(exc.status, "Try again", exc.message)
    try:
        submitted = await runs.submit(wanted, submission, links.token_fingerprint(f"{key}|saved"))
    except RunCallFailed as exc:
        return _not_decided(exc)
    if submitted.takeover == "unknown":  # read by `status`, yet not by `submit`: nothing decided
        return Failure(503, "Try again", "This approval is still being set up. Please try again in a minute.")
    return submitted


async def decide_batch(
    settings: Settings, runs: RunsClient, token: str, choices: batch.Choices, client: str
) -> batch.Decided | Failure:
    """A batch link's POST (the page's form or the API's JSON, after the checks each makes of its
    request): its items read afresh (what `submit` answered may be a day-old answer that Restate kept
    under the form's key), the link checked as for a batch's GET, then each chosen item decided. A
    link that no longer decides (expired, replaced) is refused, unless the choices only repeat
    decisions this approver made: then each item's `decide`, under the same key, gives back its
    first answer (a retried POST is told its decision counted). A link of one approval is no batch's."""
    checked = await checked_link(settings, runs, runs.status, token)
    if isinstance(checked, Failure):
        return checked
    status, record, claims, link_state = checked
    if len(record.batch) <= 1:
        return Failure(400, "Not a batch", "This link is for one action: send its verdict. Nothing was decided.")
    approver = record.approvers[claims.slot]
    stale = stale_link(record, claims.slot, link_state, BATCH_NOT_DECIDED)
    if stale is not None and not batch.repeats_its_votes(status, record, approver, claims.round, choices):
        return stale
    return await batch.decide_items(settings, runs, status, record, approver, claims.round, choices, client)


async def checked_link(
    settings: Settings, runs: RunsClient, main: StatusCall, token: str
) -> tuple[RunStatus, ApprovalRecord, links.LinkClaims, links.LinkState] | Failure:
    """The approval the link names (read with `main`, a batch's items beside it) and the link
    checked against it; or why not."""
    try:
        claims = links.parse(token)
        sealed = links.sealed(token, settings.approvals_signing_keys)
        loaded = await ApprovalPages._load(runs, main, claims, sealed)
        if loaded is None:
            raise LinkInvalid("This link is not valid.")
        status, record = loaded
        claims, link_state = links.check(token, record, settings.approvals_signing_keys, time.time())
    except LinkInvalid as exc:
        return link_failure(exc)
    except RunCallFailed as exc:
        return Failure(exc.status, "Try again", exc.message)
    return status, record, claims, link_state


def link_failure(exc: LinkInvalid) -> Failure:
    return Failure(exc.status, "Link expired" if exc.status == 410 else "Link not valid", exc.reason)


BATCH_NOT_DECIDED = "actions not decided by then were"


def stale_for_read(record: ApprovalRecord, slot: int, link_state: links.LinkState) -> Failure | None:
    """The 410 a read (the page's GET, the API's) answers for an authentic link that no longer decides
    anything, or None: for a batch before anything else (its page mints current-round tokens for its
    items, so a link from a replaced round, or past its expiry, must end here as a single page's
    does); for one approval only while it waits for this slot (how it ended, or that this slot's vote
    is recorded, is shown whatever the link's state)."""
    if len(record.batch) > 1:
        return stale_link(record, slot, link_state, BATCH_NOT_DECIDED)
    if record.state != "pending" or batch.voted(record, slot):
        return None
    return stale_link(record, slot, link_state, "the action was")


def stale_link(record: ApprovalRecord, slot: int, link_state: links.LinkState, what: str) -> Failure | None:
    """Why an authentic link no longer decides anything (a 410), or None if it is valid."""
    if link_state == "replaced":
        if slot not in record.active_slots:
            now_with = ", ".join(record.approvers[s] for s in record.active_slots)
            return Failure(410, "Handed on", f"This approval was handed to {now_with}; this link no longer works.")
        return Failure(410, "Link replaced", "This link was replaced by a newer one; use the most recent email.")
    if link_state == "expired":
        return Failure(410, "Link expired", f"This link has expired; {what} not approved.")
    return None


def shown(failure: Failure) -> Response:
    """A failure as the page shows it."""
    if failure.unconfirmed:
        return notice(failure.status, failure.title, failure.text, hint=wording.UNCONFIRMED_HINT)
    return notice(failure.status, failure.title, failure.text)


async def _with_batch(
    runs: RunsClient, status: RunStatus, record: ApprovalRecord, claims: links.LinkClaims, sealed: bool
) -> RunStatus:
    """`status` (of the approval the link names, `record`) with the other items of its batch beside
    it, each read from its own workflow."""
    if not record.batch:
        return status
    approvals, history = list(status.approvals), list(status.history)
    for other in record.batch:
        if other != claims.index:
            item = await _approval_status(runs.status, links.approval_id(claims.run_id, other), claims.exp, sealed)
            approvals += item.approvals
            history += item.history
    return status.model_copy(update={"approvals": approvals, "history": history})


def _may_wait_for_record(sealed: bool, expires: int) -> None:
    """Raises LinkInvalid unless a link whose approval has no record may wait for it: only a link our
    keys sealed (anyone can write a well-formed token, and each one held open for seconds would be
    an amplification that needs no secret), and only within the expiry it claims."""
    if not sealed:
        raise LinkInvalid("This link is not valid.")
    if time.time() >= expires:
        # Past the expiry it claims, a link decides nothing whatever it is: say so, as for a
        # known approval (its workflow may still be starting after a crash of the handler).
        raise LinkInvalid("This link has expired.", status=410)


def _link_notice(exc: LinkInvalid) -> Response:
    return shown(link_failure(exc))


def _not_decided(exc: RunCallFailed) -> Failure:
    """A failed `submit`: its own refusal (4xx, nothing decided), or a 5xx, which may come after the
    decision was recorded (the answer was lost): claim neither."""
    if exc.status >= 500:
        return Failure(exc.status, "Not confirmed", exc.message, unconfirmed=True)
    return Failure(exc.status, "Not decided", exc.message)


async def _approval_status(call: StatusCall, approval_id: str, expires: int, sealed: bool) -> RunStatus:
    """An approval's status. The request email goes out from the caller's journal just before the
    approval's own workflow has saved its record, so a link still within its validity may meet an
    approval that is not there yet: if the link is `sealed` (made with our keys), the page waits
    for it a little (a read, polled with a deadline; a GET's `viewed` records nothing while the
    record is missing), then says "try again" (nothing decided), or "expired" once the link's expiry
    has passed. Any other link is "invalid" after the first read."""
    deadline = time.monotonic() + _SETUP_WAIT_SECONDS
    pause = 0.02
    while True:
        status = await call(approval_id)
        if status.phase != "unknown":
            return status
        _may_wait_for_record(sealed, expires)
        if time.monotonic() + pause > deadline:
            raise RunCallFailed(503, "This approval is still being set up. Please try again in a minute.")
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)
