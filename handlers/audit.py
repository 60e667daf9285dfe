"""`ApprovalAudit`: an append-only, hash-chained record per approval (key = approval id).

Guarantee: entry n stores `hash = SHA-256(hash of entry n-1 || canonical JSON of entry n)`, so
`verify` detects any changed, removed or reordered entry; an append with an `entry_id` already in
the chain returns the existing entry, so a retried step never appends twice.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import restate
from pydantic import BaseModel, Field
from restate import ObjectContext, ObjectSharedContext

from handlers import retention

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
    """Problems in one approval's chain, in order; empty when it is intact."""
    problems = []
    prev = GENESIS
    for position, entry in enumerate(entries):
        where = f"{entry.approval_id} entry {position}"
        if entry.seq != position:
            problems.append(f"{where}: sequence {entry.seq} out of order (removed or reordered entries)")
        if entry.prev != prev:
            problems.append(f"{where}: does not follow the previous entry (removed or reordered entries)")
        if entry.hash != entry_hash(entry.prev, entry, entry.seq):
            problems.append(f"{where}: content does not match its hash (changed entry)")
        prev = entry.hash
    return problems


approval_audit = restate.VirtualObject("ApprovalAudit", description="Hash-chained audit trail of one approval.")
_KEY = "log"


@approval_audit.handler(name="append", journal_retention=retention.NO_JOURNAL)
async def append(ctx: ObjectContext, entry: AuditEntry) -> ChainedEntry:
    log = await ctx.get(_KEY, type_hint=AuditLog) or AuditLog(approval_id=ctx.key())
    known = len(log.entries)
    chained = _append(log, entry)
    if len(log.entries) > known:
        ctx.set(_KEY, log)
    return chained


@approval_audit.handler(name="append_all", journal_retention=retention.NO_JOURNAL)
async def append_all(ctx: ObjectContext, batch: AuditEntries) -> None:
    log = await ctx.get(_KEY, type_hint=AuditLog) or AuditLog(approval_id=ctx.key())
    known = len(log.entries)
    for entry in batch.entries:
        _append(log, entry)
    if len(log.entries) > known:
        ctx.set(_KEY, log)


def _append(log: AuditLog, entry: AuditEntry) -> ChainedEntry:
    for existing in log.entries:
        if existing.entry_id == entry.entry_id:
            return existing
    chained = chain(log.head, len(log.entries), entry)
    log.entries.append(chained)
    return chained


@approval_audit.handler(name="entries", kind="shared", journal_retention=retention.NO_JOURNAL)
async def entries(ctx: ObjectSharedContext) -> AuditLog:
    return await ctx.get(_KEY, type_hint=AuditLog) or AuditLog(approval_id=ctx.key())
