"""The local mail backend: each message becomes an RFC 5322 `.eml` file in the outbox folder.

Guarantee: the file name and the Message-ID derive from the message's idempotency key alone, and
the first message written under a key is the one that stays, as at a provider that honours
idempotency keys: a retried send, or a second caller asking at a placement already asked, finds
the file and writes nothing, so the outbox holds exactly one file per intent and an approver's
first link is never replaced by one that does not work (written atomically: temp file, then a hard
link that fails if the name exists). Both parts are quoted-printable and the MIME boundary is drawn
from `secrets` on every write and checked against the encoded parts, so no content, however it was
chosen, can close a part or open one of its own (a boundary holds `=_`, which quoted-printable
never writes). Approval links are logged only in dev/test (`log_links`); elsewhere the log names
the outbox file, never a link or token.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import tempfile
from datetime import UTC, datetime
from email.charset import QP, Charset
from email.header import Header
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from email.policy import compat32
from email.utils import format_datetime
from pathlib import Path
from typing import Any

from countersign.mail.message import OutgoingEmail, SendReceipt

log = logging.getLogger("countersign.mail")
_CRLF = compat32.clone(linesep="\r\n")
_UTF8_QP = Charset("utf-8")
_UTF8_QP.body_encoding = QP
_BOUNDARY_DRAWS = 8


class OutboxMailer:
    name = "outbox"

    def __init__(self, folder: Path, sender: str, *, log_links: bool = False) -> None:
        self.folder = folder
        self.sender = sender
        # Dev/test only (see `mailer_for`): a link carries its token, and tokens stay out of logs.
        self.log_links = log_links

    def send(self, email: OutgoingEmail) -> SendReceipt:
        digest = hashlib.sha256(email.idempotency_key.encode()).hexdigest()
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", email.idempotency_key)[:120] + "-" + digest[:10]
        message_id = f"<{digest[:40]}@countersign.local>"
        path = self.folder / f"{stem}.eml"
        receipt = SendReceipt(
            backend=self.name, message_id=message_id, idempotency_key=email.idempotency_key, kind=email.kind
        )
        if path.exists():
            log.info("%s email for %s: already sent as outbox file %s", email.kind, ", ".join(email.to), path.name)
            return receipt
        data = self._render(email, message_id)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".eml")
        except FileNotFoundError:  # the first email (the folder is made then, not on every send)
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".eml")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.link(tmp, path)
        except FileExistsError:  # a concurrent send under the same key wrote it first: that one stays
            return receipt
        finally:
            os.unlink(tmp)
        if self.log_links and email.log_links:
            for link in email.log_links:
                log.info("approval link for %s: %s (outbox file %s)", ", ".join(email.to), link, path.name)
        else:
            log.info("%s email for %s: outbox file %s", email.kind, ", ".join(email.to), path.name)
        return receipt

    def _render(self, email: OutgoingEmail, message_id: str) -> bytes:
        # The compat32 API, because the modern one parses every header it sets: that made this
        # backend the largest CPU cost of a run's first email.
        parts = [_text_part(email.text, "plain"), _text_part(email.html, "html")]
        msg = MIMEMultipart("alternative", boundary=_boundary([str(p.get_payload()) for p in parts]))
        msg["From"] = _header(self.sender)
        msg["To"] = _header(", ".join(email.to))
        msg["Subject"] = _header(email.subject)
        msg["Date"] = format_datetime(datetime.fromtimestamp(email.sent_at, UTC))
        msg["Message-ID"] = message_id
        for name, value in sorted(email.tags.items()):
            msg[f"X-Countersign-{name.replace('_', '-').title()}"] = _header(value)
        for part in parts:
            msg.attach(part)
        return msg.as_bytes(policy=_CRLF)


def _text_part(text: str, subtype: str) -> MIMENonMultipart:
    """UTF-8, quoted-printable: 7-bit lines of at most 76 characters, and `=` always escaped."""
    part = MIMENonMultipart("text", subtype)
    part.set_payload(text, _UTF8_QP)
    return part


def _boundary(encoded_parts: list[str]) -> str:
    """A fresh unpredictable boundary that occurs in none of the encoded parts.

    Random on every write rather than derived from the idempotency key: a derived one is known to
    whoever knows the approval id, and a retried send still lands in the same file (named by key).
    """
    for _ in range(_BOUNDARY_DRAWS):
        boundary = f"=_countersign_{secrets.token_hex(16)}"
        if not any(boundary in part for part in encoded_parts):
            return boundary
    raise RuntimeError("no MIME boundary absent from the message parts")  # 2^-128 per draw: never


def _header(value: str) -> Any:
    """The value, or an RFC 2047 `Header` when it is not ASCII (typeshed's `Message` takes only str)."""
    return value if value.isascii() else Header(value, "utf-8")
