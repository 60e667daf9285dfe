"""`Grants`: standing approvals, one Virtual Object per tool and scope (requester or tenant).

Guarantee: a grant is kept durably under the key `<tool>|<scope>:<who>` (so no key is shared by every
approval of a tool), created once per approval (its id is `g-<approval id>`), and each use is counted
exactly once: the object runs one exclusive handler at a time, so concurrent calls cannot overrun
`max_uses`, and a use id (`<run_id>/<index>`) already counted is answered again without counting it
twice. A revoked or expired grant covers nothing; expiry is judged at the call's own journaled time.
"""

from __future__ import annotations

import time
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext, TerminalError

from countersign import retention
from countersign.contract import GrantScope, Strict
from countersign.events import emit as events
from countersign.inputs import Body
from countersign.security.redact import clean_failures

GRANTS_SERVICE = "Grants"
GIVEN_SERVICE = "GrantsGiven"
_GRANT = "grant:"
GRANTS_QUERY = "SELECT service_key, key, value_utf8 FROM state WHERE service_name = 'Grants' AND key LIKE 'grant:%'"
"""The admin SQL query of every grant's stored state (for `countersign grants list`)."""

grants = restate.VirtualObject(
    GRANTS_SERVICE,
    description="Standing approvals of one tool for one requester or tenant",
    # A refused input is a 400 with its message, not a 500 (countersign.security.redact).
    invocation_context_managers=[clean_failures],
)


GrantState = Literal["live", "used up", "expired", "revoked"]


class Grant(GrantScope):
    """One standing approval: calls of `tool` within its bounds run without a person until it expires,
    is used up or is revoked."""

    grant_id: str
    tool: str
    tenant: str
    uses: int = 0
    used_by: list[str] = Field(default_factory=list)
    """The use ids (`<run_id>/<index>`) it covered, in order."""
    granted_by: str
    granted_at: float
    expires_at: float
    approval_id: str
    revoked_at: float | None = None
    revoked_by: str | None = None

    @property
    def key(self) -> str:
        return grant_key(self.tool, self.scope, self.scope_value)

    def state(self, now: float) -> GrantState:
        if self.revoked_at is not None:
            return "revoked"
        if now >= self.expires_at:
            return "expired"
        return "used up" if self.uses >= self.max_uses else "live"

    def bounds(self) -> list[str]:
        """Its bounds in plain words: `customer_id = c_17`, `amount_usd ≤ 612.40`."""
        same = [f"{k} = {v}" for k, v in sorted(self.same.items())]
        return same + [f"{k} ≤ {v}" for k, v in sorted(self.at_most.items())]


class GrantAsk(BaseModel):
    """A gated call asking whether a grant covers it: `at` is the call's journaled time."""

    use_id: str
    args: dict[str, Any]
    at: float


class GrantCheck(BaseModel):
    """The answer: the grant that covers the call (its use counted), or why none did (`missed`)."""

    grant: Grant | None = None
    missed: str | None = None


class RevokeGrant(Strict):
    grant_id: str = Field(min_length=3, max_length=300)
    by: str = Field(min_length=1, max_length=300)


def grant_key(tool: str, scope: str, value: str) -> str:
    return f"{tool}|{scope}:{value.lower() if scope == 'requester' else value}"


def miss(grant: Grant, args: dict[str, Any], at: float) -> str | None:
    """Why `grant` does not cover a call with `args` asked at `at` (None: it covers it)."""
    if grant.revoked_at is not None:
        return f"standing approval {grant.grant_id} was revoked by {grant.revoked_by}"
    if at >= grant.expires_at:
        return f"standing approval {grant.grant_id} expired"
    if grant.uses >= grant.max_uses:
        return f"standing approval {grant.grant_id} was used {grant.uses} of {grant.max_uses} times"
    for name, wanted in grant.same.items():
        if args.get(name) != wanted:
            return f"{name} is {args.get(name)!r}, not {wanted!r} as approved (standing approval {grant.grant_id})"
    for name, bound in grant.at_most.items():
        value = number(args.get(name))
        if value is None or value > Decimal(bound):
            shown = args.get(name)
            return f"{name} = {shown} is above {bound}, the approved bound (standing approval {grant.grant_id})"
    return None


