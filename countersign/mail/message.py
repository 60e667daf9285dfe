"""What a mail backend is asked to send, what it reports back, and how it refuses.

Guarantee: an `OutgoingEmail` is fully rendered before any backend sees it and carries the
idempotency key of its intent, so a retried send delivers at most one message; a backend either
returns a `SendReceipt` naming the provider's id for the message, or raises `MailRejected` (final)
or `MailDeferred` (try again later, with the same key).
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from countersign.mail.intent import MessageKind


class OutgoingEmail(BaseModel):
    kind: MessageKind = "request"
    to: list[str]
    subject: str
    text: str
    html: str
    idempotency_key: str = Field(min_length=1, max_length=256)
    sent_at: float
    tags: dict[str, str] = Field(default_factory=dict)
    log_links: list[str] = Field(default_factory=list, exclude=True)


class SendReceipt(BaseModel):
    """Journaled after a send: which backend took the message and its id there. No content, no links."""

    backend: str
    message_id: str
    """The provider's id for the message: Resend's email id, or the outbox file's Message-ID."""
    idempotency_key: str
    kind: MessageKind = "request"


class MailRejected(Exception):
    """The provider refused this message for good (invalid address, unverified sender, bad key).

    The message is safe to log and show: it never contains an address or a link.
    """


class MailDeferred(Exception):
    """The provider could not take the message now (rate limit, outage, lost connection).

    Retrying with the same idempotency key is safe: if the provider did accept it, it answers with
    the same id instead of sending again. `retry_after` is the provider's own hint, in seconds.
    """

    def __init__(self, message: str, *, status: int = 503, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Mailer(Protocol):
    name: str

    def send(self, email: OutgoingEmail) -> SendReceipt: ...
