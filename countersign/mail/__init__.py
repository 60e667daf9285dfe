"""Mail: rendering from `email_templates/` and the backends that deliver it.

Guarantee: exactly one backend is in use, chosen by settings: Resend when `RESEND_API_KEY` is set,
the local `.eml` outbox otherwise. Only in dev/test (`COUNTERSIGN_ENV`) does the outbox log the
approval links it writes; no backend logs a link or token anywhere else.
"""

from __future__ import annotations

from countersign.mail.message import Mailer
from countersign.mail.outbox import OutboxMailer
from countersign.settings import Settings


def mailer_for(settings: Settings) -> Mailer:
    """The outbox unless `RESEND_API_KEY` is set."""
    if settings.resend_api_key:
        from countersign.mail.resend_backend import ResendMailer

        return ResendMailer(
            settings.resend_api_key,
            settings.resend_from,
            api_url=settings.resend_api_url,
            timeout=settings.resend_timeout_seconds,
        )
    return OutboxMailer(settings.approvals_outbox_dir, settings.resend_from, log_links=settings.is_dev)
