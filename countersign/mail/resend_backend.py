"""The Resend mail backend, through the official `resend` SDK.

Guarantee: every send carries the message's idempotency key, so Resend delivers one email per
intent however often a step retries. The SDK itself never retries; its errors are sorted here:
rate limits, quota, a concurrent request under the same key, 5xx and lost connections become
`MailDeferred` (with Resend's `retry-after` when it gives one); every other refusal becomes
`MailRejected`. Neither message ever carries an address, a link or the API key.
"""

from __future__ import annotations

import re
import time
from email.utils import parsedate_to_datetime
from typing import Any

import resend

from countersign.mail.message import MailDeferred, MailRejected, OutgoingEmail, SendReceipt

MAX_RETRY_AFTER = 3600.0
_ADDRESS = re.compile(r"[^\s<>\"'`,;:()]+@[^\s<>\"'`,;:()]+")
_RETRY_LATER_4XX = {"concurrent_idempotent_requests"}


class ResendMailer:
    name = "resend"

    def __init__(self, api_key: str, sender: str, *, api_url: str | None = None, timeout: float = 20.0) -> None:
        self.api_key = api_key
        self.sender = sender
        self.api_url = api_url
        self.timeout = timeout

    def send(self, email: OutgoingEmail) -> SendReceipt:
        # The SDK is configured through module globals; every send sets the same values.
        resend.api_key = self.api_key
        if self.api_url:
            resend.api_url = self.api_url
        resend.default_http_client = resend.RequestsClient(timeout=self.timeout)  # type: ignore[arg-type]
        params: dict[str, Any] = {
            "from": self.sender,
            "to": email.to,
            "subject": email.subject,
            "text": email.text,
            "html": email.html,
            "tags": [{"name": k, "value": v} for k, v in sorted(email.tags.items())],
        }
        try:
            sent = resend.Emails.send(params, {"idempotency_key": email.idempotency_key})  # type: ignore[arg-type]
        except resend.exceptions.ResendError as exc:
            raise classify(exc) from None
        return SendReceipt(
            backend=self.name, message_id=str(sent["id"]), idempotency_key=email.idempotency_key, kind=email.kind
        )


def classify(exc: Any) -> MailDeferred | MailRejected:
    """Sort one SDK error into "try again later" or "final"."""
    try:
        code = int(exc.code)
    except (TypeError, ValueError):
        code = 500
    kind = str(getattr(exc, "error_type", "") or "")
    what = f"Resend answered {code} {kind}".rstrip()
    if kind == "HttpClientError":
        return MailDeferred("no answer from Resend (connection failed or timed out)")
    if code == 429:
        return MailDeferred(f"{what}: rate limited", status=429, retry_after=retry_after(exc.headers))
    if kind in _RETRY_LATER_4XX:
        return MailDeferred(f"{what}: the first request with this key is still in progress", retry_after=1.0)
    if code >= 500 or code == 408:
        return MailDeferred(f"{what}: provider unavailable", status=code if code >= 500 else 503)
    if kind == "invalid_idempotent_request":
        return MailRejected(
            f"{what}: this key was already used for a different message (was a signing key rotated or a "
            "template changed mid-retry?); the first one may have been delivered, so it is not re-sent"
        )
    return MailRejected(f"{what}: {scrub(str(getattr(exc, 'message', '') or ''))}")


def retry_after(headers: Any) -> float | None:
    """Seconds from a `retry-after` header (delta-seconds or HTTP date), within [0.5 s, 1 h]."""
    value = next((str(v) for k, v in dict(headers or {}).items() if str(k).lower() == "retry-after"), "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.5), MAX_RETRY_AFTER)


def scrub(message: str) -> str:
    """A provider message without email addresses, on one line, at most 200 characters."""
    return " ".join(_ADDRESS.sub("<address>", message).split())[:200]
