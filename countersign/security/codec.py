"""Journal values encrypted with AES-256-GCM before Restate stores them, compressed when that pays.

Guarantee: with `COUNTERSIGN_JOURNAL_KEYS` set, every value the SDK passes through its journal value
codec (handler input and output, `ctx.run` results, state, promise values, call and send parameters)
is stored as a JSON envelope sealed with the first key:

* `{"countersign:v2":"<kid>.<base64url(nonce | ciphertext | tag)>"}` for a value of at least
  `COMPRESS_FROM` bytes that raw DEFLATE makes shorter: the ciphertext is of the compressed value;
* `{"countersign:v1":"<kid>.<base64url(nonce | ciphertext | tag)>"}` for every other value (and for
  every value written before v2 existed: both versions open, so old journals still replay).

`COUNTERSIGN_JOURNAL_COMPRESS=false` writes only v1, for the one upgrade from a version that cannot
open v2 while it still serves paused runs. Every listed key opens (rotation), and a changed byte
fails authentication: the version and the key id are associated data, so relabelling a v2 value as
v1 (or a key's value as another key's) is refused.
Opening a v2 value inflates at most `MAX_OPENED` bytes and refuses anything larger (a decompression
bomb) with `JournalValueUnreadable`, as it does a stream that does not end exactly where the
ciphertext does. Plain JSON (a body sent with curl, a value journaled before encryption was switched
on) passes through `decode` unchanged. Failures never reach the codec: `countersign.security.redact`
scrubs them.

What compression exposes: the sealed length of a v2 value depends on how repetitive its plaintext
is, not only on how long it is (CRIME-style). Only whoever can read Restate's storage sees those
lengths, and they already see which runs, approvals, state keys and step names exist. Learning a
secret that way needs chosen text compressed next to it, once per guess, observed each time. The bearer
secrets in journal values, an approval link's token (in the `decide` and `viewed` inputs) and Slack's
verification token in a Slack interaction's raw body (`slack_decide`), only share a value with fields
sent by whoever presents them, so guessing it needs it already; other
values mix a requester's text with facts about the same run (the order, the approvers), and a guess
costs the requester a whole gated run, with its email to the approvers. Values under `COMPRESS_FROM`
bytes are not compressed: they gain little, and they are the short control values (decisions,
inbox entries, run headers). Padding to hide the rest would cost more bytes than compression saves.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import zlib
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from restate import JournalValueCodec

from countersign.settings import Settings

ENVELOPE = b'{"countersign:v'
"""How every sealed value begins, whatever its version: what readers that only detect sealing test."""
ENVELOPE_V1 = ENVELOPE + b'1":"'
ENVELOPE_V2 = ENVELOPE + b'2":"'
_VERSION = re.compile(rb'\{"countersign:v(\d{1,8})":"')
_END = b'"}'
_AAD = {ENVELOPE_V1: b"countersign.journal.v1\x00", ENVELOPE_V2: b"countersign.journal.v2\x00"}
_NONCE = 12

COMPRESS_FROM = 128
"""Measured on one demo run's values (JSON records, requests, model turns, audit entries): a value
of 134 bytes sealed 28 bytes shorter (of 240), one of 79 bytes only 7 (of 167), one of 230 bytes 106
(of 368). Raising it to 256 would cost about 0.7 KB per paused run, to 512 about 2 KB."""
COMPRESS_LEVEL = 6
"""zlib's default. On those values (0.2-2.4 KB) levels 6 and 9 give the same sizes at the same speed,
and 1-3 are 1-5% larger for no time saved; on a 1 MB value 9 took 17% longer than 6."""
MAX_OPENED = 32 * 1024 * 1024
"""The most a v2 value may inflate to: Restate's 32 MiB message limit. A v1 envelope could never
carry a plaintext that big (base64 adds a third), so no value that could be stored before is refused,
and `encode` never compresses a value larger than `open` would inflate. It bounds what one bad value
(sealed by a holder of the key) can make a reader allocate: about twice this, then refused."""
_WBITS = -15  # raw DEFLATE: no zlib header or Adler-32, which GCM's tag already makes redundant
_MEM_LEVEL = 7
"""With a window no larger than the value (`_window`), zlib's state for a journal value stays under
100 KB instead of 256 KB; on this project's values the output is the same, and sealing in the handler
took 48 instead of 68 microseconds a value (measured in the approval bench, 9,760 values). Inflating
with the largest window reads any of these streams, so the format is unchanged."""


def _window(size: int) -> int:
    """Raw DEFLATE window bits for a value of `size` bytes: the smallest window that holds it (9 to 15)."""
    return -max(9, min(15, size.bit_length()))


class JournalValueUnreadable(ValueError):
    """A sealed value this process cannot open: unknown key id or version, altered bytes, or too big."""


class JournalCipher(JournalValueCodec):
    def __init__(self, keys: Mapping[str, bytes], *, compress: bool = True) -> None:
        """`compress=False` writes only v1 (see COUNTERSIGN_JOURNAL_COMPRESS); both versions always open."""
        if not keys:
            raise ValueError("a journal cipher needs at least one key")
        self.kid = next(iter(keys))
        self.compress = compress
        self._aead = {kid: AESGCM(key) for kid, key in keys.items()}

    def encode(self, buf: bytes) -> bytes:
        if not buf:
            return b""
        plain, prefix = bytes(buf), ENVELOPE_V1
        if self.compress and COMPRESS_FROM <= len(plain) <= MAX_OPENED:
            deflate = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, _window(len(plain)), _MEM_LEVEL)
            packed = deflate.compress(plain) + deflate.flush()
            if len(packed) < len(plain):
                plain, prefix = packed, ENVELOPE_V2
        nonce = os.urandom(_NONCE)
        kid = self.kid.encode()
        sealed = self._aead[self.kid].encrypt(nonce, plain, _AAD[prefix] + kid)
        return prefix + kid + b"." + base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=") + _END

    def open(self, buf: bytes) -> bytes:
        """`decode`, synchronously (for tools and tests that read values outside an invocation)."""
        buf = bytes(buf)
        if buf.startswith(ENVELOPE_V1):
            prefix = ENVELOPE_V1
        elif buf.startswith(ENVELOPE_V2):
            prefix = ENVELOPE_V2
        elif (version := _VERSION.match(buf)) is not None:
            # A newer format (or a damaged one): passing it through as plain JSON would hand the
            # handler an envelope instead of its value.
            raise JournalValueUnreadable(
                f"journal value in envelope version v{version[1].decode()}, which this version cannot read"
            )
        else:
            return buf
        kid, _, payload = buf[len(prefix) : -len(_END)].partition(b".")
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
            plain = aead.decrypt(raw[:_NONCE], raw[_NONCE:], _AAD[prefix] + kid)
        except (binascii.Error, InvalidTag, ValueError):
            raise JournalValueUnreadable("journal value failed authentication (altered or truncated)") from None
        return plain if prefix == ENVELOPE_V1 else _inflate(plain)

    async def decode(self, buf: bytes) -> bytes:
        return self.open(buf)


def _inflate(packed: bytes) -> bytes:
    """An authenticated v2 plaintext, inflated to at most MAX_OPENED bytes."""
    inflate = zlib.decompressobj(_WBITS)
    try:
        # One byte of room past the limit: a value of exactly MAX_OPENED bytes still reaches its end.
        plain = inflate.decompress(packed, MAX_OPENED + 1)
    except zlib.error:
        raise JournalValueUnreadable("journal value is not a DEFLATE stream") from None
    if len(plain) > MAX_OPENED:
        raise JournalValueUnreadable(f"journal value inflates past {MAX_OPENED // 2**20} MiB")
    if not inflate.eof or inflate.unused_data:
        raise JournalValueUnreadable("journal value is not one whole DEFLATE stream")
    return plain


def journal_codec(settings: Settings) -> JournalCipher | None:
    """The codec for the endpoint and every client of it; None when no journal keys are configured."""
    if not settings.countersign_journal_keys:
        return None
    return JournalCipher(settings.countersign_journal_keys, compress=settings.countersign_journal_compress)
