"""The JSON API for approver UIs, `/api/v1/…` on the pages' listener: read what a link shows, decide
or answer it (a batch link's items one by one, as its page does), list an approver's inbox.

Guarantee: the API is the pages' own code path with JSON in place of HTML: a GET reads what the page
shows (and records the view, as the page's GET does) and never decides; a decision is checked as the
page's POST checks it (the link and its CSRF value, the origin a browser sent, the body's type and
size, then one `Approval.submit` call with `decide`'s rules, or for a batch link the batch page's
`decide_batch`, each shared with the page, not copied), so it can do nothing the page cannot. Every
refusal is an RFC 9457 `application/problem+json` with the status the page would answer. No CORS
headers unless `APPROVALS_API_ALLOWED_ORIGINS` names origins; a browser on any other origin can
neither read an answer nor send a JSON POST (its preflight fails).
"""

from __future__ import annotations

import functools
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic.json_schema import models_json_schema
from pydantic_core import from_json
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router

from countersign import textdiff as diff
from countersign.approval import confirm
from countersign.approval.edits import EditRejected
from countersign.approval.question import answer_of, fields_of, form_values
from countersign.contract import ApprovalRecord, PageSubmission, Strict, Submitted
from countersign.security import links
from countersign.security.links import LinkInvalid
from countersign.settings import Settings
from countersign.tools.registry import validation_message
from countersign.web import batch, wording
from countersign.web.inbox_page import InboxPage
from countersign.web.pages import (
    checked_link,
    decide_batch,
    link_failure,
    read_body,
    same_origin,
    stale_for_read,
    submit_once,
)
from countersign.web.runs_client import RunCallFailed, RunsClient
from countersign.web.views import Failure

PREFIX = "/api/v1"
PROBLEM = "application/problem+json"
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


class ItemView(BaseModel):
    """What an approval or question page shows, as data (`GET /api/v1/items/{token}`); for a batch
    link, what the batch page shows: the item the link names, with every item of the batch in `batch`."""

    approval_id: str
    index: int = Field(description="the call's index in its run; a batch decision names its items by it")
    kind: Literal["action", "plan", "question"]
    state: str
    """pending while it waits; else how it ended (approved, approved_with_edits, rejected, expired, …)."""
    summary: str
    approver: str = Field(description="whom this link acts for")
    requester: str
    why: str
    policy: str
    requested_at: float
    deadline: float
    fingerprint: str
    digest: str
    tool: str
    args: dict[str, Any] = Field(description="the frozen arguments (a plan's steps; a question's text and form)")
    editable: dict[str, str] = Field(description="the fields an approver may change, with their rule")
    confirm_field: str | None = Field(description="high stakes: the field whose value must be retyped")
    confirm_value: str | None = Field(description="the value to retype, as the page shows it")
    question: str | None = None
    fields: list[dict[str, Any]] = Field(default_factory=list, description="a question's form")
    default: dict[str, Any] | None = Field(default=None, description="a question's answer at the deadline")
    open: bool = Field(description="whether this link may still decide it")
    csrf: str | None = Field(description="send it back with a decision; None once nothing is left to decide")
    decided_by: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    edits: dict[str, Any] | None = Field(default=None, description="the approved edits, or a question's answer")
    answer: dict[str, Any] | None = Field(
        default=None, description="a question's answer, typed as its fields (as the asking handler gets it)"
    )
    batch: list[ItemView] = Field(
        default_factory=list,
        description="a batch link's items for this approver (its own among them), each `open` while the link "
        "may decide it; decide them with `BatchDecisionIn`. Empty for a link of one approval",
    )


class DecisionIn(Strict):
    """A decision or an answer (`POST /api/v1/items/{token}/decision`), as the page's form says it."""

    verdict: Literal["approve", "reject", "answer", "decline"]
    """answer and decline are a question's approve and reject."""
    reason: str = Field(default="", max_length=2000)
    edits: dict[str, str] = Field(default_factory=dict, max_length=60)
    answer: dict[str, Any] | None = Field(default=None, description="a question's answer, as JSON")
    confirm: str = Field(default="", max_length=200)
    csrf: str = Field(max_length=200)


class BatchItemIn(Strict):
    """One item of a batch and its verdict, as the batch page's form says it (no edits: the page takes none)."""

    index: int = Field(ge=0, description="the item's `index`, as the GET lists it in `batch`")
    verdict: Literal["approve", "reject"]
    reason: str = Field(default="", max_length=2000, description="required to reject")
    confirm: str = Field(default="", max_length=200, description="high stakes: the retyped value, to approve")


