"""Typed confirmation of high-stakes approvals: the approver retypes the amount, the id or the fingerprint.

Guarantee: a high-stakes approval counts only when the typed text equals the value that will run
(the edited value when the approver edited that field), compared as a number when it is one; the
expected value never appears in an error message, because error text is stored unencrypted.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from countersign.contract import ApprovalRecord
from countersign.tools.policy import PolicyVerdict
from countersign.tools.registry import Tool

FINGERPRINT = "fingerprint"
FINGERPRINT_LENGTH = 12
REFUSAL = "This is a high-stakes action: type the value shown on the page to confirm it. Nothing was decided."
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def field_for(tool: Tool, verdict: PolicyVerdict) -> str | None:
    """What the approver must retype for this call: None unless the policy found it high-stakes."""
    return (tool.confirm_field or FINGERPRINT) if verdict.high_stakes else None


def expected(record: ApprovalRecord, edits: Mapping[str, Any] | None = None) -> str | None:
    field = record.confirm_field
    if field is None:
        return None
    if field == FINGERPRINT:
        return record.digest[:FINGERPRINT_LENGTH]
    if edits and field in edits:
        return str(edits[field])
    return str(record.args.get(field, ""))


def label(record: ApprovalRecord) -> str:
    return (record.confirm_field or "").replace("_", " ")


def matches(typed: str, want: str) -> bool:
    given, wanted = _normal(typed), _normal(want)
    if _NUMBER.match(wanted):
        return bool(_NUMBER.match(given)) and Decimal(given) == Decimal(wanted)
    return hmac.compare_digest(given.casefold().encode(errors="replace"), wanted.casefold().encode(errors="replace"))


def _normal(text: str) -> str:
    text = text.strip()
    number = text.removeprefix("$").replace(",", "").strip()
    return number if _NUMBER.match(number) else text
