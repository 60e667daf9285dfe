"""Log lines that say which invocation (and which approval) wrote them; JSON on request.

Guarantee: every record that passes through the root handler `configure` installs carries
`invocation_id` (the Restate invocation whose handler wrote it, else None) and `approval_id` (the
approval that invocation serves, where there is one: the key of an `Approval` workflow, or the one
a caller's code names with `approval_scope`). With COUNTERSIGN_LOG_FORMAT=json each line is one JSON
object (time, level, logger, message, invocation_id, approval_id, and the exception's type and
traceback when there is one); with `text`, the ids follow the message when set.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from restate.server_context import current_context

APPROVAL_SERVICE = "Approval"
_approval: contextvars.ContextVar[str | None] = contextvars.ContextVar("countersign_approval_id", default=None)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(ids)s"


@contextmanager
def approval_scope(approval_id: str) -> Iterator[None]:
    """Lines written inside name `approval_id` (for a caller's code that handles one approval)."""
    token = _approval.set(approval_id)
    try:
        yield
    finally:
        _approval.reset(token)


def invocation_ids() -> tuple[str | None, str | None]:
    """(invocation id, approval id) of the handler running in this task, or (None, None)."""
    try:
        ctx = current_context()
    except LookupError:  # the SDK's context variable has no default: not in a handler
        ctx = None
    if ctx is None:
        return None, _approval.get()
    invocation = getattr(ctx, "invocation", None)
    invocation_id = getattr(invocation, "invocation_id", None)
    approval_id = _approval.get()
    handler = getattr(ctx, "handler", None)
    if approval_id is None and handler is not None and handler.service_tag.name == APPROVAL_SERVICE:
        approval_id = ctx.key()  # type: ignore[attr-defined]
    return invocation_id, approval_id


class InvocationIds(logging.Filter):
    """Adds `invocation_id`, `approval_id` and `ids` (their text form) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        invocation_id, approval_id = invocation_ids()
        record.invocation_id = invocation_id
        record.approval_id = approval_id
        parts = [f"invocation={invocation_id}"] if invocation_id else []
        if approval_id:
            parts.append(f"approval={approval_id}")
        record.ids = f" [{' '.join(parts)}]" if parts else ""
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "invocation_id": getattr(record, "invocation_id", None),
            "approval_id": getattr(record, "approval_id", None),
        }
        if record.exc_info and record.exc_info[0] is not None:
            line["exception"] = record.exc_info[0].__name__
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(fmt: str = "text") -> None:
    """INFO and up to stderr, in `fmt` (`text` or `json`), every root handler with the ids filter. A
    platform's own root handler (AWS Lambda's) is kept: it gains the filter (and, for json, the format)."""
    root = logging.getLogger()
    ours = not root.handlers
    if ours:
        root.addHandler(logging.StreamHandler())
    root.setLevel(logging.INFO)
    for handler in root.handlers:
        if not any(isinstance(f, InvocationIds) for f in handler.filters):
            handler.addFilter(InvocationIds())
        if fmt == "json":
            handler.setFormatter(JsonLines())
        elif ours:
            handler.setFormatter(logging.Formatter(TEXT_FORMAT))
