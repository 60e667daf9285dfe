"""The audit trail of an approval: append-only and hash-chained (`ApprovalAudit/<approval id>/entries`).

Guarantee: entry n stores `hash = SHA-256(hash of entry n-1 || canonical JSON of entry n)`, so
`verify` detects any changed, removed or reordered entry. An append with an `entry_id` already in
the chain and the same content returns the existing entry, so a retried step never appends twice;
the same id with *different* content is never silently kept or dropped: it is appended too, logged,
and `verify` reports the conflict, so a forged or corrupted entry cannot hide the real one. The one
exception is a second `requested` entry, which `Bookkeeping` drops with what came with it before it
gets here (`asks_again`): it tells of a caller that the approval refused, not of anything that happened.

Where it is kept: its run's shard of `Bookkeeping` (countersign.objects.bookkeeping) holds the chain,
written by the one call per phase that also brings the inboxes and the trust figures up to date.
An approval whose trail an older version began elsewhere keeps that chain there: in the
`ApprovalAudit` object itself (its `append` handlers stay for runs still waiting on that version),
or in the shard the first `Bookkeeping` picked by the approval id. `entries` returns them all,
oldest first, and `verify` checks each chain on its own (a chain starts at sequence 0). Only
Countersign's own services can append (`ingress_private`); the ingress can only read.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from typing import Any, Literal

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext

from countersign import retention
from countersign.objects.shards import ask_books, books_key, first_books_key

logger = logging.getLogger("countersign.audit")

AuditKind = Literal[
    "requested",
    "email_accepted",
    "page_viewed",
    "reminded",
    "escalated",
    "reassigned",
    "decided",
    "executed",
    "outcome",
    "autonomous",
    "model_retired",
    "slack_posted",
    "granted",
    "grant_created",
]
GENESIS = "0" * 64


class AuditEntry(BaseModel):
    entry_id: str
    approval_id: str
    run_id: str
    tenant: str
    kind: AuditKind
    at: float
    actor: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class AuditEntries(BaseModel):
    """Several entries for one approval, appended in order by one call."""

    entries: list[AuditEntry]


class ChainedEntry(AuditEntry):
    seq: int
    prev: str
    hash: str


class AuditLog(BaseModel):
    approval_id: str
    entries: list[ChainedEntry] = Field(default_factory=list)

    @property
    def head(self) -> str:
        return self.entries[-1].hash if self.entries else GENESIS


def entry_hash(prev: str, entry: AuditEntry, seq: int) -> str:
    body = AuditEntry.model_validate(entry.model_dump()).model_dump(mode="json")
    canonical = json.dumps({"seq": seq, **body}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(bytes.fromhex(prev) + canonical.encode()).hexdigest()


def chain(prev: str, seq: int, entry: AuditEntry) -> ChainedEntry:
    return ChainedEntry(**entry.model_dump(), seq=seq, prev=prev, hash=entry_hash(prev, entry, seq))


def verify(entries: list[ChainedEntry]) -> list[str]:
    """Problems in one approval's trail, in order; empty when it is intact. The trail is one chain,
    or several (see above): each further chain begins where an entry starts over at sequence 0."""
    problems: list[str] = []
    starts = [i for i, entry in enumerate(entries) if i == 0 or entry.seq == 0]
    for begin, end in zip(starts, [*starts[1:], len(entries)], strict=True):
        problems += _verify_chain(entries[begin:end], begin)
    return problems


def _verify_chain(entries: list[ChainedEntry], offset: int) -> list[str]:
    problems = []
    prev = GENESIS
    first_of: dict[str, int] = {}
    for position, entry in enumerate(entries):
        where = f"{entry.approval_id} entry {offset + position}"
        if (earlier := first_of.setdefault(entry.entry_id, position)) != position:
            problems.append(
                f"{where}: entry id {entry.entry_id!r} was already used by entry {earlier} with other content "
                "(conflicting entries: one of them is forged or corrupted)"
            )
        if entry.seq != position:
            problems.append(f"{where}: sequence {entry.seq} out of order (removed or reordered entries)")
        if entry.prev != prev:
            problems.append(f"{where}: does not follow the previous entry (removed or reordered entries)")
        if entry.hash != entry_hash(entry.prev, entry, entry.seq):
            problems.append(f"{where}: content does not match its hash (changed entry)")
        prev = entry.hash
    return problems


def append_loaded(ctx: ObjectContext, key: str, log: AuditLog, entries: Iterable[AuditEntry]) -> None:
    """Append `entries` to `log`, the chain as read from the state key `key`, and write it back if it grew."""
    known = len(log.entries)
    for entry in entries:
        _append(log, entry)
    if len(log.entries) > known:
        ctx.set(key, log)


approval_audit = restate.VirtualObject("ApprovalAudit", description="Hash-chained audit trail of one approval.")
_KEY = "log"


# What an older version sent: runs still waiting on it append here. Never the ingress, where anyone
# could write a predictable entry id.
@approval_audit.handler(name="append", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def append(ctx: ObjectContext, entry: AuditEntry) -> ChainedEntry:
    log = await ctx.get(_KEY, type_hint=AuditLog) or AuditLog(approval_id=ctx.key())
    known = len(log.entries)
    chained = _append(log, entry)
    if len(log.entries) > known:
        ctx.set(_KEY, log)
    return chained


@approval_audit.handler(name="append_all", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def append_all(ctx: ObjectContext, batch: AuditEntries) -> None:
    log = await ctx.get(_KEY, type_hint=AuditLog) or AuditLog(approval_id=ctx.key())
    append_loaded(ctx, _KEY, log, batch.entries)


def asks_again(log: AuditLog, entries: Iterable[AuditEntry]) -> bool:
    """Whether `entries` hold a `requested` entry that `log` already holds with other content: a
    second caller asking at a placement (run id and index) that was asked before. Its approval's
    workflow refuses that caller, so nothing it tells of happened (see countersign.objects.bookkeeping)."""
    asked = [e for e in entries if e.kind == "requested"]
    if not asked:  # most calls: no content is compared
        return False
    held = {e.entry_id: e for e in log.entries if e.kind == "requested"}
    return any(e.entry_id in held and _content(held[e.entry_id]) != _content(e) for e in asked)


def _append(log: AuditLog, entry: AuditEntry) -> ChainedEntry:
    """Append `entry` unless an identical one (same id, same content) is already in the chain."""
    wanted = _content(entry)
    conflict = False
    for existing in log.entries:
        if existing.entry_id == entry.entry_id:
            if _content(existing) == wanted:
                return existing
            conflict = True
    if conflict:
        # Both stay in the chain: `verify` names the conflict, and nothing the run wrote is lost.
        logger.warning("audit %s: entry id %r arrived again with other content", log.approval_id, entry.entry_id)
    chained = chain(log.head, len(log.entries), entry)
    log.entries.append(chained)
    return chained


def _content(entry: AuditEntry) -> dict[str, Any]:
    return AuditEntry.model_validate(entry.model_dump()).model_dump(mode="json")


@approval_audit.handler(name="entries", kind="shared", journal_retention=retention.NO_JOURNAL)
async def entries(ctx: ObjectSharedContext) -> AuditLog:
    """The approval's whole trail, oldest chain first: what this object kept (an older version's
    chain), its chain in the shard the first `Bookkeeping` picked by the approval id, then its chain
    in its run's shard (countersign.objects.shards). Each is a chain of its own (see `verify`)."""
    own = ctx.get(_KEY, type_hint=AuditLog)
    shards = list(dict.fromkeys([first_books_key(ctx.key()), books_key(ctx.key())]))
    kept = [ask_books(ctx, "audit", shard, ctx.key(), AuditLog) for shard in shards]
    entries = list((await own or AuditLog(approval_id=ctx.key())).entries)
    for chain in kept:
        entries += (await chain).entries
    return AuditLog(approval_id=ctx.key(), entries=entries)
