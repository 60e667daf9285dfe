"""Journal values encrypted with AES-256-GCM before Restate stores them.

Guarantee: with `COUNTERSIGN_JOURNAL_KEYS` set, every value the SDK passes through its journal value
codec (handler input and output, `ctx.run` results, state, promise values, call and send parameters)
is stored as the JSON envelope `{"countersign:v1":"<kid>.<base64url(nonce | ciphertext | tag)>"}`,
sealed with the first key; every listed key opens (rotation), and a changed byte fails
authentication. Plain JSON (a body sent with curl, a value journaled before encryption was switched
on) passes through `decode` unchanged. Failures never reach the codec: `handlers.security.redact` scrubs them.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from restate import JournalValueCodec

from handlers.settings import Settings

ENVELOPE = b'{"countersign:v1":"'
_END = b'"}'
_AAD = b"countersign.journal.v1\x00"
_NONCE = 12


class JournalValueUnreadable(ValueError):
    """A sealed value this process cannot open: unknown key id, or altered bytes."""


class JournalCipher(JournalValueCodec):
    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not keys:
            raise ValueError("a journal cipher needs at least one key")
        self.kid = next(iter(keys))
        self._aead = {kid: AESGCM(key) for kid, key in keys.items()}

    def encode(self, buf: bytes) -> bytes:
        if not buf:
            return b""
        nonce = os.urandom(_NONCE)
        kid = self.kid.encode()
        sealed = self._aead[self.kid].encrypt(nonce, bytes(buf), _AAD + kid)
        return ENVELOPE + kid + b"." + base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=") + _END

    def open(self, buf: bytes) -> bytes:
        """`decode`, synchronously (for tools and tests that read values outside an invocation)."""
        buf = bytes(buf)
        if not buf.startswith(ENVELOPE):
            return buf
        kid, _, payload = buf[len(ENVELOPE) : -len(_END)].partition(b".")
        aead = self._aead.get(kid.decode("ascii", errors="replace"))
        if not buf.endswith(_END) or aead is None:
            raise JournalValueUnreadable(
                f"journal value sealed with key id {kid[:16].decode('ascii', errors='replace')!r}, "
                "which COUNTERSIGN_JOURNAL_KEYS does not list"
            )
        try:
            raw = base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4))
            if base64.urlsafe_b64encode(raw).rstrip(b"=") != payload:
                raise ValueError("non-canonical base64")
            return aead.decrypt(raw[:_NONCE], raw[_NONCE:], _AAD + kid)
        except (binascii.Error, InvalidTag, ValueError):
            raise JournalValueUnreadable("journal value failed authentication (altered or truncated)") from None

    async def decode(self, buf: bytes) -> bytes:
        return self.open(buf)


def journal_codec(settings: Settings) -> JournalCipher | None:
    """The codec for the endpoint and every client of it; None when no journal keys are configured."""
    return JournalCipher(settings.countersign_journal_keys) if settings.countersign_journal_keys else None
