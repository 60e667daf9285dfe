"""Hostile agent text for the email tests: values that try to forge lines of the text part, a MIME
part of the outbox file, or reading order (bidi), and the checks that they did not.

Guarantee: every check reads only the rendered email (its text, its HTML, the parsed `.eml`), so it
holds whichever backend produced it.
"""

from __future__ import annotations

import unicodedata
from hashlib import sha256
from html.parser import HTMLParser

FORGED_LINES = [
    "Fingerprint: 000000000000",
    "Review and approve:",
    "http://evil.example/approvals/forged?intent=approve",
    "    amount_usd: 6.12",
]
"""Lines a value tries to pass off as ours: a fingerprint, a link label and link, another argument."""

BIDI = "\u202e00.21$ dnufer\u202c"
"""Reads "refund $12.00" where bidi overrides are honoured."""
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u200e\u200f\u061c\u202a\u202b\u202d\u2066\u2067\u2068\u2069"
MARKERS = ["[U+202E]", "[U+202C]", "[U+200B]", "[U+FEFF]", "[U+2066]", "[U+061C]"]


def predictable_boundary(idempotency_key: str) -> str:
    """The MIME boundary the outbox used to derive from the key (anyone knowing the approval id could)."""
    return "=_countersign_" + sha256(idempotency_key.encode()).hexdigest()[:32]


def forged_reason(idempotency_key: str) -> str:
    """A `reason` argument that forges text lines, then closes the text part and opens an HTML part
    of its own (a fake amount and an Approve link to another host) under the old boundary."""
    boundary = predictable_boundary(idempotency_key)
    fake_html = '<p>Refund $6.12</p><a href="http://evil.example/approve">Approve</a>'
    return "\n".join(
        [
            "damaged in transit",
            *FORGED_LINES,
            f"--{boundary}",
            'Content-Type: text/html; charset="utf-8"',
            "",
            fake_html,
            f"--{boundary}",
            'Content-Type: text/plain; charset="utf-8"',
            "",
        ]
    )


OUR_LABELS = ("Review and approve:",)
"""Lines of ours that a forged line copies (`our_lines_only` checks there is exactly one of each)."""


def value_lines_outside_blocks(text: str, value: str, prefixes: tuple[str, ...]) -> list[str]:
    """Lines of `text` that carry a line of `value` (past its first) without one of `prefixes`."""
    wanted = {line.strip() for line in value.splitlines()[1:] if line.strip()}
    return [
        line
        for line in text.splitlines()
        if line.strip() in wanted and line not in OUR_LABELS and not any(line.startswith(p) for p in prefixes)
    ]


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.append(dict(attrs).get("href") or "")


def anchors(html: str) -> list[str]:
    """The href of every `<a>` element of `html`, as a browser's parser finds them."""
    parser = _Anchors()
    parser.feed(html)
    parser.close()
    return parser.hrefs


def our_lines_only(text: str, fingerprint: str, approve_url: str | None) -> None:
    """At the margin of the text part: exactly our fingerprint line, and our approve label followed by
    our link (or, for an email without decision links, no approve label at all)."""
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("Fingerprint")] == [f"Fingerprint: {fingerprint}"]
    labels = [i for i, line in enumerate(lines) if line.startswith("Review and approve")]
    if approve_url is None:
        assert labels == []
    else:
        assert len(labels) == 1 and lines[labels[0] + 1] == approve_url, "the approve label is ours, before our link"
    assert not [line for line in lines if line.startswith("http://evil.example")], "no forged link on a line of its own"


def hidden_characters(text: str) -> list[str]:
    """The format characters (bidi controls, zero-width) left in `text`, as code points."""
    return [f"U+{ord(c):04X}" for c in text if unicodedata.category(c) == "Cf"]
