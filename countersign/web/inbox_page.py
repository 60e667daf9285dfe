"""`GET /inbox/{token}`: an approver's own list of what waits for them, with a link to each.

Guarantee: read-only; the token is signed for one approver, expires, and is refused once that
approver's inbox links were revoked after it was made (`python -m countersign inbox revoke`); each listed
link is a fresh approval-link token for that approver's current slot, so the inbox never offers a
stale one.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from countersign.approval.grants import Grant
from countersign.mail.grant_email import revoke_url
from countersign.security import links
from countersign.security.links import LinkInvalid
from countersign.settings import Settings
from countersign.web.runs_client import RunCallFailed, RunsClient
from countersign.web.views import notice, page, remaining, when


class InboxPage:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def routes(self) -> list[Route]:
        return [Route("/inbox/{token}", self.show, methods=["GET", "HEAD"])]

    async def show(self, request: Request) -> Response:
        runs: RunsClient = request.app.state.runs
        try:
            approver, items = await self.pending(runs, request.path_params["token"])
            grants = await self._grants(runs, approver, time.time())
        except LinkInvalid as exc:
            return notice(exc.status, "Link not valid", exc.reason)
        except RunCallFailed as exc:
            return notice(exc.status, "Try again", exc.message)
        return page("inbox.html", approver=approver, items=items, grants=grants)

    async def pending(self, runs: RunsClient, token: str) -> tuple[str, list[dict[str, Any]]]:
        """The approver an inbox token names and what waits for them (each with a fresh link token);
        LinkInvalid for a token that is not valid, expired or revoked."""
        keys, now = self.settings.approvals_signing_keys, time.time()
        claims = links.inbox_claims(token, keys, now)
        approver = claims.approver
        view = await runs.inbox(approver)
        if claims.issued_ms < view.revoked_before_ms:
            raise LinkInvalid("This inbox link was revoked; the next approval email brings a new one.", status=410)
        items = [await self._item(runs, approver, entry.approval_id, now) for entry in view.pending]
        return approver, [i for i in items if i is not None]

    async def _grants(self, runs: RunsClient, approver: str, now: float) -> list[dict[str, Any]]:
        """The live standing approvals `approver` gave, newest first, each with the link that revokes it."""
        given = (await runs.grants_given(approver)).given
        kept: dict[str, list[Grant]] = {}
        for key in {g.key for g in given}:
            kept[key] = await runs.grants(key)
        live = []
        for ref in reversed(given):
            grant = next((g for g in kept[ref.key] if g.grant_id == ref.grant_id), None)
            if grant is None or grant.state(now) != "live":
                continue
            url = revoke_url(self.settings, {**grant.model_dump(mode="json"), "key": grant.key})
            live.append({"grant": grant, "bounds": grant.bounds(), "url": url, "until": when(grant.expires_at)})
        return live

    async def _item(self, runs: RunsClient, approver: str, approval_id: str, now: float) -> dict[str, Any] | None:
        status = await runs.status(approval_id)
        record = next((a for a in status.approvals if a.approval_id == approval_id), None)
        if record is None or record.state != "pending":
            return None
        slots = [s for s in record.active_slots if record.approvers[s] == approver]
        if not slots:
            return None
        token = links.mint(record, slots[0], self.settings.approvals_signing_keys, self.settings.signing_kid)
        return {
            "record": record,
            "token": token,
            "url": f"{self.settings.approvals_public_url}/approvals/{token}",
            "age": when(record.requested_at),
            "remaining": remaining(record.deadline, now),
        }
