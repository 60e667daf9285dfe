"""Mail: rendering from `email_templates/` and the backends that deliver it."""

from __future__ import annotations

from handlers.mail.message import Mailer
from handlers.mail.outbox import OutboxMailer
from handlers.settings import Settings


def mailer_for(settings: Settings) -> Mailer:
    """The outbox unless `RESEND_API_KEY` is set."""
    if settings.resend_api_key:
        from handlers.mail.resend_backend import ResendMailer

        return ResendMailer(settings.resend_api_key, settings.resend_from)
    return OutboxMailer(settings.approvals_outbox_dir, settings.resend_from)
