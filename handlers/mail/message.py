"""What a mail backend is asked to send, and what it reports back.

Guarantee: an `OutgoingEmail` is fully rendered before any backend sees it, and carries the
idempotency key that makes a retried send deliver at most one message.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field


class OutgoingEmail(BaseModel):
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
    idempotency_key: str


class Mailer(Protocol):
    name: str

    def send(self, email: OutgoingEmail) -> SendReceipt: ...
