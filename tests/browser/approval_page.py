"""Acting as an approver in a real browser: open the email's HTML part, follow its button, use the page.

Guarantee: every step is what a person does (load the email, click, type, press keys) in Chromium;
nothing here posts a form or sets a header itself, so the server sees exactly what a browser sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import BrowserContext, Locator, Page
from support.approver import ApprovalEmail


@dataclass(frozen=True)
class Submitted:
    """The browser's own POST of the form: the answer's status and the headers Chromium chose."""

    status: int
    origin: str | None
    fetch_site: str | None


def open_email(context: BrowserContext, mail: ApprovalEmail, folder: Path) -> Page:
    """The email's HTML part, written to a file and opened as a mail client's viewer would show it."""
    path = folder / f"{mail.path.stem}.html"
    path.write_text(mail.html, encoding="utf-8")
    page = context.new_page()
    page.goto(path.as_uri())
    return page


class ApprovalPage:
    """The confirmation page (and, after a submit, the page that answered it)."""

    def __init__(self, page: Page) -> None:
        self.page = page

    @classmethod
    def open(cls, context: BrowserContext, link: str) -> ApprovalPage:
        page = context.new_page()
        page.goto(link)
        return cls(page)

    @classmethod
    def from_email(cls, email_page: Page, button: str) -> ApprovalPage:
        """Click one of the email's buttons ("Review and approve" / "Review and reject")."""
        with email_page.expect_navigation():
            email_page.get_by_role("link", name=button).click()
        return cls(email_page)

    @property
    def heading(self) -> Locator:
        return self.page.get_by_role("heading", level=1)

    @property
    def approve_button(self) -> Locator:
        return self.page.get_by_role("button", name="Approve", exact=True)

    @property
    def reject_button(self) -> Locator:
        return self.page.get_by_role("button", name="Reject", exact=True)

    @property
    def reason_box(self) -> Locator:
        return self.page.get_by_label("Reason")

    def text(self) -> str:
        return self.page.inner_text("body")

    def approve(self) -> Submitted:
        return self.submit(self.approve_button.click)

    def reject(self, reason: str) -> Submitted:
        self.reason_box.fill(reason)
        return self.submit(self.reject_button.click)

    def edit_field(self, argument: str) -> Locator:
        """The field that changes `argument` before approving, found by its label as a person would."""
        return self.page.get_by_label(f"Change {argument}")

    def edit(self, argument: str, value: str) -> None:
        self.edit_field(argument).fill(value)

    def submit(self, act: Callable[[], None]) -> Submitted:
        """Do `act` (a click or a key press) and wait for the page the form's POST answered with."""
        with self.page.expect_response(lambda r: r.request.method == "POST") as answer:
            act()
        response = answer.value
        self.page.wait_for_load_state("load")
        headers = response.request.all_headers()
        return Submitted(response.status, headers.get("origin"), headers.get("sec-fetch-site"))

    def tab_to(self, target: Locator, *, limit: int = 15) -> int:
        """Press Tab until `target` has focus; returns how many presses it took (fails past `limit`)."""
        handle = target.element_handle()
        for presses in range(1, limit + 1):
            self.page.keyboard.press("Tab")
            if self.page.evaluate("(el) => document.activeElement === el", handle):
                return presses
        raise AssertionError(f"Tab never reached {target} in {limit} presses")

    def focus_ring(self) -> tuple[str, float]:
        """Outline style and width (px) of the focused element, as the browser draws them."""
        style, width = self.page.evaluate(
            "() => { const s = getComputedStyle(document.activeElement);"
            " return [s.outlineStyle, parseFloat(s.outlineWidth)]; }"
        )
        return str(style), float(width)

    def screenshot(self, folder: Path, name: str, *, full_page: bool = True) -> Path:
        path = folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path