class BatchDecisionIn(Strict):
    """A batch link's decisions (`POST /api/v1/items/{token}/decision`): the items chosen; any item not
    listed is left to decide later, as on the batch page."""

    items: list[BatchItemIn] = Field(max_length=60)
    csrf: str = Field(max_length=200)

    @model_validator(mode="after")
    def _once_each(self) -> BatchDecisionIn:
        if len({i.index for i in self.items}) != len(self.items):
            raise ValueError("an item is listed more than once")
        return self


class DecisionOut(BaseModel):
    """A decision that counted (200)."""

    approval_id: str
    state: str
    decided_by: str | None
    decided_at: float | None
    reason: str | None = None
    edits: dict[str, Any] | None = None
    answer: dict[str, Any] | None = Field(default=None, description="a question's answer, typed as its fields")


class BatchItemOut(BaseModel):
    """What became of one chosen item of a batch."""

    index: int
    approval_id: str
    summary: str
    accepted: bool | None = Field(
        description="this decision counted; false: another completion came first; None: see error"
    )
    state: str | None = Field(description="how the item's decision point ended (None when the call failed)")
    decided_by: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    error: str | None = Field(default=None, description="why nothing is known to be decided (the call failed)")


class BatchDecisionOut(BaseModel):
    """A batch's decisions, one of them at least accepted (200)."""

    items: list[BatchItemOut]
    ignored: list[int] = Field(description="chosen indices that are no item this link decides (nothing done)")


class InboxItem(BaseModel):
    approval_id: str
    kind: Literal["action", "plan", "question"]
    summary: str
    requested_at: float
    deadline: float
    token: str = Field(description="a fresh link token for this approver: GET /api/v1/items/{token}")
    url: str = Field(description="the same item's page")


class InboxOut(BaseModel):
    approver: str
    items: list[InboxItem]


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    state: str | None = None
    decided_by: str | None = None
    items: list[BatchItemOut] | None = Field(default=None, description="a batch: what became of each chosen item")


def problem(status: int, title: str, detail: str, **extra: Any) -> JSONResponse:
    dumped = Problem(title=title, status=status, detail=detail, **extra).model_dump(mode="json")
    body = {k: v for k, v in dumped.items() if v is not None}  # absent members, not nulls; an item's nulls stay
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=_HEADERS)


def _failed(failure: Failure) -> JSONResponse:
    return problem(failure.status, failure.title, failure.text)


def _ok(model: BaseModel) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json"), headers=_HEADERS)


