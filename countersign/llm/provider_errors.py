"""Turning a provider's HTTP error into `ProviderBusy` (retry) or `ProviderRefused` (final).

Guarantee: 408, 409, 429 and 5xx are retryable and carry the provider's own retry delay when it sent
one (`retry-after-ms`, `retry-after` in seconds or as an HTTP date, capped); every other status is
final. A 404 that says the model is not found (OpenAI's `model_not_found`, Anthropic's
`not_found_error` about the model) is `ModelRetired`, a final refusal the agent loop acts on (a
successor model, or an explicit end). Messages name the provider, the status and its explanation.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from countersign.llm.base import ModelRetired, ProviderBusy, ProviderRefused

RETRYABLE_STATUSES = frozenset({408, 409, 429})
MAX_RETRY_AFTER_SECONDS = 300.0
_MAX_MESSAGE = 500


def classify(provider: str, status: int, body: object, headers: Mapping[str, str]) -> ProviderBusy | ProviderRefused:
    detail = _detail(body)
    if status in RETRYABLE_STATUSES or status >= 500:
        return ProviderBusy(f"{provider} answered HTTP {status}: {detail}", retry_after_seconds(headers))
    if is_model_retired(status, body):
        return ModelRetired(f"{provider} refused the request (HTTP {status}): {detail}")
    return ProviderRefused(f"{provider} refused the request (HTTP {status}): {detail}")


def is_model_retired(status: int, body: object) -> bool:
    """Whether an HTTP error says the requested model does not exist (any more). For a user's own
    loop: pass the provider's status and JSON error body."""
    if status != 404:
        return False
    error: Any = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return False
    kind = str(error.get("code") or error.get("type") or "")
    return kind == "model_not_found" or (kind == "not_found_error" and "model" in str(error.get("message", "")).lower())


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    seconds: float | None = None
    if (ms := headers.get("retry-after-ms")) is not None:
        seconds = _number(ms, scale=0.001)
    if seconds is None and (raw := headers.get("retry-after")) is not None:
        seconds = _number(raw, scale=1.0)
        if seconds is None:
            try:
                seconds = email.utils.parsedate_to_datetime(raw).timestamp() - time.time()
            except (TypeError, ValueError):
                seconds = None
    if seconds is None or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def _number(raw: str, *, scale: float) -> float | None:
    try:
        return float(raw) * scale
    except ValueError:
        return None


def _detail(body: object) -> str:
    """The provider's own message from `{"error": {"message", "type"|"code"}}` or that inner object."""
    error: Any = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict):
        kind = error.get("code") or error.get("type")
        message = str(error.get("message") or "")
        text = f"{kind}: {message}" if kind and message else str(message or kind or "")
    elif isinstance(body, str | bytes):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
    else:
        text = ""
    text = " ".join(text.split())
    return (text[:_MAX_MESSAGE] + "…") if len(text) > _MAX_MESSAGE else (text or "no details")
