"""What an approver changed in a long text (an email body) before approving, as a line diff.

Guarantee: pure and bounded (fields of at most a few thousand characters, the tool's own limit);
`changes` lists only editable text fields whose new value differs from the frozen one and that are
long (several lines, or longer than `LONG_TEXT`); `marker` binds a review to exactly the edits that
were shown, so an approval with other edits is reviewed again before it decides.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel

LONG_TEXT = 120
MAX_LINES = 400


class DiffLine(BaseModel):
    sign: Literal[" ", "-", "+"]
    text: str


class FieldChange(BaseModel):
    name: str
    lines: list[DiffLine]
    added: int
    removed: int


def normalized(value: str) -> str:
    """Browsers send a textarea's line breaks as CRLF; the frozen text has LF."""
    return value.replace("\r\n", "\n").replace("\r", "\n")


def _long(text: str) -> bool:
    return "\n" in text or len(text) > LONG_TEXT


def line_diff(before: str, after: str) -> list[DiffLine]:
    rows = []
    for line in difflib.ndiff(before.splitlines(), after.splitlines()):
        sign, text = line[:1], line[2:]
        if sign in (" ", "-", "+"):
            rows.append(DiffLine(sign=sign, text=text))  # type: ignore[arg-type]
    return rows[:MAX_LINES]


def changes(frozen: Mapping[str, Any], edits: Mapping[str, Any]) -> list[FieldChange]:
    """The long-text fields that `edits` change, each with its diff, in name order."""
    found = []
    for name in sorted(edits):
        old, new = frozen.get(name), edits[name]
        if not isinstance(old, str) or not isinstance(new, str) or old == new or not (_long(old) or _long(new)):
            continue
        lines = line_diff(old, new)
        added = sum(1 for r in lines if r.sign == "+")
        removed = sum(1 for r in lines if r.sign == "-")
        found.append(FieldChange(name=name, lines=lines, added=added, removed=removed))
    return found


def marker(edits: Mapping[str, str]) -> str:
    """A short fingerprint of exactly these edits: the review form carries it back."""
    canonical = json.dumps(dict(edits), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(b"countersign.review.v1\x00" + canonical.encode()).hexdigest()[:24]
