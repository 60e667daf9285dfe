"""The page audits themselves: each must flag what it claims to catch, or the page tests prove nothing."""

from __future__ import annotations

from browser.audits import horizontal_overflow, low_contrast_text, text_smaller_than, unlabelled_controls
from browser.conftest import PHONE, ContextFactory

BAD = """<!doctype html><html lang="en"><meta name="viewport" content="width=device-width, initial-scale=1">
<body style="margin:0;background:#fff">
<p style="color:#aaa">faint grey on white</p>
<p style="color:#fff;background:#166534">white on green</p>
<p style="font-size:10px">tiny print</p>
<div style="width:600px">too wide for a phone</div>
<textarea name="note"></textarea><button aria-label="Close"></button><button></button>
<label for="ok">Named</label><input id="ok">
</body></html>"""


def test_audits_flag_faint_tiny_wide_and_unlabelled(new_context: ContextFactory) -> None:
    phone = new_context(**PHONE)
    page = phone.new_page()
    page.set_content(BAD)
    assert horizontal_overflow(page) == 600 - 390
    assert [line.split(":")[1].strip() for line in low_contrast_text(page)] == ["faint grey on white"]
    assert text_smaller_than(page, 12) == ["P 10px: tiny print"]
    unlabelled = unlabelled_controls(page)
    assert len(unlabelled) == 2 and unlabelled[0].startswith("<textarea") and unlabelled[1] == "<button></button>"

    page = phone.new_page()
    page.set_content("<!doctype html><p>no viewport meta: a phone lays this out 980 px wide and shrinks it</p>")
    assert horizontal_overflow(page) == 980 - 390
