"""The trust ramp: per tool, how people decide, and when gating it costs more than it protects.

Guarantee: `ToolStats` (a Virtual Object per tool) counts each approval once (by approval id) from
journaled sends of the runs (`record` is `ingress_private`); `TrustRamp/report` returns every
tool's figures as JSON. The graduation hint appears only after enough human decisions with no rejection and no edit.
Calls stopped by a confidence-gated checkpoint are also counted per trigger (`confidence`, `check`):
how many it stopped and how many of those people then rejected, so a team sees whether it catches
what approvers turn down.

Cost: a tool's samples are spread over the `Bookkeeping` shards (countersign.objects.bookkeeping; an
approval always in the same one, which takes its sample in the same call as its audit entries and
inbox events), each holding the tool's last `SHARD_SAMPLES` samples in a ring, one state key per
sample, so a decision writes two small values (its slot and the counts) whatever the history, and
decisions of one tool do not queue behind one object. A sample is counted once because each
approval sends it once, with its last notices (journaled: Restate delivers it exactly once).
`stats` on the tool's own key merges those shards, and what an older version kept in `ToolStats`
itself: one value on the tool's key, and rings on its shard keys `tool#00` … `tool#15` (whose
`record` stays for runs still waiting on that version).
"""

from __future__ import annotations

import statistics

import restate
from pydantic import BaseModel, Field
from restate import Context, ObjectContext, ObjectSharedContext

from countersign import retention
from countersign.objects.shards import SHARDS, ask_books, books_keys, is_shard, shard_keys
from countersign.settings import get_settings
from countersign.tools import default_registry

