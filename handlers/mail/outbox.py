"""The local mail backend: each message becomes an RFC 5322 `.eml` file in the outbox folder.

Guarantee: the file name and every byte of the file derive from the message's idempotency key and
journaled values (no random MIME boundary, no wall clock), so a retried send rewrites the same file
and the outbox holds exactly one file per intent. Written atomically (temp file, then rename).
"""

from __future__ import annotations

import hashlib
import logging
import os
import quopri
import re
import tempfile
from datetime import UTC, datetime
from email.header import Header
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from email.policy import compat32
from email.utils import format_datetime
from pathlib import Path
from typing import Any

from handlers.mail.message import OutgoingEmail, SendReceipt

log = logging.getLogger("countersign.mail")
_CRLF = compat32.clone(linesep="\r\n")
_MAX_LINE = 998


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
        # The compat32 API, because the modern one parses every header it sets: that made this
        # backend the largest CPU cost of a run's first email.
        msg = MIMEMultipart("alternative", boundary=boundary)
        msg["From"] = _header(self.sender)
        msg["To"] = _header(", ".join(email.to))
        msg["Subject"] = _header(email.subject)
        msg["Date"] = format_datetime(datetime.fromtimestamp(email.sent_at, UTC))
        msg["Message-ID"] = message_id
        for name, value in sorted(email.tags.items()):
            msg[f"X-Countersign-{name.replace('_', '-').title()}"] = _header(value)
        msg.attach(_text_part(email.text, "plain"))
        msg.attach(_text_part(email.html, "html"))
        return msg.as_bytes(policy=_CRLF)


def _text_part(text: str, subtype: str) -> MIMENonMultipart:
    """UTF-8 as it is (8bit), or quoted-printable when a line is longer than SMTP allows."""
    part = MIMENonMultipart("text", subtype, charset="utf-8")
    raw = text.encode()
    if all(len(line) <= _MAX_LINE for line in raw.splitlines()):
        part.set_payload(raw.decode("ascii", "surrogateescape"))
        part["Content-Transfer-Encoding"] = "8bit"
    else:
        part.set_payload(quopri.encodestring(raw).decode("ascii"))
        part["Content-Transfer-Encoding"] = "quoted-printable"
    return part


def _header(value: str) -> Any:
    """The value, or an RFC 2047 `Header` when it is not ASCII (typeshed's `Message` takes only str)."""
    return value if value.isascii() else Header(value, "utf-8")
