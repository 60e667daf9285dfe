"""Whether approvers still read: decision figures per tool and per approver, from the audit trail.

Guarantee: pure (no clock, no I/O) over exported audit entries, so the same trail always gives the
same figures. A person's decision is a `decided` entry with `source: human`; its reading time is from
the first `page_viewed` entry of the same approval, round and approver slot to the decision (None
when no view was recorded, e.g. an item decided on a batch page it was not opened through). A
decision is "fast" when its reading time is under `reading_seconds`; a streak counts approvals in a
row with no edit and no rejection. An approver whose latest `streak_warning` or more decisions are all
fast, unedited approvals gets a plain warning.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

_SLOT = re.compile(r"^(?:decided|page_viewed)/r(\d+)/s(\d+)(?:/|$)")


@dataclass(frozen=True)
class Sample:
    """One person's decision on one approval."""

    tool: str
    approver: str
    at: float
    verdict: str
    edited: bool
    seconds: float | None


class Figures(BaseModel):
    """The figures of one tool or one approver (`name`)."""

    name: str
    decisions: int
    approval_rate: float | None
    rejection_rate: float | None
    edit_rate: float | None
    median_seconds_to_decide: float | None
    p10_seconds_to_decide: float | None
    timed: int
    """Decisions with a recorded page view (the ones the reading times are over)."""
    fast_decisions: int
    longest_streak: int
    current_streak: int
    current_fast_streak: int
    """The latest decisions in a row that were approvals with no edit, each under the reading time."""
    warning: str | None = None
    grant_uses: int = 0
    """Calls that ran on a standing approval (of this tool, or given by this approver): not decisions."""


def _slot(entry_id: str) -> tuple[int, int] | None:
    match = _SLOT.match(entry_id)
    return (int(match.group(1)), int(match.group(2))) if match else None


def samples(entries: Iterable[Mapping[str, Any]]) -> list[Sample]:
    """The human decisions in `entries` (audit entries as exported), oldest first."""
    tools: dict[str, str] = {}
    first_view: dict[tuple[str, int, int], float] = {}
    decided: list[Mapping[str, Any]] = []
    for entry in entries:
        approval, kind = str(entry.get("approval_id", "")), entry.get("kind")
        if kind == "requested":
            tools.setdefault(approval, str(entry.get("details", {}).get("tool", "?")))
        elif kind == "page_viewed" and (where := _slot(str(entry.get("entry_id", "")))):
            key = (approval, *where)
            first_view[key] = min(first_view.get(key, math.inf), float(entry["at"]))
        elif kind == "decided":
            decided.append(entry)
    found = []
    for entry in decided:
        details = entry.get("details", {})
        if details.get("source", "human") != "human" or details.get("verdict") not in ("approve", "reject"):
            continue
        approval = str(entry["approval_id"])
        where = _slot(str(entry.get("entry_id", "")))
        at = float(entry["at"])
        viewed = first_view.get((approval, *where)) if where else None
        found.append(
            Sample(
                tool=tools.get(approval, "?"),
                approver=str(entry.get("actor") or "?"),
                at=at,
                verdict=str(details["verdict"]),
                edited=bool(details.get("edits")),
                seconds=round(at - viewed, 3) if viewed is not None and at >= viewed else None,
            )
        )
    return sorted(found, key=lambda s: s.at)


def _clean(sample: Sample) -> bool:
    return sample.verdict == "approve" and not sample.edited


def _fast(sample: Sample, reading_seconds: float) -> bool:
    return sample.seconds is not None and sample.seconds < reading_seconds


def _nearest_rank(values: list[float], fraction: float) -> float:
    return values[max(0, math.ceil(fraction * len(values)) - 1)]


def figures(name: str, group: list[Sample], reading_seconds: float) -> Figures:
    n = len(group)

    def rate(k: int) -> float | None:
        return round(k / n, 4) if n else None

    times = sorted(s.seconds for s in group if s.seconds is not None)
    longest = run = 0
    for sample in group:
        run = run + 1 if _clean(sample) else 0
        longest = max(longest, run)
    fast_streak = 0
    for sample in reversed(group):
        if not (_clean(sample) and _fast(sample, reading_seconds)):
            break
        fast_streak += 1
    return Figures(
        name=name,
        decisions=n,
        approval_rate=rate(sum(1 for s in group if s.verdict == "approve")),
        rejection_rate=rate(sum(1 for s in group if s.verdict == "reject")),
        edit_rate=rate(sum(1 for s in group if s.edited)),
        median_seconds_to_decide=round(statistics.median(times), 3) if times else None,
        p10_seconds_to_decide=round(_nearest_rank(times, 0.1), 3) if times else None,
        timed=len(times),
        fast_decisions=sum(1 for s in group if _fast(s, reading_seconds)),
        longest_streak=longest,
        current_streak=run,
        current_fast_streak=fast_streak,
    )


class Fatigue(BaseModel):
    reading_seconds: float
    streak_warning: int
    tools: list[Figures]
    approvers: list[Figures]
    warnings: list[str]


def grant_uses(entries: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """The calls a standing approval covered (`granted` entries), by tool and by who gave the grant."""
    by_tool: dict[str, int] = {}
    by_giver: dict[str, int] = {}
    for entry in entries:
        if entry.get("kind") == "granted":
            tool, giver = str(entry.get("details", {}).get("tool", "?")), str(entry.get("actor") or "?")
            by_tool[tool] = by_tool.get(tool, 0) + 1
            by_giver[giver] = by_giver.get(giver, 0) + 1
    return by_tool, by_giver


def fatigue(entries: Iterable[Mapping[str, Any]], *, reading_seconds: float, streak_warning: int) -> Fatigue:
    """Figures per tool and per approver, with a warning for each approver who looks checked out.
    Calls run on a standing approval are counted apart (`grant_uses`), never as decisions."""
    entries = list(entries)
    found = samples(entries)
    uses_of_tool, uses_by = grant_uses(entries)
    by_tool: dict[str, list[Sample]] = {t: [] for t in uses_of_tool}
    by_approver: dict[str, list[Sample]] = {a: [] for a in uses_by}
    for sample in found:
        by_tool.setdefault(sample.tool, []).append(sample)
        by_approver.setdefault(sample.approver, []).append(sample)
    tools = [figures(t, g, reading_seconds) for t, g in sorted(by_tool.items())]
    for row in tools:
        row.grant_uses = uses_of_tool.get(row.name, 0)
    approvers = []
    warnings = []
    for person, group in sorted(by_approver.items()):
        row = figures(person, group, reading_seconds)
        row.grant_uses = uses_by.get(person, 0)
        if row.current_fast_streak >= streak_warning:
            row.warning = (
                f"{person} approved the last {row.current_fast_streak} in a row, each in under "
                f"{reading_seconds:g} s, with no edit and no rejection: they may no longer be reading"
            )
            warnings.append(row.warning)
        approvers.append(row)
    return Fatigue(
        reading_seconds=reading_seconds,
        streak_warning=streak_warning,
        tools=tools,
        approvers=approvers,
        warnings=warnings,
    )