class ApproverApi:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.origin = "{0.scheme}://{0.netloc}".format(urlsplit(settings.approvals_public_url))
        self.inbox = InboxPage(settings)

    def endpoints(self) -> list[Route]:
        """The API's routes, relative to `PREFIX` (the OpenAPI document lists exactly these)."""
        return [
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/items/{token}", self.item, methods=["GET"]),
            Route("/items/{token}/decision", self.decide, methods=["POST"]),
            Route("/inbox/{token}", self.inbox_items, methods=["GET"]),
        ]

    def routes(self) -> list[BaseRoute]:
        router = Router(routes=list(self.endpoints()), redirect_slashes=False)
        allowed = self.settings.approvals_api_allowed_origins
        if not allowed:
            return [Mount(PREFIX, app=router)]
        cors = CORSMiddleware(
            router, allow_origins=allowed, allow_methods=["GET", "POST"], allow_headers=["content-type"], max_age=600
        )
        return [Mount(PREFIX, app=cors)]

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(), headers=_HEADERS)

    async def item(self, request: Request) -> Response:
        token = request.path_params["token"]
        runs: RunsClient = request.app.state.runs
        viewed = functools.partial(runs.viewed, token=token, client=request.headers.get("user-agent", ""))
        checked = await checked_link(self.settings, runs, viewed, token)
        if isinstance(checked, Failure):
            return _failed(checked)
        status, record, claims, link_state = checked
        if (stale := stale_for_read(record, claims.slot, link_state)) is not None:
            return _failed(stale)
        items: list[ItemView] = []
        decidable = batch.is_open(record, claims.slot)
        if len(record.batch) > 1:
            asked = batch.items_for(status, record, record.approvers[claims.slot], claims.round)
            items = [self._view(item, slot, None) for item, slot in asked]
            decidable = any(item.open for item in items)
        return _ok(self._view(record, claims.slot, token if decidable else None, items))

    def _view(
        self, record: ApprovalRecord, slot: int, token: str | None, items: list[ItemView] | None = None
    ) -> ItemView:
        question = record.kind == "question"
        keys = self.settings.approvals_signing_keys
        return ItemView(
            approval_id=record.approval_id,
            index=record.index,
            kind=record.kind,
            state=record.state,
            summary=record.summary,
            approver=record.approvers[slot],
            requester=record.requester,
            why=record.why,
            policy=record.policy,
            requested_at=record.requested_at,
            deadline=record.deadline,
            fingerprint=record.digest[:12],
            digest=record.digest,
            tool=record.tool,
            args=record.args,
            editable=record.editable,
            confirm_field=record.confirm_field,
            confirm_value=confirm.expected(record),
            question=record.args.get("question") if question else None,
            fields=[f.model_dump(mode="json") for f in fields_of(record.args)] if question else [],
            default=record.args.get("default") if question else None,
            open=batch.is_open(record, slot),
            csrf=links.csrf_token(token, keys, self.settings.signing_kid) if token else None,
            decided_by=record.decided_by,
            decided_at=record.decided_at,
            reason=record.reason,
            edits=record.edits,
            answer=_answer_of(record, record.edits),
            batch=items or [],
        )

    async def decide(self, request: Request) -> Response:
        token = request.path_params["token"]
        try:
            claims = links.parse(token)
        except LinkInvalid as exc:
            return _failed(link_failure(exc))
        sent_origin = request.headers.get("origin")
        if sent_origin is not None and not (
            same_origin(request, self.origin) or sent_origin in self.settings.approvals_api_allowed_origins
        ):
            return problem(403, "Request refused", "This origin may not decide approvals.")
        body = await read_body(request, "application/json")
        if body is None:
            return problem(400, "Request refused", "Send a JSON body (application/json) of at most 64 KiB.")
        try:
            sent = from_json(body)
            model: type[DecisionIn | BatchDecisionIn] = (
                BatchDecisionIn if isinstance(sent, dict) and "items" in sent else DecisionIn
            )
            decision = model.model_validate(sent)
        except ValueError as exc:  # not JSON at all, or a ValidationError
            problem_text = validation_message(exc) if isinstance(exc, ValidationError) else "it is not JSON"
            return problem(400, "Request refused", f"The decision is not valid: {problem_text}")
        if not links.csrf_ok(token, decision.csrf, self.settings.approvals_signing_keys):
            return problem(403, "Request refused", "The csrf value is not this link's; read the item again.")
        runs: RunsClient = request.app.state.runs
        client = request.headers.get("user-agent", "")[:300]
        if isinstance(decision, BatchDecisionIn):
            choices = {i.index: batch.Choice(i.verdict, i.reason, i.confirm) for i in decision.items}
            decided = await decide_batch(self.settings, runs, token, choices, client)
            return _failed(decided) if isinstance(decided, Failure) else _batch_answered(decided)
        edits = dict(decision.edits)
        if decision.answer is not None:
            edits.update(form_values(decision.answer))
        submission = PageSubmission(
            token=token,
            verdict={"answer": "approve", "decline": "reject"}.get(decision.verdict, decision.verdict),
            reason=decision.reason,
            edits=edits,
            confirm=decision.confirm,
            client=client,
            # The approver's own UI showed these edits: a long text's diff is its to show, not a step here.
            reviewed=diff.marker(edits),
        )
        submitted = await submit_once(self.settings, runs, token, claims, submission)
        if isinstance(submitted, Failure):
            return _failed(submitted)
        return _answered(submitted)

    async def inbox_items(self, request: Request) -> Response:
        runs: RunsClient = request.app.state.runs
        try:
            approver, items = await self.inbox.pending(runs, request.path_params["token"])
        except LinkInvalid as exc:
            return problem(exc.status, "Link not valid", exc.reason)
        except RunCallFailed as exc:
            return problem(exc.status, "Try again", exc.message)
        listed = [
            InboxItem(
                approval_id=i["record"].approval_id,
                kind=i["record"].kind,
                summary=i["record"].summary,
                requested_at=i["record"].requested_at,
                deadline=i["record"].deadline,
                token=i["token"],
                url=i["url"],
            )
            for i in items
        ]
        return _ok(InboxOut(approver=approver, items=listed))


def _answered(submitted: Submitted) -> Response:
    """What `Approval.submit` answered, as the API says it (the page's statuses)."""
    record, receipt = submitted.record, submitted.receipt
    if submitted.refused is not None:
        return problem(submitted.refused.status, submitted.refused.title, submitted.refused.text)
    if submitted.takeover == "batch":
        # As the batch page answers a form without an item's verdict: nothing chosen, nothing decided.
        text = "This link is for actions asked together: send `items`, a verdict for each (see `batch`)."
        return problem(400, "A batch", f"{text} Nothing was decided.")
    if submitted.takeover == "review" or record is None or receipt is None:
        return problem(503, "Not confirmed", "The approval service gave no answer; read the item again.")
    if not receipt.accepted and record.kind == "question":  # in the words its page uses
        closed = wording.question_closed(receipt.state, receipt.decided_by, None, None, None)
        return problem(409, closed.title, closed.headline, state=receipt.state, decided_by=receipt.decided_by)
    if not receipt.accepted:
        detail = f"Already {receipt.state.replace('_', ' ')}" + (
            f" by {receipt.decided_by}." if receipt.decided_by else "."
        )
        return problem(409, "Already decided", detail, state=receipt.state, decided_by=receipt.decided_by)
    out = DecisionOut(
        approval_id=record.approval_id,
        state=receipt.state,
        decided_by=receipt.decided_by,
        decided_at=receipt.decided_at,
        reason=receipt.reason,
        edits=receipt.edits,
        answer=_answer_of(record, receipt.edits),
    )
    return _ok(out)


