"""Signed approval-link tokens.

Guarantee: a token names only where to look (run, action index, approver slot, round, expiry) and
carries no personal data. Its tag is two HMAC-SHA256 values of 128 bits each: a seal over the token's
own fields under the key id's secret, which tells without any lookup that one of our keys made the
link (`sealed`: a page waits for a record not saved yet only for such a link), and a binding over
those fields *and* the server-side record (tenant, approval id, approver, round nonce, action digest),
so a token is valid (`check`: both halves) only for the exact frozen action, person and round it was
minted for. Tags are compared in constant time. The binding's MAC key is a per-tenant subkey derived
from the key id's secret, so a token made for one tenant is refused for every other, and a component
given one tenant's subkey cannot mint links (the seal needs the secret itself).

Why not itsdangerous: it signs only what the token carries. Binding the digest, tenant and approver
without putting them (or personal data) in the URL needs the record's values in the MAC input; and
its key rotation tries every key in turn, where a key id says which one to use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
from dataclasses import dataclass
from typing import Literal

from countersign.contract import ApprovalRecord

VERSION = "v1"
_DOMAIN = b"countersign.approval-link.v1\x00"
_CSRF_DOMAIN = b"countersign.csrf.v1\x00"
_TENANT_DOMAIN = b"countersign.tenant-key.v1\x00"
_INBOX_DOMAIN = b"countersign.inbox.v1\x00"
_GRANT_DOMAIN = b"countersign.grant.v1\x00"
_SEAL_DOMAIN = b"countersign.approval-link-seal.v1\x00"
_HALF = 16
INBOX_LINK_DAYS = 30
_MAX_TOKEN = 400
_KID = re.compile(r"^[A-Za-z0-9]{1,16}$")
_B64 = re.compile(r"^[A-Za-z0-9_-]+$")
MAX_RUN_ID = 128
RUN_ID = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MAX_RUN_ID - 1}}}\Z")
_DIGITS = 12
"""The most digits of a number a link carries (index, slot, round, expiry)."""
MAX_INDEX = 10**_DIGITS - 1
"""The highest action index a link can carry: an approval placed higher could never be decided."""
# One spelling per number: without this `~00~` and `~0~` carry the same claims (and so the same tag),
# giving one approval several valid token strings (and idempotency keys, and audit handles).
_CANONICAL_INT = re.compile(rf"0|[1-9][0-9]{{0,{_DIGITS - 1}}}")
_CANONICAL_MILLIS = re.compile(r"0|[1-9][0-9]{0,15}")


class LinkInvalid(Exception):
    """Why a token was refused. `reason` is safe to show; it never echoes the token."""

    def __init__(self, reason: str, *, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class LinkClaims:
    kid: str
    run_id: str
    index: int
    slot: int
    round: int
    exp: int


def placement_problem(run_id: object, index: object) -> str | None:
    """Why a link could not carry this run id and action index (None: it can). Asked before an
    approval is placed, since a link that `parse` refuses can never decide it."""
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        shown = repr(run_id[:80]) if isinstance(run_id, str) else type(run_id).__name__
        return f"run_id {shown} must be 1-{MAX_RUN_ID} characters of A-Z a-z 0-9 . _ : -, the first a letter or digit"
    if isinstance(index, bool) or not isinstance(index, int):
        return f"index must be a whole number, not {type(index).__name__}"
    if not 0 <= index <= MAX_INDEX:  # not echoed: a huge int may not even convert to text
        return f"index must be from 0 to {MAX_INDEX}: an approval link carries no more"
    return None


def approval_id(run_id: str, index: int) -> str:
    return f"{run_id}-a{index}"


def mint(record: ApprovalRecord, slot: int, keys: dict[str, bytes], kid: str) -> str:
    claims = LinkClaims(kid, record.run_id, record.index, slot, record.round, expiry(record))
    body = f"{claims.run_id}~{claims.index}~{claims.slot}~{claims.round}~{claims.exp}".encode()
    head = f"{VERSION}.{kid}.{_b64(body)}"
    return f"{head}.{_b64(_seal(head, keys[kid]) + _tag(claims, record, keys[kid])[:_HALF])}"


def expiry(record: ApprovalRecord) -> int:
    return math.ceil(record.deadline)


def parse(token: str) -> LinkClaims:
    """Strict structural parse, before any lookup. Raises LinkInvalid (400) on anything odd."""
    malformed = LinkInvalid("This link is malformed.", status=400)
    if len(token) > _MAX_TOKEN:
        raise malformed
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION or not _KID.match(parts[1]):
        raise malformed
    if not _B64.match(parts[2]) or not _B64.match(parts[3]):
        raise malformed
    try:
        fields = _unb64(parts[2]).decode("ascii").split("~")
        if len(fields) != 5 or len(_unb64(parts[3])) != 32:
            raise malformed
        run_id = fields[0]
        numbers = [int(f) for f in fields[1:] if _CANONICAL_INT.fullmatch(f)]
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise malformed from exc
    if not RUN_ID.match(run_id) or len(numbers) != 4:
        raise malformed
    index, slot, round_, exp = numbers
    return LinkClaims(parts[1], run_id, index, slot, round_, exp)


LinkState = Literal["valid", "expired", "replaced"]


def check(token: str, record: ApprovalRecord, keys: dict[str, bytes], now: float) -> tuple[LinkClaims, LinkState]:
    """Authenticate the token against the record it points to.

    Raises LinkInvalid unless the tag verifies (an older round's token verifies against that
    round's nonce). An authentic token may still be "replaced" (a newer round exists) or "expired";
    callers decide what to show, e.g. "already decided".
    """
    claims = parse(token)
    key = keys.get(claims.kid)
    invalid = LinkInvalid("This link is not valid.")
    if key is None or claims.index != record.index or claims.slot >= len(record.approvers):
        raise invalid
    if not 1 <= claims.round <= record.round:
        raise invalid
    head, _, tag = token.rpartition(".")
    bound = _tag(claims, record, key)
    # A link minted before tags were sealed carries the whole binding instead: it stays valid (its
    # approval may be waiting for days), it only gets no setup wait (its record was saved long ago).
    if not (
        hmac.compare_digest(_unb64(tag), _seal(head, key) + bound[:_HALF]) or hmac.compare_digest(_unb64(tag), bound)
    ):
        raise invalid
    if claims.round < record.round:
        return claims, "replaced"
    if claims.exp != expiry(record) or claims.slot not in record.active_slots:
        raise invalid
    return claims, "expired" if now >= expiry(record) else "valid"


def sealed(token: str, keys: dict[str, bytes]) -> bool:
    """Whether one of `keys` made this token, told from the token alone (its seal), without the record
    `check` needs: whether it fits a record (and is still valid) is `check`'s to say."""
    try:
        claims = parse(token)
    except LinkInvalid:
        return False
    key = keys.get(claims.kid)
    head, _, tag = token.rpartition(".")
    return key is not None and hmac.compare_digest(_unb64(tag)[:_HALF], _seal(head, key))


@dataclass(frozen=True)
class InboxClaims:
    approver: str
    issued_ms: int
    """When the link was made (ms since the epoch): a revocation refuses every link made before it."""
    exp: int


def inbox_token(approver: str, keys: dict[str, bytes], kid: str, exp: int, *, issued_ms: int | None = None) -> str:
    """A link to an approver's own inbox page. Unlike approval links it must name the person.

    `issued_ms` defaults to the start of its INBOX_LINK_DAYS, the earliest a link with this expiry
    could have been made."""
    issued = (exp - INBOX_LINK_DAYS * 86400) * 1000 if issued_ms is None else issued_ms
    body = f"{approver}~{issued}~{exp}".encode()
    tag = hmac.new(keys[kid], _INBOX_DOMAIN + body, hashlib.sha256).digest()
    return f"{VERSION}.{kid}.{_b64(body)}.{_b64(tag)}"


def check_inbox_token(token: str, keys: dict[str, bytes], now: float) -> str:
    """The approver an inbox token names; LinkInvalid if forged, malformed or expired."""
    return inbox_claims(token, keys, now).approver


def inbox_claims(token: str, keys: dict[str, bytes], now: float) -> InboxClaims:
    """What an authentic, unexpired inbox token says; LinkInvalid otherwise. Whether the approver has
    revoked their links since `issued_ms` is for the caller to check (it lives in `ApprovalInbox`)."""
    body = _signed_body(token, keys, _INBOX_DOMAIN)
    try:
        fields = body.decode().rsplit("~", 2)
    except UnicodeDecodeError as exc:
        raise LinkInvalid("This link is not valid.") from exc
    if len(fields) == 3 and _CANONICAL_MILLIS.fullmatch(fields[1]):
        approver, issued, exp = fields[0], int(fields[1]), fields[2]
    else:  # made before links carried their issue time: `approver~exp`
        approver, _, exp = body.decode().rpartition("~")
        issued = None
    if not _CANONICAL_INT.fullmatch(exp) or now >= int(exp):
        raise LinkInvalid("This inbox link has expired; open a newer approval email.", status=410)
    issued_ms = (int(exp) - INBOX_LINK_DAYS * 86400) * 1000 if issued is None else issued
    return InboxClaims(approver, issued_ms, int(exp))


def grant_token(grant_key: str, grant_id: str, keys: dict[str, bytes], kid: str, exp: int) -> str:
    """A link to revoke one standing approval (`grant_id`, kept under `grant_key`) until `exp`."""
    body = f"{grant_key}~{grant_id}~{exp}".encode()
    tag = hmac.new(keys[kid], _GRANT_DOMAIN + body, hashlib.sha256).digest()
    return f"{VERSION}.{kid}.{_b64(body)}.{_b64(tag)}"


def grant_claims(token: str, keys: dict[str, bytes], now: float) -> tuple[str, str]:
    """(grant key, grant id) of an authentic, unexpired grant link; LinkInvalid otherwise."""
    body = _signed_body(token, keys, _GRANT_DOMAIN)
    try:
        key, grant_id, exp = body.decode().rsplit("~", 2)
    except (UnicodeDecodeError, ValueError) as exc:
        raise LinkInvalid("This link is not valid.") from exc
    if not _CANONICAL_INT.fullmatch(exp) or now >= int(exp):
        raise LinkInvalid("This link has expired, and so has the standing approval it was for.", status=410)
    return key, grant_id


def _signed_body(token: str, keys: dict[str, bytes], domain: bytes) -> bytes:
    """The body of an authentic `v1.<kid>.<body>.<tag>` token signed for `domain`; LinkInvalid otherwise."""
    invalid = LinkInvalid("This link is not valid.")
    parts = token.split(".")
    if len(token) > _MAX_TOKEN or len(parts) != 4 or parts[0] != VERSION or parts[1] not in keys:
        raise invalid
    try:
        body, tag = _unb64(parts[2]), _unb64(parts[3])
    except (binascii.Error, ValueError) as exc:
        raise invalid from exc
    if not hmac.compare_digest(tag, hmac.new(keys[parts[1]], domain + body, hashlib.sha256).digest()):
        raise invalid
    return body


def csrf_token(token: str, keys: dict[str, bytes], kid: str) -> str:
    return _b64(hmac.new(keys[kid], _CSRF_DOMAIN + token.encode(), hashlib.sha256).digest())


def csrf_ok(token: str, supplied: str, keys: dict[str, bytes]) -> bool:
    # Bytes, not str: compare_digest raises on non-ASCII text, and the form value is anyone's input.
    given = supplied.encode("utf-8", errors="replace")
    return any(hmac.compare_digest(csrf_token(token, keys, kid).encode(), given) for kid in keys)


def token_fingerprint(token: str) -> str:
    """A non-reversible handle for a token, for idempotency keys and logs."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def tenant_key(secret: bytes, tenant: str) -> bytes:
    """The tenant's own MAC key: HMAC-SHA256(secret, domain | tenant)."""
    return hmac.new(secret, _TENANT_DOMAIN + tenant.encode(), hashlib.sha256).digest()


def _seal(head: str, secret: bytes) -> bytes:
    """The tag's first half: `version.kid.body` under the key id's secret (no record, no tenant)."""
    return hmac.new(secret, _SEAL_DOMAIN + head.encode(), hashlib.sha256).digest()[:_HALF]


def _tag(claims: LinkClaims, record: ApprovalRecord, secret: bytes) -> bytes:
    approver = record.approvers[claims.slot] if claims.slot < len(record.approvers) else ""
    message = json.dumps(
        {
            "v": VERSION,
            "kid": claims.kid,
            "tenant": record.tenant,
            "run": claims.run_id,
            "approval": record.approval_id,
            "index": claims.index,
            "approver": approver,
            "slot": claims.slot,
            "round": claims.round,
            "nonce": record.nonces[claims.round - 1],
            "digest": record.digest,
            "exp": claims.exp,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return hmac.new(tenant_key(secret, record.tenant), _DOMAIN + message, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Decode unpadded base64url, refusing non-canonical spellings (one token, one string)."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise binascii.Error("non-canonical base64")
    return raw
