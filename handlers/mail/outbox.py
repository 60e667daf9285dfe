"""The local mail backend: each message becomes an RFC 5322 `.eml` file in the outbox folder.

Guarantee: the file name and every byte of the file derive from the message's idempotency key and
journaled values (no random MIME boundary, no wall clock), so a retried send rewrites the same file
and the outbox holds exactly one file per intent. Written atomically (temp file, then rename).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from datetime import UTC, datetime
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime
from pathlib import Path

from handlers.mail.message import OutgoingEmail, SendReceipt

log = logging.getLogger("countersign.mail")


class OutboxMailer:
    name = "outbox"

    def __init__(self, folder: Path, sender: str) -> None:
        self.folder = folder
        self.sender = sender

    def send(self, email: OutgoingEmail) -> SendReceipt:
        self.folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(email.idempotency_key.encode()).hexdigest()
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", email.idempotency_key)[:120] + "-" + digest[:10]
        message_id = f"<{digest[:40]}@countersign.local>"
        path = self.folder / f"{stem}.eml"
        data = self._render(email, message_id, boundary=f"=_countersign_{digest[:32]}")
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".eml")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        for link in email.log_links:
            log.info("approval link for %s: %s (outbox file %s)", ", ".join(email.to), link, path.name)
        if not email.log_links:
            log.info("%s email for %s: outbox file %s", email.kind, ", ".join(email.to), path.name)
        return SendReceipt(
            backend=self.name, message_id=message_id, idempotency_key=email.idempotency_key, kind=email.kind
        )

    def _render(self, email: OutgoingEmail, message_id: str, boundary: str) -> bytes:
        msg = EmailMessage(policy=SMTP)
        msg["From"] = self.sender
        msg["To"] = ", ".join(email.to)
        msg["Subject"] = email.subject
        msg["Date"] = format_datetime(datetime.fromtimestamp(email.sent_at, UTC))
        msg["Message-ID"] = message_id
        for name, value in sorted(email.tags.items()):
            msg[f"X-Countersign-{name.replace('_', '-').title()}"] = value
        msg.set_content(email.text)
        msg.add_alternative(email.html, subtype="html")
        msg.set_boundary(boundary)
        return msg.as_bytes()