def _answer_of(record: ApprovalRecord, edits: dict[str, Any] | None) -> dict[str, Any] | None:
    """A question's answer as its asking handler gets it, read by the question's own frozen fields
    as when it was answered (`edits` are the form's values, or the typed answer once the workflow
    settled it); the declared default when the deadline answered it. None for an approval, and
    until answered."""
    defaulted = record.decision_source == "deadline_default" and record.state == "approved"
    if record.kind != "question" or not (edits or defaulted):
        return None
    try:
        return answer_of(record.args, edits, defaulted=defaulted)
    except EditRejected:  # only a record not answered through its form
        return None


def _batch_answered(decided: batch.Decided) -> Response:
    """What a batch's decisions came to: 200 when one was accepted, else the batch page's status as
    a problem, each chosen item's outcome in it."""
    items = [
        BatchItemOut(
            index=item.index,
            approval_id=item.approval_id,
            summary=item.summary,
            accepted=receipt.accepted if receipt else None,
            state=receipt.state if receipt else None,
            decided_by=receipt.decided_by if receipt else None,
            decided_at=receipt.decided_at if receipt else None,
            reason=receipt.reason if receipt else None,
            error=error or None,
        )
        for item, receipt, error in decided.outcomes
    ]
    if decided.status == 200:
        return _ok(BatchDecisionOut(items=items, ignored=decided.ignored))
    if decided.unconfirmed:
        return problem(decided.status, "Not confirmed", "No decision is confirmed; read the item again.", items=items)
    return problem(decided.status, "Not decided", "None of the chosen actions was decided by you.", items=items)


_OPERATIONS: dict[str, dict[str, Any]] = {
    "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}},
    "/items/{token}": {
        "get": {
            "summary": "What an approval or question link shows (records the view; never decides)",
            "ok": ["ItemView"],
            "errors": ["403", "410", "503"],
        }
    },
    "/items/{token}/decision": {
        "post": {
            "summary": "Decide an approval or answer a question, or a batch link's items, with every check the "
            "page's POST makes",
            "body": ["DecisionIn", "BatchDecisionIn"],
            "ok": ["DecisionOut", "BatchDecisionOut"],
            "errors": ["400", "403", "409", "410", "503"],
        }
    },
    "/inbox/{token}": {
        "get": {
            "summary": "What waits for the approver an inbox token names, each with a fresh link token",
            "ok": ["InboxOut"],
            "errors": ["403", "410", "503"],
        }
    },
}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API (its schemas are the pydantic models above)."""
    models: list[type[BaseModel]] = [
        BatchDecisionIn,
        BatchDecisionOut,
        DecisionIn,
        DecisionOut,
        InboxOut,
        ItemView,
        Problem,
    ]
    mode: Literal["validation"] = "validation"
    _, defs = models_json_schema([(m, mode) for m in models], ref_template="#/components/schemas/{model}")
    paths: dict[str, Any] = {}
    for path, methods in _OPERATIONS.items():
        paths[PREFIX + path] = {}
        for method, op in methods.items():
            if "ok" not in op:
                paths[PREFIX + path][method] = op
                continue
            ref = _schema_of(op["ok"])
            problem_ref = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}
            operation: dict[str, Any] = {
                "summary": op["summary"],
                "parameters": [{"name": "token", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": ref}}},
                    **{code: {"description": "refused", "content": problem_ref} for code in op["errors"]},
                },
            }
            if "body" in op:
                body_ref = _schema_of(op["body"])
                operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_ref}}}
            paths[PREFIX + path][method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Countersign approver API", "version": "1"},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }


def _schema_of(names: list[str]) -> dict[str, Any]:
    """A reference to the one schema named, or `oneOf` the schemas named."""
    refs = [{"$ref": f"#/components/schemas/{name}"} for name in names]
    return refs[0] if len(refs) == 1 else {"oneOf": refs}


def routes_of(settings: Settings) -> list[tuple[str, str]]:
    """(path, method) of every API route, for the test that keeps the document in step."""
    return [
        (PREFIX + r.path, m.lower())
        for r in ApproverApi(settings).endpoints()
        for m in sorted(r.methods or ())
        if m != "HEAD"
    ]
