"""The pictures in the documentation, taken from the real thing: the approval email, and the
confirmation page its button opens, on a desktop and on a phone.

They go to the browser tests' screenshot folder; with DOCS_SCREENSHOTS=1 to docs/images/ instead,
which is how the committed pictures are refreshed:

    DOCS_SCREENSHOTS=1 .venv/bin/python -m pytest -p no:cacheprovider tests/browser/test_docs_screenshots.py
"""

from __future__ import annotations

import os
from pathlib import Path

from support.processes import REPO

from browser.approval_page import ApprovalPage, open_email
from browser.conftest import PHONE, ContextFactory, RefundStarter

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_docs_pictures_of_the_email_and_the_page(
    new_context: ContextFactory, screenshots: Path, tmp_path: Path, pending_refund: RefundStarter
) -> None:
    folder = REPO / "docs" / "images" if os.environ.get("DOCS_SCREENSHOTS") == "1" else screenshots
    refund = pending_refund()
    desktop = new_context(viewport={"width": 1100, "height": 900})
    email = open_email(desktop, refund.mail, tmp_path)
    email.screenshot(path=str(folder / "approval-email.png"), full_page=True)
    page = ApprovalPage.from_email(email, "Review and approve")
    assert page.heading.inner_text() == refund.summary
    page.screenshot(folder, "approval-page-desktop")

    phone = ApprovalPage.open(new_context(**PHONE), refund.mail.link)
    assert phone.heading.inner_text() == refund.summary
    phone.screenshot(folder, "approval-page-phone")

    for name in ("approval-email", "approval-page-desktop", "approval-page-phone"):
        assert (folder / f"{name}.png").read_bytes().startswith(PNG), name
