"""Rendering of the approval pages: templates, security headers and date wording.

Guarantee: every page goes out with the same hardening headers (no caching, no framing, a strict
CSP, same-origin referrers) and is rendered by Jinja2 with autoescape on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse

_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape(default=True)
)
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


def page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = _TEMPLATES.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def notice(status: int, title: str, message: str, **extra: Any) -> HTMLResponse:
    return page("notice.html", status, title=title, message=message, **extra)


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return ""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def remaining(deadline: float, now: float) -> str:
    seconds = int(deadline - now)
    if seconds <= 0:
        return "now"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"in {days} d {hours} h"
    if hours:
        return f"in {hours} h {minutes} min"
    return f"in {max(minutes, 1)} min"
