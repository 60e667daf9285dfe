"""How Restate's terminal errors are told apart: a cancellation, or a second completion of a promise.

Guarantee: a hard cancel is never mistaken for a business error (it must propagate, or the
invocation would carry on after being cancelled), and "already completed" is Restate's own answer to
a second completion, which is how the first completion of a decision promise wins.
"""

from __future__ import annotations


def is_already_completed(exc: Exception) -> bool:
    """Restate's answer to a second completion of a promise (as opposed to a cancellation)."""
    return getattr(exc, "status_code", None) == 409 and "already completed" in str(exc)


def is_cancellation(exc: Exception) -> bool:
    """A hard `restate invocations cancel`: must propagate, never be swallowed as a business error."""
    return getattr(exc, "status_code", None) == 409 and getattr(exc, "message", "") in ("cancelled", "killed")
