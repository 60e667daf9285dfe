"""Acting as an approver in tests: find the email in the outbox, open its link, press a button.

Guarantee: every step goes through the real artefacts (the `.eml` file, the HTTP page, its form),
and every wait is a bounded poll.
"""

from __future__ import annotations

import email
import email.policy
import re
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import httpx

from support.processes import AppServer, wait_until

LINK = re.compile(r"https?://\S+/approvals/[A-Za-z0-9._~-]+")
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
INBOX = re.compile(r"https?://\S+/inbox/([A-Za-z0-9._~-]+)")
"""An inbox link in an email's text; its group is the inbox token."""


@dataclass
class ApprovalEmail:
    path: Path
    message: EmailMessage

    @property
    def text(self) -> str:
        part = self.message.get_body(("plain",))
        assert part is not None
        return str(part.get_content())

    @property
    def html(self) -> str:
        part = self.message.get_body(("html",))
        assert part is not None
        return str(part.get_content())

    @property
    def link(self) -> str:
        """The page link (without the ?intent hint)."""
        found = LINK.findall(self.text)
        assert found, "no approval link in the email text"
        return str(found[0])


def read_email(path: Path) -> ApprovalEmail:
    message = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return ApprovalEmail(path, message)


def approval_emails(outbox: Path, run_id: str, kind: str = "request") -> list[ApprovalEmail]:
    """The outbox emails of one kind (request, reminder, escalation, reapproval, batch) for a run."""
    return [read_email(path) for path in sorted(outbox.glob(f"approval-{kind}_{run_id}-a*.eml"))]


def requests_about(outbox: Path, words: str) -> list[ApprovalEmail]:
    """The approval request emails of any run whose text mentions `words` (a run whose id a test
    cannot know, as an agent framework's own)."""
    mails = (read_email(path) for path in sorted(outbox.glob("approval-request_*.eml")))
    return [mail for mail in mails if words in mail.text]


def wait_for_email(
    outbox: Path, run_id: str, count: int = 1, timeout: float = 20, kind: str = "request"
) -> list[ApprovalEmail]:
    def ready() -> list[ApprovalEmail] | None:
        mails = approval_emails(outbox, run_id, kind)
        return mails if len(mails) >= count else None

    return wait_until(ready, timeout, f"{count} approval {kind} email(s) for {run_id}")


def open_page(link: str) -> httpx.Response:
    return httpx.get(link, timeout=30)


def form_csrf(link: str) -> str:
    """The CSRF value of the page's form (the page must still be asking for a decision)."""
    page = open_page(link)
    match = CSRF.search(page.text)
    assert match, f"no form on the page (status {page.status_code})"
    return match.group(1)


def form_after_restart(link: str, timeout: float = 30) -> str:
    """The page's CSRF value once the page asks for a decision again after a restart of the handler.

    An approval whose email went out just before a kill is saved by its workflow when Restate next
    retries it, after the restarted handler is up (seconds of backoff). Until then its page answers
    503 "still being set up, try again" (every 503 of the pages says "try again"), and an approver
    does as it says; any other page without a form fails at once."""

    def ready() -> str | None:
        page = open_page(link)
        match = CSRF.search(page.text)
        if match:
            return match.group(1)
        assert page.status_code == 503, f"no form on the page (status {page.status_code})"
        return None

    return wait_until(ready, timeout, "the approval's page to ask again", interval=0.5)


def submit_form(link: str, fields: dict[str, str]) -> httpx.Response:
    """POST a page's own form (`fields` and the page's CSRF value) as a browser on that page would."""
    parts = urlsplit(link)
    headers = {"Origin": f"{parts.scheme}://{parts.netloc}"}
    return httpx.post(link, data={"csrf": form_csrf(link), **fields}, headers=headers, timeout=30)


def answer_question(
    link: str, values: dict[str, str], verdict: str = "approve", reason: str = "", *, csrf: str | None = None
) -> httpx.Response:
    """POST a question's form as a browser would (same Origin, the page's CSRF value unless given);
    a checkbox (`notify`) sends its hidden empty value and then `on` when ticked, as the page's form does."""
    parts = urlsplit(link)
    csrf = form_csrf(link) if csrf is None else csrf
    data: list[tuple[str, str]] = [("csrf", csrf), ("verdict", verdict), ("reason", reason)]
    for name, value in values.items():
        if name == "notify":
            data.append(("edit.notify", ""))
        data.append((f"edit.{name}", value))
    headers = {"Origin": f"{parts.scheme}://{parts.netloc}", "Content-Type": "application/x-www-form-urlencoded"}
    return httpx.post(link, content=urlencode(data), headers=headers, timeout=30)


def submit(
    link: str,
    verdict: str,
    reason: str = "",
    *,
    csrf: str | None = None,
    origin: str | None = None,
    confirm: str | None = None,
    edits: dict[str, str] | None = None,
    grant: str | None = None,
) -> httpx.Response:
    """POST the page's form as a browser would (same Origin, the page's CSRF value unless given;
    `confirm` is what a person types into a high-stakes page's confirmation field, `edits` the
    editable fields the person changed, `grant` the standing approval's seconds they picked)."""
    csrf = form_csrf(link) if csrf is None else csrf
    parts = urlsplit(link)
    headers = {"Origin": origin if origin is not None else f"{parts.scheme}://{parts.netloc}"}
    data = {"csrf": csrf, "verdict": verdict, "reason": reason}
    if confirm is not None:
        data["confirm"] = confirm
    if grant is not None:
        data["grant"] = grant
    data.update({f"edit.{name}": value for name, value in (edits or {}).items()})
    return httpx.post(link, data=data, headers=headers, timeout=30)


def deployment_keys(app_server: AppServer) -> dict[str, bytes]:
    """The keys the app signs links with (the test environment's first `kid:secret`), to make a link
    or a CSRF value of the deployment's own in a test."""
    kid, _, secret = app_server.env["APPROVALS_SIGNING_KEYS"].split(",")[0].partition(":")
    return {kid: secret.encode()}
