"""The intents an email can carry out, the idempotency key of each, and its provider tags.

Guarantee: one intent (kind, approval, round, recipient slot, and the reminder number or outcome)
maps to exactly one key, and different intents never share a key; keys stay within Resend's
256 characters. Tag values are reversible, so a webhook names the approval and run exactly even
when ids hold characters Resend does not allow in tags.
"""

from __future__ import annotations

import base64
import re
from typing import Literal

MessageKind = Literal["request", "reminder", "escalation", "reapproval", "batch", "outcome", "receipt", "grant"]
APPROVER_KINDS: frozenset[MessageKind] = frozenset({"request", "reminder", "escalation", "reapproval", "batch"})
"""The kinds that carry decision links: if one of these bounces, the approver cannot decide."""

_PLAIN_TAG = re.compile(r"^[A-Za-z0-9-]{1,256}$")


def intent_key(kind: MessageKind, approval_id: str, round_: int, part: str) -> str:
    """`approval-<kind>/<approval id>/r<round>/<part>`, e.g. `approval-request/run-1-a0/r1/s0`."""
    return f"approval-{kind}/{approval_id}/r{round_}/{part}"


def tag_value(value: str) -> str:
    """A Resend tag value for `value`: as is when only letters, digits and dashes; else `_` + base32."""
    if _PLAIN_TAG.match(value):
        return value
    return "_" + base64.b32encode(value.encode()).decode().rstrip("=").lower()


def from_tag_value(tag: str) -> str:
    """The inverse of `tag_value`; raises ValueError on a value `tag_value` cannot have produced."""
    if not tag.startswith("_"):
        if not _PLAIN_TAG.match(tag):
            raise ValueError("not a tag value")
        return tag
    body = tag[1:].upper()
    try:
        return base64.b32decode(body + "=" * (-len(body) % 8)).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("not a tag value") from exc


def tags_for(kind: MessageKind, run_id: str, approval_id: str, round_: int, slot: int | None) -> dict[str, str]:
    tags = {"kind": kind, "run_id": tag_value(run_id), "approval_id": tag_value(approval_id), "round": str(round_)}
    if slot is not None:
        tags["slot"] = str(slot)
    return tags
