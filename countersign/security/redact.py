"""Email addresses and link tokens kept out of error text, which Restate stores unencrypted.

Guarantee: failures bypass the journal value codec (the SDK writes a `TerminalError`'s message and a
failed step's `repr` as they are), so every handler of a service built with `invocation_context_managers
=[clean_failures]`, and every step action wrapped in `scrubbed`, fails with its text passed through
`scrub` and without chained causes; an input that does not parse is a 400, not the SDK's 500.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

from restate import TerminalError
from restate.exceptions import RetryableError

_EMAIL = re.compile(r"[\w.%+-]+@[\w-]+(?:\.[\w-]+)+")
_TOKEN = re.compile(r"v\d+\.[A-Za-z0-9]{1,16}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}")
_UNPARSABLE_INPUT = "Unable to parse an input argument"

F = TypeVar("F", bound=Callable[..., Any])


class ScrubbedError(Exception):
    """An unexpected exception retold with its text scrubbed; still retryable, like the original.

    Its repr is the original's repr, scrubbed: that is what Restate records for a failed attempt."""

    def __repr__(self) -> str:
        return str(self)


def scrub(text: str) -> str:
    return _EMAIL.sub("[email]", _TOKEN.sub("[link token]", text))


def _retold(exc: Exception) -> Exception:
    if isinstance(exc, TerminalError):
        status = 400 if exc.status_code == 500 and exc.message.startswith(_UNPARSABLE_INPUT) else exc.status_code
        return TerminalError(scrub(exc.message), status, exc.metadata)
    if isinstance(exc, RetryableError):
        return RetryableError(scrub(exc.message), exc.status_code, exc.retry_after)
    return ScrubbedError(scrub(repr(exc)))


def scrubbed(action: F) -> F:
    """Wrap a `ctx.run_typed` action so that what it raises is stored scrubbed."""
    if inspect.iscoroutinefunction(action):

        @functools.wraps(action)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await action(*args, **kwargs)
            except Exception as exc:
                raise _retold(exc) from None

        return cast(F, run_async)

    @functools.wraps(action)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return action(*args, **kwargs)
        except Exception as exc:
            raise _retold(exc) from None

    return cast(F, run)


def _sdk_internal(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("restate") and not isinstance(exc, TerminalError | RetryableError)


@asynccontextmanager
async def clean_failures() -> AsyncIterator[None]:
    """Invocation context manager: the handler's failure as the SDK would record it, scrubbed."""
    try:
        yield
    except Exception as exc:
        if _sdk_internal(exc):
            raise
        # The SDK treats an exception caused by a TerminalError as that TerminalError; keep that.
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, TerminalError):
            cause = cause.__cause__
        raise _retold(cause if isinstance(cause, TerminalError) else exc) from None
