"""One email send (or a few) as the body of a journaled step, with the provider's answer mapped onto
Restate's retry model.

Guarantee: run inside `ctx.run_typed(..., EMAIL_RETRIES, ...)`, a send either returns the
`SendReceipt` (journaled, carrying the provider's id) or ends the step with a `TerminalError` that
says why the notification failed. Rate limits are retried after the provider's `retry-after`,
outages and lost connections with the step's backoff, and nothing else is retried; every retry
re-renders the same bytes under the same idempotency key, so the provider sends at most one email.
Several emails in one step (`deliver_each`) keep a key each: a retry of the step resends none the
provider already has, and one refused for good does not stop the others.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from restate import RunOptions, TerminalError
from restate.exceptions import RetryableError

from countersign.faults import crash_point
from countersign.mail import mailer_for
from countersign.mail.message import MailDeferred, MailRejected, OutgoingEmail, SendReceipt
from countersign.settings import Settings, get_settings

REFUSED_STATUS = 422
# 5xx/lost connections back off 0.5 s doubling to 10 min (about 1.6 h over 20 attempts); 429s wait
# Resend's retry-after; 6 h caps it all, far inside Resend's 24 h idempotency window, so a retry
# never sends a second email.
EMAIL_RETRIES = RunOptions[Any](
    max_attempts=20,
    initial_retry_interval=timedelta(milliseconds=500),
    retry_interval_factor=2.0,
    max_retry_interval=timedelta(minutes=10),
    max_duration=timedelta(hours=6),
)


def deliver(build: Callable[[Settings], OutgoingEmail]) -> SendReceipt:
    settings = get_settings()
    try:
        email = build(settings)
        receipt = mailer_for(settings).send(email)
    except MailRejected as exc:
        raise TerminalError(f"email not sent: {exc}", REFUSED_STATUS) from None
    except MailDeferred as exc:
        if exc.retry_after is None:
            raise
        raise RetryableError(str(exc), exc.status, retry_after=timedelta(seconds=exc.retry_after)) from None
    # The fault tests stop here: the provider has the message, the journal does not have the receipt.
    crash_point(f"crash-after-send:{email.kind}")
    return receipt


class Delivered(BaseModel):
    """Journaled after a step that sent several emails: each one's receipt, None where it was refused."""

    receipts: list[SendReceipt | None]


def deliver_each(*builds: Callable[[Settings], OutgoingEmail]) -> Delivered:
    """Send each email in turn, under its own idempotency key; any that cannot go now (an outage, a
    rate limit) retries the whole step, which sends again only what the provider does not have."""
    receipts: list[SendReceipt | None] = []
    for build in builds:
        try:
            receipts.append(deliver(build))
        except TerminalError:  # refused for good, as its own step would end: the others still go
            receipts.append(None)
    return Delivered(receipts=receipts)
