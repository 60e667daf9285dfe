"""`/grants/{token}`: the page that shows one standing approval and revokes it.

Guarantee: GET changes nothing (mail scanners open links); only a same-origin POST carrying the
link's CSRF value revokes, in the grant's own `Grants` object, which records who revoked it (the
person it was given by: the link was sent to them alone). A revoked grant covers no call asked after.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from countersign.approval.grants import Grant, RevokeGrant
from countersign.security import links
from countersign.security.links import LinkInvalid
from countersign.settings import Settings
from countersign.web.pages import ApprovalPages
from countersign.web.runs_client import RunCallFailed, RunsClient
from countersign.web.views import notice, page, when


class GrantPage:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.forms = ApprovalPages(settings)  # the same origin, CSRF and form-size checks as the approval page

    def routes(self) -> list[Route]:
        return [Route("/grants/{token}", self.dispatch, methods=["GET", "HEAD", "POST"])]

    async def dispatch(self, request: Request) -> Response:
        token = request.path_params["token"]
        runs: RunsClient = request.app.state.runs
        keys = self.settings.approvals_signing_keys
        try:
            key, grant_id = links.grant_claims(token, keys, time.time())
        except LinkInvalid as exc:
            return notice(exc.status, "Link not valid", exc.reason)
        try:
            grant = next((g for g in await runs.grants(key) if g.grant_id == grant_id), None)
            if grant is None:
                return notice(404, "Not found", "This standing approval does not exist.")
            if request.method != "POST":
                return self._show(grant, token, 200)
            form = await self.forms.check_post(request, token)
            if isinstance(form, Response):
                return form
            grant = await runs.revoke_grant(key, RevokeGrant(grant_id=grant_id, by=grant.granted_by))
        except RunCallFailed as exc:
            return notice(exc.status, "Try again", exc.message)
        return self._show(grant, token, 200)

    def _show(self, grant: Grant, token: str, status: int) -> Response:
        csrf = links.csrf_token(token, self.settings.approvals_signing_keys, self.settings.signing_kid)
        return page(
            "grant.html",
            status,
            grant=grant,
            state=grant.state(time.time()),
            bounds=grant.bounds(),
            csrf=csrf,
            until=when(grant.expires_at),
            revoked=when(grant.revoked_at),
        )
