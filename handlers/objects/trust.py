"""The trust ramp: per tool, how people decide, and when gating it costs more than it protects.

Guarantee: `ToolStats` (a Virtual Object per tool) counts each approval once (by approval id) from
journaled sends of the runs (`record` is `ingress_private`); `TrustRamp/report` returns every
tool's figures as JSON. The graduation hint appears only after enough human decisions with no rejection and no edit.
Calls stopped by a confidence-gated checkpoint are also counted per trigger (`confidence`, `check`):
how many it stopped and how many of those people then rejected, so a team sees whether it catches
what approvers turn down.
"""

from __future__ import annotations

import statistics

import restate
from pydantic import BaseModel, Field
from restate import Context, ObjectContext, ObjectSharedContext

from handlers import retention
from handlers.settings import get_settings
from handlers.tools import default_registry

MAX_SAMPLES = 2000


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


class _Samples(BaseModel):
    samples: list[OutcomeSample] = Field(default_factory=list)
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
    triggers: dict[str, TriggerFigures] = Field(default_factory=dict)
    """Per checkpoint kind (`confidence`, `check`): calls it stopped and how people decided them."""
    trigger_rejection_rates: dict[str, float | None] = Field(default_factory=dict)


class TrustReport(BaseModel):
    tools: list[ToolFigures]


tool_stats = restate.VirtualObject("ToolStats", description="Decision figures of one gated tool.")
trust_ramp = restate.Service("TrustRamp", description="Decision figures of every tool, for the trust ramp.")


# Only the runs record samples (journaled sends): a sample from the ingress would skew the ramp.
@tool_stats.handler(name="record", journal_retention=retention.NO_JOURNAL, ingress_private=True)
async def record(ctx: ObjectContext, sample: OutcomeSample) -> None:
    data = await ctx.get("samples", type_hint=_Samples) or _Samples()
    if any(s.approval_id == sample.approval_id for s in data.samples):
        return
    data.samples = [*data.samples, sample][-MAX_SAMPLES:]
    data.counts[sample.outcome] = data.counts.get(sample.outcome, 0) + 1
    for kind in sample.triggers:
        counted = data.triggers.setdefault(kind, TriggerFigures())
        counted.gated += 1
        if sample.outcome in ("approved", "approved_with_edits"):
            counted.approved += 1
        elif sample.outcome == "rejected":
            counted.rejected += 1
        else:
            counted.other += 1
        counted.edited += int(sample.edited)
    ctx.set("samples", data)


@tool_stats.handler(name="stats", kind="shared", journal_retention=retention.NO_JOURNAL)
async def stats(ctx: ObjectSharedContext) -> ToolFigures:
    data = await ctx.get("samples", type_hint=_Samples) or _Samples()
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
    )


@trust_ramp.handler(name="report", journal_retention=retention.NO_JOURNAL)
async def report(ctx: Context) -> TrustReport:
    """Every gated tool's figures."""
    tools = [t.name for t in default_registry() if t.policy.gated or t.policy.has_checkpoints]
    return TrustReport(tools=[await ctx.object_call(stats, key=name, arg=None) for name in tools])
