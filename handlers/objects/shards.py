"""Spreading what one approver or one tool accumulates over several Virtual Object keys.

Guarantee: an approval always maps to the same shard of a key (a SHA-256 of the approval id, the same
in every process and after every restart, unlike Python's `hash`), so its events meet in one object
and stay ordered and idempotent there, while approvals of the same approver or tool land on
`SHARDS` different keys and do not queue behind one another. A shard key is the key, `#`, and two
digits: never a valid email address or tool name, so it cannot collide with a key of its own.
"""

from __future__ import annotations

import hashlib

SHARDS = 16
"""Matches the concurrency the fleet figures are measured at: 16 runs of one approver rarely share a shard."""
SEPARATOR = "#"


def shard_of(approval_id: str) -> int:
    return int.from_bytes(hashlib.sha256(approval_id.encode()).digest()[:4], "big") % SHARDS


def shard_key(key: str, approval_id: str) -> str:
    """The key of the shard of `key` (an approver's email, a tool's name) that holds `approval_id`."""
    return f"{key}{SEPARATOR}{shard_of(approval_id):02d}"


def shard_keys(key: str) -> list[str]:
    """Every shard of `key`, for a view that gathers them."""
    return [f"{key}{SEPARATOR}{n:02d}" for n in range(SHARDS)]


def is_shard(key: str) -> bool:
    head, sep, tail = key.rpartition(SEPARATOR)
    return bool(head) and sep == SEPARATOR and len(tail) == 2 and tail.isdigit()
