"""When the next thing happens to a pending approval: a reminder, an escalation, or the deadline.

Guarantee: a pure function of the journaled record and the journaled policy, so every replay waits
for the same timer; nothing is scheduled at or after the deadline except the deadline itself.
"""

from __future__ import annotations

from typing import Literal

from countersign.contract import ApprovalRecord
from countersign.tools.policy import ToolPolicy

Event = Literal["reminder", "escalate", "deadline"]


def can_escalate(record: ApprovalRecord, policy: ToolPolicy) -> bool:
    return record.escalations < len(policy.escalate_to)


def next_event(record: ApprovalRecord, policy: ToolPolicy) -> tuple[float, Event]:
    events: list[tuple[float, int, Event]] = [(record.deadline, 0, "deadline")]
    if record.reminders_sent < len(policy.reminders_seconds):
        events.append((record.round_started_at + policy.reminders_seconds[record.reminders_sent], 2, "reminder"))
    if policy.escalate_after_seconds and can_escalate(record, policy):
        events.append((record.round_started_at + policy.escalate_after_seconds, 1, "escalate"))
    at, _, event = min(e for e in events if e[0] < record.deadline or e[2] == "deadline")
    return at, event
