"""Showing text that someone else wrote (the agent, a tool's arguments) without letting it lie about
the page or email around it.

Guarantee: `visible` leaves no invisible formatting character in its output. Every character of
Unicode category Cf (bidi embeddings, overrides and isolates U+202A-202E and U+2066-2069, the marks
U+200E, U+200F and U+061C, zero-width U+200B-200D, U+2060, U+FEFF, soft hyphens, tag characters)
becomes a visible marker such as `[U+202E]`, so text like "refund $12.00" cannot be made to read
backwards next to the real amount, and hidden characters show where they are. Everything else is
kept as is. `finalize` applies it to every value a Jinja template prints, for the approval pages
and both parts of every email.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from markupsafe import Markup

_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _mark(match: re.Match[str]) -> str:
    char = match.group(0)
    return f"[U+{ord(char):04X}]" if unicodedata.category(char) == "Cf" else char


def visible(text: str) -> str:
    """`text` with every format character (category Cf) replaced by `[U+XXXX]`."""
    if text.isascii():  # no Cf character is ASCII: the common case costs one scan
        return text
    return _NON_ASCII.sub(_mark, text)


def finalize(value: Any) -> Any:
    """Jinja's `finalize` hook: `visible` on every printed string, before autoescaping.

    A `Markup` value stays `Markup` (the marker holds no character HTML would treat specially); a
    `Verbatim` value is printed untouched (form fields, whose value must come back unchanged).
    """
    if isinstance(value, Verbatim):
        return str(value)
    if isinstance(value, Markup):
        # Already-safe HTML stays safe: `visible` only swaps characters for `[U+XXXX]`.
        return Markup(visible(str(value)))  # noqa: S704
    if isinstance(value, str):
        return visible(value)
    return value


class Verbatim(str):
    """A string printed exactly as is: the prefilled value of an edit field. Marking its characters
    there would make an untouched field come back changed (an edit nobody made); the same value is
    shown marked wherever it is displayed as text."""


def verbatim(value: Any) -> Verbatim:
    """The `verbatim` template filter: `value` (as Jinja would print it) exempt from `finalize`."""
    return Verbatim(value)
