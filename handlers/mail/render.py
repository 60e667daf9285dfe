"""Render emails from the Jinja2 templates in `email_templates/` (autoescape on for HTML).

Guarantee: rendering is a pure function of its inputs (no clock, no randomness), so a retried
send renders byte-identical content for the same journaled values.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "email_templates"


@functools.cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATE_DIR),
        autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=False),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["utc"] = format_utc
    return env


def format_utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M UTC")


def render(name: str, **context: Any) -> tuple[str, str, str]:
    """(subject, text, html) of the template set `<name>.subject.txt`, `<name>.txt`, `<name>.html`."""
    env = environment()
    subject = env.get_template(f"{name}.subject.txt").render(**context).strip()
    text = env.get_template(f"{name}.txt").render(**context)
    html = env.get_template(f"{name}.html").render(**context)
    return " ".join(subject.split()), text, html
