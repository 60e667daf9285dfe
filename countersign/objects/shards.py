"""Spreading what the approvals leave behind over several Virtual Object keys.

Guarantee: an approval always maps to the same shard (a SHA-256, the same in every process and after
every restart, unlike Python's `hash`), so its events meet in one object and stay ordered and
idempotent there, while approvals of the same approver or tool land on `SHARDS` different keys and do
not queue behind one another. Today's keys are `Bookkeeping`'s, the shard number alone, picked by
the approval's run (`books_key`), so that all a run's approvals and autonomous calls tell at one
point travel in one call. The first version of `Bookkeeping` picked by the approval id itself
(`first_books_key`); an older one kept an approver's inbox and a tool's figures on keys of their own
objects, the approver's or tool's name, `#`, and the shard number (`shard_key`): never a valid email
address or tool name, so it cannot collide with a key of its own. The views still read both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable
from typing import TypeVar

import restate
from pydantic import BaseModel

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


BOOKS_SERVICE = "Bookkeeping"
"""The object whose shards hold every approval's inbox entries, audit trail and trust sample
(countersign.objects.bookkeeping). Its keys are the shard numbers alone."""
_JSON = {"content-type": "application/json"}
M = TypeVar("M", bound=BaseModel)


def books_key(approval_id: str) -> str:
    """The `Bookkeeping` key that holds what is kept about `approval_id`: its run's shard."""
    return f"{shard_of(_run_part(approval_id)):02d}"


def first_books_key(approval_id: str) -> str:
    """Where the first version of `Bookkeeping` kept `approval_id` (by the approval id itself); an
    approval that began before the upgrade has the start of its trail there."""
    return f"{shard_of(approval_id):02d}"


def _run_part(approval_id: str) -> str:
    """The run of an approval id (`<run id>-a<index>`, countersign.security.links); the id itself if it
    is not of that form."""
    run_id, sep, index = approval_id.rpartition("-a")
    return run_id if sep and run_id and index.isdigit() else approval_id


def books_keys() -> list[str]:
    """Every `Bookkeeping` key, for a view that gathers them."""
    return [f"{n:02d}" for n in range(SHARDS)]


def ask_books(ctx: restate.ObjectSharedContext, reader: str, key: str, arg: str, answer: type[M]) -> Awaitable[M]:
    """Call one of `Bookkeeping`'s shared readers by name (the objects it serves import nothing of it,
    so that it can import their storage code), and parse its answer."""
    call = ctx.generic_call(BOOKS_SERVICE, reader, json.dumps(arg).encode(), key=key, headers=_JSON)

    async def parsed() -> M:
        return answer.model_validate_json(await call)

    return parsed()
