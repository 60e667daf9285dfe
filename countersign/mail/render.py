"""Render emails from the Jinja2 templates in `email_templates/` (autoescape on for HTML).

The templates are package data: the wheel carries the repo's top-level `email_templates/` as
`countersign/mail/email_templates/` (see pyproject.toml), and a source checkout reads the top-level folder.

Guarantee: rendering is a pure function of its inputs (no clock, no randomness, no network), so a
retried send renders byte-identical content for the same journaled values. The HTML part has its
stylesheet inlined into `style` attributes (mail clients drop `<style>` blocks) and no images: each
HTML template carries the layout's styles in its own tags, put there once when it is loaded
(`styled`), so an email is a plain Jinja2 render, with on each element the style the CSS inliner gives it.
Text that the agent or a tool call supplied can never pass for one of our own lines: in the text
part every line of it is indented under its label (`indent_text`, `arg_text`) or kept on its label's
line (`one_line`); in the HTML part it is escaped; in both, invisible formatting characters (bidi
overrides, zero-width) are shown as `[U+XXXX]` markers (`countersign.security.textsafety`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import css_inline
from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError, select_autoescape

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


LAYOUT = "_layout.html"
_STYLE_BLOCK = re.compile(r"<style>(.*?)</style>", re.DOTALL)
_TAG_OPEN = re.compile(r"<[a-zA-Z]")
# A start tag whose attributes are all static names with double-quoted values (Jinja2 only inside a value).
_START_TAG = re.compile(r'<([a-zA-Z][a-zA-Z0-9]*)((?:\s+[a-zA-Z_:][-a-zA-Z0-9_:.]*(?:="[^"]*")?)*)\s*/?>')
_CLASS = re.compile(r'\sclass="([^"]*)"')
_RULE = re.compile(r"([^{}]*)\{([^{}]*)\}")
_SELECTOR = re.compile(r"\.?[a-zA-Z][-\w]*")
_TABLE_PARTS = {"td": "<table><tr>{}</tr></table>", "th": "<table><tr>{}</tr></table>", "tr": "<table>{}</table>"}
_NOT_IN_BODY = {"html", "head", "meta", "title", "style", "link", "base"}


class StyledLoader(FileSystemLoader):
    """The templates, each HTML one with the layout's stylesheet inlined into it once (`styled`)."""

    def get_source(self, environment: Environment, template: str) -> tuple[str, str, Callable[[], bool]]:
        source, filename, uptodate = super().get_source(environment, template)
        if template.endswith(".html"):
            layout = source if template == LAYOUT else super().get_source(environment, LAYOUT)[0]
            source = styled(template, source, stylesheet(layout))
        return source, filename, uptodate


def stylesheet(layout: str) -> str:
    """The CSS of the layout's one `<style>` block."""
    blocks = _STYLE_BLOCK.findall(layout)
    if len(blocks) != 1:
        raise TemplateError(f"{LAYOUT} must have exactly one <style> block, not {len(blocks)}")
    return str(blocks[0])


def styled(name: str, source: str, css: str) -> str:
    """An HTML email template with, in each start tag, the style the CSS inliner gives that element
    from `css`, and the layout's `<style>` block dropped: what inlining every email rendered from it
    did, done once. Exact because every selector of `css` is one tag or one class (checked): an
    element's style depends on its tag and classes only, never on where it is or on what Jinja2
    fills in. Refused (TemplateError) where that would not hold: a template that is not rendered
    inside the layout, a start tag this cannot read (Jinja2 around an attribute, an unquoted value),
    Jinja2 in a class, a style of its own."""
    if not name.startswith("_") and not source.startswith('{% extends "_layout.html" %}'):
        raise TemplateError(f"{name}: an email's HTML template extends {LAYOUT}, whose stylesheet it is given")
    if name != LAYOUT and _STYLE_BLOCK.search(source):
        raise TemplateError(f"{name}: only {LAYOUT} has a stylesheet")
    source = _STYLE_BLOCK.sub("", source)
    read = {m.start() for m in _START_TAG.finditer(source)}
    if unread := [m.start() for m in _TAG_OPEN.finditer(source) if m.start() not in read]:
        raise TemplateError(f"{name}: a start tag whose style cannot be inlined at offset {unread[0]}")

    def with_style(tag: re.Match[str]) -> str:
        attrs = tag.group(2)
        named = _CLASS.search(attrs)
        classes = named.group(1) if named else ""
        if re.search(r"\sstyle=", attrs) or "{" in classes:
            raise TemplateError(f"{name}: <{tag.group(1)}> has a style of its own or Jinja2 in its class")
        style = _style_of(tag.group(1).lower(), tuple(classes.split()), css)
        if not style:
            return tag.group(0)
        whole = tag.group(0)
        cut = len(whole) - (2 if whole.endswith("/>") else 1)
        return f'{whole[:cut].rstrip()} style="{style}"{whole[cut:]}'

    return _START_TAG.sub(with_style, source)


@functools.cache
def _selectors(css: str) -> frozenset[str]:
    """The selectors of `css`; TemplateError unless each is one tag or one class."""
    rest = _RULE.sub("", re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL))
    found = {s.strip() for rule in _RULE.findall(css) for s in rule[0].split(",")}
    if rest.strip() or not all(_SELECTOR.fullmatch(s) for s in found):
        raise TemplateError(f"{LAYOUT}: the email stylesheet may only select one tag or one class")
    return frozenset(found)


@functools.cache
def _style_of(tag: str, classes: tuple[str, ...], css: str) -> str:
    """The `style` attribute the CSS inliner gives a `<tag>` of these classes (escaped, as it writes it)."""
    if not {tag, *(f".{c}" for c in classes)} & _selectors(css):
        return ""
    if tag in _NOT_IN_BODY or "{" in tag + "".join(classes):
        raise TemplateError(f"a style for <{tag}> cannot be inlined once per template")
    attrs = (f' class="{" ".join(classes)}"' if classes else "") + ' data-probe=""'
    element = f"<{tag}{attrs}>"
    body = f"<body{attrs}>" if tag == "body" else "<body>" + _TABLE_PARTS.get(tag, "{}").format(element)
    out = _inliner().inline(f"<html><head><style>{css}</style></head>{body}</body></html>")
    probed = re.search(rf'<{tag}\s[^>]*data-probe=""[^>]*>', out)
    if probed is None:
        raise TemplateError(f"the CSS inliner dropped a <{tag}> it was given")
    style = re.search(r'\sstyle="([^"]*)"', probed.group(0))
    if style is not None and "{" in style.group(1):  # Jinja2 would read it as its own syntax
        raise TemplateError(f"the style of <{tag}> has a brace: it cannot go into a template")
    return style.group(1) if style else ""


@functools.cache
def environment() -> Environment:
    # auto_reload off: installed templates do not change under a running process (see countersign.web.views).
    env = Environment(
        loader=StyledLoader(template_dir()),
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
    html = env.get_template(f"{name}.html").render(**context)
    return subject, text, html
