"""The Resend mail backend, through the official `resend` SDK.

Guarantee: every send carries the message's idempotency key, so Resend delivers one email per
intent however often a crashed step retries; provider refusals (4xx other than 409/429) surface as
`MailRejected`, which the caller treats as final, and everything else is left to the step's retries.
"""

from __future__ import annotations

from typing import Any

import resend

from handlers.mail.message import OutgoingEmail, SendReceipt


class MailRejected(Exception):
    """The provider refused this message for good (bad address, unverified sender, bad key)."""


class ResendMailer:
    name = "resend"

    def __init__(self, api_key: str, sender: str) -> None:
        self.api_key = api_key
        self.sender = sender

    def send(self, email: OutgoingEmail) -> SendReceipt:
        resend.api_key = self.api_key
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
            code = int(getattr(exc, "code", 500) or 500)
            if 400 <= code < 500 and code not in (409, 429):
                raise MailRejected(f"Resend refused the message ({code} {getattr(exc, 'error_type', '')})") from None
            raise RuntimeError(f"Resend send failed ({code} {getattr(exc, 'error_type', '')})") from None
        return SendReceipt(backend=self.name, message_id=str(sent["id"]), idempotency_key=email.idempotency_key)
