"""Restate request identity: the ed25519 key pair with which restate-server signs its requests.

Guarantee: `ensure_key_pair` leaves a private key readable only by its owner (PEM, for
restate-server's `request-identity-private-key-pem-file`) and returns the public key in the form the
SDK's `identity_keys` expects, `publickeyv1_` + base58 of the raw 32-byte key, the same string
restate-server logs as the key's `kid`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PREFIX = "publickeyv1_"
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
PRIVATE_KEY_ENV = "RESTATE_WORKER__INVOKER__REQUEST_IDENTITY_PRIVATE_KEY_PEM_FILE"


def base58(raw: bytes) -> str:
    number = int.from_bytes(raw, "big")
    digits = ""
    while number:
        number, rest = divmod(number, 58)
        digits = _BASE58[rest] + digits
    return "1" * (len(raw) - len(raw.lstrip(b"\0"))) + digits


def public_key_id(private_pem: bytes) -> str:
    key = serialization.load_pem_private_key(private_pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the request identity key must be an ed25519 private key")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PREFIX + base58(raw)


def ensure_key_pair(path: Path) -> str:
    """Create an ed25519 private key at `path` (mode 0600) unless one is there; its public key id."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
    return public_key_id(path.read_bytes())