MAX_SAMPLES = 2000
"""The samples the figures are computed from, over all of a tool's shards: the most recent ones."""
SHARD_SAMPLES = -(-MAX_SAMPLES // SHARDS)


class OutcomeSample(BaseModel):
    approval_id: str
    outcome: str
    human: bool
    seconds_to_decision: float | None = None
    edited: bool = False
    triggers: list[str] = Field(default_factory=list)
    """The checkpoints that stopped the call (`confidence`, `check`); empty when only the policy gated it."""


class TriggerFigures(BaseModel):
    """The calls one kind of checkpoint stopped, and how they ended."""

    gated: int = 0
    approved: int = 0
    rejected: int = 0
    edited: int = 0
    other: int = 0
    """Expired, cancelled, superseded, undeliverable or failed."""

    @property
    def rejection_rate(self) -> float | None:
        decided = self.approved + self.rejected
        return round(self.rejected / decided, 3) if decided else None


class Samples(BaseModel):
    """Samples and counts of one tool, as one key (or one shard) holds them."""

    samples: list[OutcomeSample] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    triggers: dict[str, TriggerFigures] = Field(default_factory=dict)


class RingHead(BaseModel):
    """A ring's small bookkeeping value: how many samples it took, and the counts by outcome."""

    taken: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    triggers: dict[str, TriggerFigures] = Field(default_factory=dict)


class ToolFigures(BaseModel):
    tool: str
    total: int
    counts: dict[str, int]
    human_decisions: int
    approval_rate: float | None
    rejection_rate: float | None
    edit_rate: float | None
    expiry_rate: float | None
    median_seconds_to_decision: float | None
    p90_seconds_to_decision: float | None
    graduation_hint: str | None
    grant_uses: int = 0
    """Calls that ran covered by a standing approval: neither people's decisions nor autonomous calls."""
    triggers: dict[str, TriggerFigures] = Field(default_factory=dict)
    """Per checkpoint kind (`confidence`, `check`): calls it stopped and how people decided them."""
    trigger_rejection_rates: dict[str, float | None] = Field(default_factory=dict)


class TrustReport(BaseModel):
    tools: list[ToolFigures]


tool_stats = restate.VirtualObject("ToolStats", description="Decision figures of one gated tool.")
trust_ramp = restate.Service("TrustRamp", description="Decision figures of every tool, for the trust ramp.")


_HEAD = "head"
_SAMPLE = "sample:"
_RING = "ring:"
_LEGACY = "samples"


def booked_head(tool: str) -> str:
    """The state key, in a `Bookkeeping` shard, of `tool`'s ring head; its slots are under this key,
    `:`, and the slot number."""
    return f"tool:{tool}"


def book_sample(ctx: ObjectContext, tool: str, head: RingHead, sample: OutcomeSample) -> None:
    """Put `sample` in the next slot of `tool`'s ring in this `Bookkeeping` shard (the sample it
    overwrites leaves the figures; its count stays), and count it (`head`, as read, is updated)."""
    ctx.set(f"{booked_head(tool)}:{head.taken % SHARD_SAMPLES}", sample)
    head.taken += 1
    head.counts[sample.outcome] = head.counts.get(sample.outcome, 0) + 1
    _count_triggers(head.triggers, sample)
    ctx.set(booked_head(tool), head)


async def booked_samples(ctx: ObjectSharedContext, tool: str) -> Samples:
    """`tool`'s ring in this `Bookkeeping` shard, oldest sample first, and its counts. Every slot is
    asked for before any is awaited (one round trip); the keys are never listed."""
    head = await ctx.get(booked_head(tool), type_hint=RingHead)
    if head is None:
        return Samples()
    slots = range(head.taken - min(head.taken, SHARD_SAMPLES), head.taken)
    asked = [ctx.get(f"{booked_head(tool)}:{n % SHARD_SAMPLES}", type_hint=OutcomeSample) for n in slots]
    found = [sample for sample in [await a for a in asked] if sample is not None]
    return Samples(samples=found, counts=dict(head.counts), triggers=dict(head.triggers))


# What an older version sent: runs still waiting on it record here, on the tool's shard keys. Never
# the ingress: a sample from there would skew the ramp. Lazy state: a record reads three small
# values, not the shard's whole ring.
@tool_stats.handler(name="record", enable_lazy_state=True, journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def record(ctx: ObjectContext, sample: OutcomeSample) -> None:
    if await ctx.get(_SAMPLE + sample.approval_id, type_hint=OutcomeSample) is not None:
        return
    head = await ctx.get(_HEAD, type_hint=RingHead) or RingHead()
    # A ring of SHARD_SAMPLES slots: the sample it overwrites leaves the figures (its count stays).
    slot = f"{_RING}{head.taken % SHARD_SAMPLES}"
    if (evicted := await ctx.get(slot, type_hint=str)) is not None:
        ctx.clear(_SAMPLE + evicted)
    ctx.set(slot, sample.approval_id)
    ctx.set(_SAMPLE + sample.approval_id, sample)
    head.taken += 1
    head.counts[sample.outcome] = head.counts.get(sample.outcome, 0) + 1
    _count_triggers(head.triggers, sample)
    ctx.set(_HEAD, head)


def _count_triggers(into: dict[str, TriggerFigures], sample: OutcomeSample) -> None:
    for kind in sample.triggers:
        counted = into.setdefault(kind, TriggerFigures())
        counted.gated += 1
        if sample.outcome in ("approved", "approved_with_edits"):
            counted.approved += 1
        elif sample.outcome == "rejected":
            counted.rejected += 1
        else:
            counted.other += 1
        counted.edited += int(sample.edited)


def _add_triggers(into: dict[str, TriggerFigures], more: dict[str, TriggerFigures]) -> None:
    for kind, counted in more.items():
        mine = into.setdefault(kind, TriggerFigures())
        for name in ("gated", "approved", "rejected", "edited", "other"):
            setattr(mine, name, getattr(mine, name) + getattr(counted, name))


async def _own(ctx: ObjectSharedContext) -> Samples:
    """What this key holds: a shard's ring, or the single value an older version kept per tool."""
    data = await ctx.get(_LEGACY, type_hint=Samples) or Samples()
    head = await ctx.get(_HEAD, type_hint=RingHead)
    if head is not None:
        for key in await ctx.state_keys():
            if key.startswith(_SAMPLE) and (found := await ctx.get(key, type_hint=OutcomeSample)) is not None:
                data.samples.append(found)
        _add_counts(data.counts, head.counts)
        _add_triggers(data.triggers, head.triggers)
    return data


def _add_counts(into: dict[str, int], more: dict[str, int]) -> None:
    for outcome, n in more.items():
        into[outcome] = into.get(outcome, 0) + n


# Private: `stats` gathers the shards; the raw samples are not part of what the ingress offers.
@tool_stats.handler(name="samples", kind="shared", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def samples(ctx: ObjectSharedContext) -> Samples:
    """This key's own samples and counts (one shard's share of a tool's figures)."""
    return await _own(ctx)


@tool_stats.handler(name="stats", kind="shared", journal_retention=retention.NO_JOURNAL)
async def stats(ctx: ObjectSharedContext) -> ToolFigures:
    data = await _own(ctx)
    if not is_shard(ctx.key()):
        # Every call is made before any answer is awaited: the shards answer side by side.
        older = [ctx.object_call(samples, key=shard, arg=None) for shard in shard_keys(ctx.key())]
        booked = [ask_books(ctx, "samples", key, ctx.key(), Samples) for key in books_keys()]
        for part in [*older, *booked]:
            shard = await part
            data.samples.extend(shard.samples)
            _add_counts(data.counts, shard.counts)
            _add_triggers(data.triggers, shard.triggers)
    # The shards hold at most MAX_SAMPLES together; an older version's samples (first) make up the rest.
    data.samples = data.samples[-MAX_SAMPLES:]
    found = figures(ctx.key(), data.samples, data.counts, get_settings().trust_ramp_min_decisions)
    rates = {kind: counted.rejection_rate for kind, counted in data.triggers.items()}
    return found.model_copy(update={"triggers": data.triggers, "trigger_rejection_rates": rates})


def figures(tool: str, samples: list[OutcomeSample], counts: dict[str, int], min_decisions: int) -> ToolFigures:
    total = sum(counts.values())
    human = [s for s in samples if s.human]
    approved = sum(1 for s in human if s.outcome in ("approved", "approved_with_edits"))
    rejected = sum(1 for s in human if s.outcome == "rejected")
    edited = sum(1 for s in human if s.edited)
    expired = counts.get("expired", 0)
    times = sorted(s.seconds_to_decision for s in human if s.seconds_to_decision is not None)

    def rate(n: int, of: int) -> float | None:
        return round(n / of, 3) if of else None

    hint = None
    if len(human) >= min_decisions and rejected == 0 and edited == 0:
        hint = (
            f"{len(human)} human decisions, none rejected or edited: consider making {tool} autonomous "
            f"or raising its threshold"
        )
    return ToolFigures(
        tool=tool,
        total=total,
        counts=counts,
        human_decisions=len(human),
        approval_rate=rate(approved, len(human)),
        rejection_rate=rate(rejected, len(human)),
        edit_rate=rate(edited, len(human)),
        expiry_rate=rate(expired, total),
        median_seconds_to_decision=round(statistics.median(times), 3) if times else None,
        p90_seconds_to_decision=round(times[min(len(times) - 1, int(0.9 * len(times)))], 3) if times else None,
        graduation_hint=hint,
        grant_uses=counts.get("granted", 0),
    )


@trust_ramp.handler(name="report", journal_retention=retention.NO_JOURNAL)
async def report(ctx: Context) -> TrustReport:
    """Every gated tool's figures."""
    tools = [t.name for t in default_registry() if t.policy.gated or t.policy.has_checkpoints]
    return TrustReport(tools=[await ctx.object_call(stats, key=name, arg=None) for name in tools])
