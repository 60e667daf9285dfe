"""Render emails from the Jinja2 templates in `email_templates/` (autoescape on for HTML).

The templates are package data: the wheel carries the repo's top-level `email_templates/` as
`countersign/mail/email_templates/` (see pyproject.toml), and a source checkout reads the top-level folder.

Guarantee: rendering is a pure function of its inputs (no clock, no randomness, no network), so a
retried send renders byte-identical content for the same journaled values. The HTML part has its
stylesheet inlined into `style` attributes (mail clients drop `<style>` blocks) and no images.
Text that the agent or a tool call supplied can never pass for one of our own lines: in the text
part every line of it is indented under its label (`indent_text`, `arg_text`) or kept on its label's
line (`one_line`); in the HTML part it is escaped; in both, invisible formatting characters (bidi
overrides, zero-width) are shown as `[U+XXXX]` markers (`countersign.security.textsafety`).
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import css_inline
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from countersign.security.textsafety import finalize
from countersign.timewords import duration

MAX_SUBJECT = 180


def template_dir() -> Path:
    """The installed package's templates, else (running from a source checkout) the repo's folder."""
    packaged = Path(str(resources.files("countersign.mail") / "email_templates"))
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "email_templates"
    if checkout.is_dir():
        return checkout
    raise RuntimeError(f"email templates not found in {packaged} or {checkout}: a broken install")


@functools.cache
def environment() -> Environment:
    # auto_reload off: installed templates do not change under a running process (see countersign.web.views).
    env = Environment(
        loader=FileSystemLoader(template_dir()),
        auto_reload=False,
        autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=False),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=finalize,
    )
    env.filters["utc"] = format_utc
    env.filters["duration"] = duration
    env.filters["argvalue"] = format_arg
    env.filters["indent_text"] = indent_text
    env.filters["one_line"] = one_line
    env.globals["arg_text"] = arg_text
    return env


@functools.cache
def _inliner() -> css_inline.CSSInliner:
    return css_inline.CSSInliner(load_remote_stylesheets=False, keep_style_tags=False, keep_link_tags=False)


def format_utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M UTC")


def format_arg(value: Any) -> str:
    """One argument value as the approver should read it: strings verbatim, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def indent_text(value: str, prefix: str = "    ") -> str:
    """Indent every line of free text (an agent's reason, a goal) in the plain-text part, so it can
    never pass for one of our own lines, such as a link label."""
    return "\n".join(prefix + line for line in (value.splitlines() or [""]))


def one_line(value: str) -> str:
    """Free text kept on the line of its label in the plain-text part: each line break becomes a
    visible ` ↵ `, so the text cannot start a line of its own (a summary, a tool's name)."""
    return " ↵ ".join(value.splitlines())


def arg_text(name: str, value: Any, prefix: str = "    ") -> str:
    """One argument in the plain-text part: `name: value` on one line, or, for a value of several
    lines, `name:` followed by every line of the value behind `  | `, so no line of a value can
    start at the margin or pass for another argument, a fingerprint or a link label."""
    text = format_arg(value)
    lines = text.splitlines()
    if len(lines) <= 1 and text == "".join(lines):
        return f"{prefix}{one_line(name)}: {text}"
    quoted = "\n".join(f"{prefix}  | {line}" for line in lines)
    return f"{prefix}{one_line(name)}:\n{quoted}"


def render(name: str, **context: Any) -> tuple[str, str, str]:
    """(subject, text, html) of the template set `<name>.subject.txt`, `<name>.txt`, `<name>.html`."""
    env = environment()
    subject = " ".join(env.get_template(f"{name}.subject.txt").render(**context).split())
    if len(subject) > MAX_SUBJECT:
        subject = subject[: MAX_SUBJECT - 1].rstrip() + "…"
    text = env.get_template(f"{name}.txt").render(**context)
    html = _inliner().inline(env.get_template(f"{name}.html").render(**context))
    return subject, text, html
