"""Where the fault runner finds the emails the app sent: the outbox folder, or the fake Resend's log.

Guarantee: both sources give the same `Mail` records (kind, run, recipient, first link, the provider's
id for it) and answer "which provider ids go with this idempotency key": the outbox by the Message-ID
it derives from the key, the fake Resend by the key each accepted request carried.
"""

from __future__ import annotations

import email
import email.policy
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from hashlib import sha256
from pathlib import Path
from typing import Protocol

from fakes.resend_server import FakeResend
from support.approver import LINK

from countersign.mail.intent import from_tag_value


@dataclass(frozen=True)
class Mail:
    source_id: str
    """The outbox file name, or Resend's email id: what makes this email distinct in its source."""
    kind: str
    run_id: str
    to: str
    link: str | None
    provider_id: str
    """What the app journals (and audits) as the provider's id: the Message-ID, or Resend's id."""


class MailSource(Protocol):
    def new(self, seen: set[str]) -> Iterator[Mail]:
        """The emails whose `source_id` is not in `seen`."""
        ...

    def all(self) -> list[Mail]: ...

    def ids_for_key(self, key: str) -> set[str]:
        """The provider ids an email with this idempotency key has (or would have) in this source."""
        ...


class Outbox:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _read(self, path: Path) -> Mail:
        message = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        body = message.get_body(("plain",))
        links = LINK.findall(str(body.get_content()) if body is not None else "")
        return Mail(
            source_id=path.name,
            kind=path.name.split("_", 1)[0].removeprefix("approval-"),
            run_id=from_tag_value(str(message["X-Countersign-Run-Id"])),
            to=str(message["To"]),
            link=str(links[0]) if links else None,
            provider_id=str(message["Message-ID"]),
        )

    def new(self, seen: set[str]) -> Iterator[Mail]:
        for path in sorted(self.folder.glob("approval-*.eml")):
            if path.name not in seen:
                yield self._read(path)

    def all(self) -> list[Mail]:
        return list(self.new(set()))

    def ids_for_key(self, key: str) -> set[str]:
        return {f"<{sha256(key.encode()).hexdigest()[:40]}@countersign.local>"}


class ResendLog:
    def __init__(self, fake: FakeResend) -> None:
        self.fake = fake

    def new(self, seen: set[str]) -> Iterator[Mail]:
        for accepted in list(self.fake.accepted):
            if accepted.id in seen:
                continue
            tags = accepted.tags
            links = LINK.findall(str(accepted.params.get("text") or ""))
            yield Mail(
                source_id=accepted.id,
                kind=tags.get("kind", ""),
                run_id=from_tag_value(tags.get("run_id", "")),
                to=accepted.to[0],
                link=str(links[0]) if links else None,
                provider_id=accepted.id,
            )

    def all(self) -> list[Mail]:
        return list(self.new(set()))

    def ids_for_key(self, key: str) -> set[str]:
        return {a.id for a in self.fake.accepted_for(key)}
