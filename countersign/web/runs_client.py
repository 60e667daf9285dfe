"""Calls from the web tier to the `Approval` workflows through the Restate ingress (the SDK client).

Guarantee: every failure comes back as `RunCallFailed` with an HTTP status and a message safe to
show (the workflow's own refusal, or "try again" when Restate is unreachable), never a raw error;
with a journal cipher, what the pages send is sealed before it reaches Restate and what comes back
is opened, exactly as the endpoint does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import httpx
import restate

from countersign.approval.grants import GIVEN_SERVICE, GRANTS_SERVICE, GivenGrants, Grant, GrantList, RevokeGrant
from countersign.contract import Decision, DecisionReceipt, PageSubmission, PageView, RunStatus, Submitted
from countersign.objects.inbox import InboxView
from countersign.security.codec import JournalValueUnreadable

SERVICE = "Approval"
_JSON = {"content-type": "application/json"}


class RunCallFailed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RunsClient:
    def __init__(self, client: restate.RestateClient) -> None:
        self._client = client

    async def status(self, approval_id: str) -> RunStatus:
        """One approval as its workflow keeps it (its record, the run's goal, what it executed)."""
        raw = await self._call("status", approval_id, None, None)
        return RunStatus.model_validate_json(raw)

    async def decide(self, approval_id: str, decision: Decision, idempotency_key: str) -> DecisionReceipt:
        raw = await self._call("decide", approval_id, decision.model_dump_json().encode(), idempotency_key)
        return DecisionReceipt.model_validate_json(raw)

    async def submit(self, approval_id: str, submission: PageSubmission, idempotency_key: str) -> Submitted:
        """An approval page's POST, handed to `Approval.submit`: the status and the decision (or why
        none was made) in one invocation, where a status read and `decide` were two."""
        raw = await self._call("submit", approval_id, submission.model_dump_json().encode(), idempotency_key)
        return Submitted.model_validate_json(raw)

    async def inbox(self, approver: str) -> InboxView:
        return InboxView.model_validate_json(await self._call("pending", approver, None, None, service="ApprovalInbox"))

    async def grants(self, key: str) -> list[Grant]:
        """The standing approvals kept under one `Grants` key (a tool and a requester or tenant)."""
        raw = await self._call("list", key, None, None, service=GRANTS_SERVICE)
        return GrantList.model_validate_json(raw).grants

    async def grants_given(self, approver: str) -> GivenGrants:
        """Where the standing approvals `approver` gave are kept."""
        return GivenGrants.model_validate_json(await self._call("list", approver, None, None, service=GIVEN_SERVICE))

    async def revoke_grant(self, key: str, request: RevokeGrant) -> Grant:
        raw = await self._call("revoke", key, request.model_dump_json().encode(), None, service=GRANTS_SERVICE)
        return Grant.model_validate_json(raw)

    async def viewed(self, approval_id: str, token: str, client: str) -> RunStatus:
        """What `status` answers, for a page opened with this link (GET); `Approval.viewed` also
        records the view in the audit trail when the link is authentic (it re-verifies it). One
        call: the status a page shows and its view are a single invocation."""
        view = PageView(token=token, client=client[:300])
        raw = await self._call("viewed", approval_id, view.model_dump_json().encode(), None)
        return RunStatus.model_validate_json(raw)

    async def slack_decide(self, approval_id: str, body: bytes, idempotency_key: str) -> None:
        """Hand a verified Slack decision to `Approval.slack_decide` without waiting for it (Slack
        wants its answer within 3 s); returns once Restate has durably accepted the call."""
        with _failures():
            await self._client.generic_send(
                SERVICE, "slack_decide", body, key=approval_id, idempotency_key=idempotency_key, headers=_JSON
            )

    async def _call(
        self, handler: str, key: str, body: bytes | None, idempotency_key: str | None, service: str = SERVICE
    ) -> bytes:
        try:
            with _failures():
                return await self._client.generic_call(
                    service,
                    handler,
                    body or b"",
                    key=key,
                    idempotency_key=idempotency_key,
                    headers=_JSON if body is not None else None,
                )
        except JournalValueUnreadable:
            raise RunCallFailed(503, "The approval service cannot read its records (journal keys).") from None


def _message(body: str) -> str:
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else "This request was refused."


@asynccontextmanager
async def runs_client(ingress_url: str, codec: restate.JournalValueCodec | None = None) -> AsyncIterator[RunsClient]:
    async with restate.create_client(ingress_url, journal_value_codec=codec) as client:
        yield RunsClient(client)


@contextmanager
def _failures() -> Iterator[None]:
    """What the pages say when a call to Restate fails: its own 4xx message, or "try again"."""
    try:
        yield
    except restate.HttpError as exc:
        if 400 <= exc.status_code < 500:
            raise RunCallFailed(exc.status_code, _message(exc.body or "")) from None
        raise RunCallFailed(503, "The approval service is busy. Please try again in a minute.") from None
    except httpx.HTTPError:
        raise RunCallFailed(503, "The approval service is unreachable. Please try again in a minute.") from None