def number(value: object) -> Decimal | None:
    """A JSON argument as a finite number (a pydantic Decimal is written as text), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        parsed = Decimal(str(value))
    except InvalidOperation:
        return None
    return parsed if parsed.is_finite() else None


async def _all(ctx: ObjectSharedContext | ObjectContext) -> list[Grant]:
    found = []
    for key in sorted(await ctx.state_keys()):
        if key.startswith(_GRANT) and (grant := await ctx.get(key, type_hint=Grant)) is not None:
            found.append(grant)
    return sorted(found, key=lambda g: g.granted_at)


@grants.handler(name="create", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def create(ctx: ObjectContext, grant: Grant) -> Grant:
    """Keep `grant` (the one already kept under its id, if the same approval gave it before)."""
    kept = await ctx.get(_GRANT + grant.grant_id, type_hint=Grant)
    if kept is not None:
        return kept
    ctx.set(_GRANT + grant.grant_id, grant)
    return grant


@grants.handler(name="use", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def use(ctx: ObjectContext, ask: GrantAsk) -> GrantCheck:
    """The grant that covers the call, its use counted once; else why the nearest one did not."""
    missed = None
    for grant in await _all(ctx):
        if ask.use_id in grant.used_by:  # a retry of a use already counted
            return GrantCheck(grant=grant)
        why = miss(grant, ask.args, ask.at)
        if why is None:
            grant.uses += 1
            grant.used_by.append(ask.use_id)
            ctx.set(_GRANT + grant.grant_id, grant)
            return GrantCheck(grant=grant)
        live = grant.revoked_at is None and ask.at < grant.expires_at and grant.uses < grant.max_uses
        if missed is None or live:  # a bound a live grant missed says more than an expired grant
            missed = why
    return GrantCheck(missed=missed)


class _Revoked(BaseModel):
    at: float
    webhooks: bool


def _revoked_now(tenant: str) -> _Revoked:
    return _Revoked(at=time.time(), webhooks=events.wanted(tenant))


@grants.handler(name="revoke", input_serde=Body(RevokeGrant), journal_retention=retention.NO_JOURNAL)
async def revoke(ctx: ObjectContext, request: RevokeGrant) -> Grant:
    """Revoke a grant: it covers no call asked after it (revoking it again changes nothing)."""
    grant = await ctx.get(_GRANT + request.grant_id, type_hint=Grant)
    if grant is None:
        raise TerminalError(f"no standing approval {request.grant_id!r} under {ctx.key()!r}", 404)
    if grant.revoked_at is None:
        revoked = await ctx.run_typed("revoked at", _revoked_now, tenant=grant.tenant)
        grant.revoked_at, grant.revoked_by = revoked.at, request.by
        ctx.set(_GRANT + grant.grant_id, grant)
        if revoked.webhooks:
            events.grant_changed(ctx, "grant.revoked", grant.model_dump(mode="json"), revoked.at)
    return grant


class GrantList(BaseModel):
    grants: list[Grant]


@grants.handler(name="list", kind="shared", journal_retention=retention.NO_JOURNAL)
async def listed(ctx: ObjectSharedContext) -> GrantList:
    """Every grant under this key, oldest first, with its uses."""
    return GrantList(grants=await _all(ctx))


grants_given = restate.VirtualObject(
    GIVEN_SERVICE,
    description="The standing approvals one approver gave (where each is kept), for their inbox page",
    invocation_context_managers=[clean_failures],
)


class GivenGrant(BaseModel):
    """Where one standing approval an approver gave is kept: its `Grants` key and its id."""

    key: str
    grant_id: str


class GivenGrants(BaseModel):
    given: list[GivenGrant] = Field(default_factory=list)


_GIVEN = "given"
MAX_GIVEN = 200
"""The most recent grants an approver's inbox page lists (older ones stay in `Grants`, and in the CLI)."""


@grants_given.handler(name="add", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def add_given(ctx: ObjectContext, given: GivenGrant) -> None:
    """Note a grant this approver gave (once, however often it is sent)."""
    kept = await ctx.get(_GIVEN, type_hint=GivenGrants) or GivenGrants()
    if given not in kept.given:
        kept.given = [*kept.given, given][-MAX_GIVEN:]
        ctx.set(_GIVEN, kept)


@grants_given.handler(name="list", kind="shared", journal_retention=retention.NO_JOURNAL)
async def list_given(ctx: ObjectSharedContext) -> GivenGrants:
    """Where this approver's grants are kept, oldest first."""
    return await ctx.get(_GIVEN, type_hint=GivenGrants) or GivenGrants()
