"""Rendering of the approval pages: templates, security headers, and dates in the pages' words.

Guarantee: every page goes out with the same hardening headers (no caching, no framing, a strict
CSP, same-origin referrers) and is rendered by Jinja2 with autoescape on, every printed value
passing through `textsafety.finalize` (bidi overrides and zero-width characters shown as
`[U+XXXX]`), except a prefilled form field marked `| verbatim`, whose value must come back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse

from countersign.security.textsafety import finalize, verbatim
from countersign.timewords import duration
from countersign.tools.policy import grant_choices
from countersign.web import wording

# auto_reload off: the templates ship with the package, and checking their mtimes on every page
# (and its base template) was a measurable share of a decision's handler CPU.
_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    auto_reload=False,
    autoescape=select_autoescape(default=True),
    finalize=finalize,
)
_TEMPLATES.filters["verbatim"] = verbatim
_TEMPLATES.filters["duration"] = duration
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    # same-origin, not no-referrer: with no-referrer Chromium sends `Origin: null` on our own form POST.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}


_TEMPLATES.globals["grant_choices"] = grant_choices


def page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = _TEMPLATES.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def notice(status: int, title: str, message: str, **extra: Any) -> HTMLResponse:
    extra.setdefault("hint", wording.notice_hint(status, message))
    return page("notice.html", status, title=title, message=message, **extra)


def when(timestamp: float | None) -> str:
    return "" if timestamp is None else wording.moment(timestamp).text


def remaining(deadline: float, now: float) -> str:
    return wording.deadline(deadline, now).relative


@dataclass(frozen=True)
class Failure:
    """Why a POST decided nothing that `Approval.submit` could say (a link that does not verify, a
    service that did not answer): the status, title and text the page shows. `unconfirmed`: a 5xx
    that may come after the decision was recorded (its answer was lost), so it claims neither."""

    status: int
    title: str
    text: str
    unconfirmed: bool = False
