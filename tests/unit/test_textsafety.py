"""Unit tests: hidden formatting characters are shown as markers wherever agent text is printed, on
the approval page as in the email, and a prefilled edit field still comes back unchanged."""

from __future__ import annotations

import re
import time

from markupsafe import Markup
from support.injection import BIDI, INVISIBLE, hidden_characters
from support.records import approval_record

from countersign.security.textsafety import finalize, visible
from countersign.web import wording
from countersign.web.views import page


def test_every_bidi_and_zero_width_character_becomes_a_visible_marker() -> None:
    for char in INVISIBLE + "\u202e\u202c\u00ad\U000e0041":
        assert visible(f"a{char}b") == f"a[U+{ord(char):04X}]b"
    assert visible("refund " + BIDI) == "refund [U+202E]00.21$ dnufer[U+202C]"
    kept = "Ünïcode, 日本語, emoji 🙂, tab\tand\nnewline, « quotes »"
    assert visible(kept) == kept, "only format characters change"


def test_finalize_keeps_markup_safe_and_other_values_as_they_are() -> None:
    marked = finalize(Markup("<b>x\u200by</b>"))
    assert isinstance(marked, Markup) and marked == "<b>x[U+200B]y</b>"
    assert finalize(1042) == 1042 and finalize(None) is None


def test_the_confirm_page_marks_agent_text_but_not_the_edit_fields_value() -> None:
    subject = f"Your refund {BIDI}"
    record = approval_record(
        tool="email_customer",
        args={"customer_id": 7, "subject": subject, "body": f"Hello{INVISIBLE}"},
        summary=f"Email customer 7: {subject!r}",
        why=f"They asked {BIDI}",
        editable={"subject": "any text", "body": "any text"},
        requested_at=time.time(),
        round_started_at=time.time(),
        deadline=time.time() + 3600,
    )
    body = page(
        "confirm.html",
        record=record,
        approver="a@example.com",
        goal=f"goal {BIDI}",
        intent="",
        csrf="c",
        confirm_label="",
        confirm_value="",
        deadline=wording.deadline(record.deadline, time.time()),
        requested=wording.moment(record.requested_at),
        fingerprint=record.digest[:12],
    ).body
    assert isinstance(body, bytes)
    html = body.decode()
    fields = re.findall(r'<input id="edit-subject" name="edit.subject" value="([^"]*)"', html)
    assert fields == [subject], "an untouched field must come back unchanged, so it is printed verbatim"
    assert f">Hello{INVISIBLE}</textarea>" in html
    outside = html.replace(fields[0], "").replace(f"Hello{INVISIBLE}", "")
    assert hidden_characters(outside) == []
    assert "They asked [U+202E]00.21$ dnufer[U+202C]" in html and "goal [U+202E]" in html
    assert "<td>Your refund [U+202E]00.21$ dnufer[U+202C]</td>" in html
