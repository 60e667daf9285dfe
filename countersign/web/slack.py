"""`POST /slack/interactions`: Slack's button clicks and modal submissions, on the public listener.

Guarantee: nothing is read from a request unless `slack_sdk`'s `SignatureVerifier` accepts its
signature and timestamp under `SLACK_SIGNING_SECRET` (otherwise 401, nothing decided: a missing or
malformed timestamp too); a signed payload of an unexpected shape is a 400 that says so. A click on
Approve or Reject opens the confirmation modal (`views.open`); a modal submission is handed, raw and
with its signature, to `Approval.slack_decide` under the ingress idempotency key
`slack-decision/<view id>` and answered as soon as Restate has durably accepted it, without waiting
for the decision (Slack gives 3 s); that handler verifies the signature again, checks who clicked
and tells them the outcome in Slack. Nothing here decides, and nothing answers 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pydantic import ValidationError
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from countersign.channels import slack
from countersign.channels.slack_interactions import (
    MAX_BODY,
    SIGNATURE_REFUSED,
    NotOurs,
    SlackInteraction,
    authentic,
    field_at,
    payload_of,
    submission,
)
from countersign.settings import Settings
from countersign.web.runs_client import RunCallFailed, RunsClient
from countersign.web.webhooks import bounded_body

log = logging.getLogger("countersign.slack")
# views.open must be called within Slack's 3 s of the click (its trigger_id expires).
VIEWS_OPEN_TIMEOUT = 2


def _answer(http_status: int, **body: Any) -> JSONResponse:
    return JSONResponse(body, status_code=http_status, headers={"Cache-Control": "no-store"})


def _unreadable(what: str) -> JSONResponse:
    return _answer(400, error=f"not a Slack interaction this service can read: {what}")


def _field_error(block: str, message: str) -> JSONResponse:
    """A modal answer that keeps the modal open with `message` under `block` (decides nothing)."""
    return _answer(200, response_action="errors", errors={block: message})


class SlackInteractions:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def routes(self) -> list[Route]:
        return [Route("/slack/interactions", self.receive, methods=["POST"])]

    async def receive(self, request: Request) -> Response:
        if self.settings.slack_signing_secret is None:
            return _answer(503, error="Slack is not configured (SLACK_SIGNING_SECRET is not set)")
        raw = await bounded_body(request)
        if raw is None or len(raw) > MAX_BODY:
            return _answer(413, error=f"the body is larger than {MAX_BODY} bytes")
        timestamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            return _answer(400, error="the body is not UTF-8")
        if not authentic(body, timestamp, signature, self.settings):
            return _answer(401, error=SIGNATURE_REFUSED)
        try:
            payload = payload_of(body)
        except ValueError as exc:
            return _answer(400, error=f"not a Slack interaction payload: {exc}")
        kind = payload.get("type")
        if kind == "block_actions":
            return await self._open_modal(payload)
        if kind == "view_submission":
            return await self._submit(request.app.state.runs, body, timestamp, signature, payload)
        return _answer(200, status="ignored")

    async def _open_modal(self, payload: dict[str, Any]) -> Response:
        actions = payload.get("actions")
        action = actions[0] if isinstance(actions, list) and actions and isinstance(actions[0], dict) else {}
        verdicts = {slack.APPROVE_ACTION: "approve", slack.REJECT_ACTION: "reject"}
        if action.get("action_id") not in verdicts:
            return _answer(200, status="ignored")
        try:
            value = slack.ButtonValue.model_validate_json(str(action.get("value") or ""))
        except ValidationError:
            return _answer(400, error="not a Countersign button")
        try:
            channel = field_at(payload, "container", "channel_id") or field_at(payload, "channel", "id")
            message_ts = field_at(payload, "container", "message_ts")
            summary = str(field_at(payload, "message", "text") or "this action")
        except ValueError as exc:
            return _unreadable(str(exc))
        state = slack.ModalState(
            a=value.a,
            r=value.r,
            s=value.s,
            v=verdicts[str(action["action_id"])],
            ch=str(channel or ""),
            ts=str(message_ts or ""),
            c=value.c,
            g=value.g,
            q=value.q,
        )
        token = self.settings.slack_bot_token
        if token is None:
            return _answer(503, error="Slack is not configured (SLACK_BOT_TOKEN is not set)")
        web = WebClient(
            token=token.get_secret_value(), base_url=self.settings.slack_api_base, timeout=VIEWS_OPEN_TIMEOUT
        )
        try:
            await asyncio.to_thread(
                web.views_open,
                trigger_id=str(payload.get("trigger_id", "")),
                view=slack.modal(state, summary, value.cv, value.gw),
            )
        except (SlackApiError, OSError, TimeoutError, ValueError) as exc:
            # Nothing is decided; the person can click again or use the email.
            log.warning("could not open the Slack modal for %s: %s", value.a, type(exc).__name__)
        return Response(status_code=200)

    async def _submit(
        self, runs: RunsClient, body: str, timestamp: str, signature: str, payload: dict[str, Any]
    ) -> Response:
        try:
            decided = submission(payload, time.time())
        except NotOurs:
            return _answer(200, status="ignored")
        except ValidationError:
            return _unreadable("its private_metadata is not a Countersign decision")
        except ValueError as exc:
            return _unreadable(str(exc))
        if decided.verdict == "reject" and not decided.reason:
            return _field_error(slack.REASON_BLOCK, "A reason is required to reject.")
        interaction = SlackInteraction(body=body, timestamp=timestamp, signature=signature)
        key = f"slack-decision/{decided.view_id or decided.approval_id}"
        try:
            await runs.slack_decide(decided.approval_id, interaction.model_dump_json().encode(), key)
        except RunCallFailed as exc:
            return _field_error(slack.REASON_BLOCK, f"Not recorded: {exc.message}")
        # Accepted by Restate: `Approval.slack_decide` records it and says the outcome in Slack.
        return _answer(200, response_action="clear")
