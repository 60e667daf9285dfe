"""The counters and histograms the handlers keep, and when a handler may count.

Guarantee: a count is made by the attempt that does the work, never by a replay. Handler code runs
again on every replay of its journal, so each `record_*` call below sits right after a journaled
step (or a decision) has returned and counts only when Restate says the invocation is not
replaying (`restate_context_is_replaying`, the flag restate.logging filters on): a step returned
from the journal counts nothing, in this process or in one restarted after a crash. Counts inside a
step body (`effect_attempt_failed`) count each attempt that ran. The one window left is Restate's own
at-least-once one: an attempt that counted and then died before its next entry reached the server
is run again, and counts again. Each process keeps its own counters; Prometheus adds them up across
processes (`sum by (...) (rate(...))`), and a restart resets a process's counters to zero, which
`rate` and `increase` take as a reset, not a drop. Labels hold names only (tool, tenant, channel,
verdict, source, outcome, status): never argument values, reasons, addresses or tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from restate.server_context import restate_context_is_replaying

REGISTRY = CollectorRegistry(auto_describe=True)
"""Countersign's own registry (not the library-wide default one), served by `/metrics`."""
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

DECISION_BUCKETS = (10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0, 3 * 86400.0)
"""People decide in minutes to days: buckets from 10 s to 3 days (seconds, as Prometheus wants)."""

APPROVALS_REQUESTED = Counter(
    "countersign_approvals_requested",
    "Approvals asked of people, once per approval and channel its approvers are reached on.",
    ["tool", "tenant", "channel"],
    registry=REGISTRY,
)
APPROVALS_DECIDED = Counter(
    "countersign_approvals_decided",
    "Approvals decided: verdict approved, edited, rejected, expired, cancelled or undeliverable; "
    "source human, deadline_default or system.",
    ["tool", "verdict", "source"],
    registry=REGISTRY,
)
DECISION_SECONDS = Histogram(
    "countersign_decision_seconds",
    "Time from an approval's request to its decision.",
    ["tool", "source"],
    buckets=DECISION_BUCKETS,
    registry=REGISTRY,
)
REMINDERS_SENT = Counter(
    "countersign_reminders_sent", "Reminders sent to approvers still deciding.", ["tool"], registry=REGISTRY
)
ESCALATIONS = Counter(
    "countersign_escalations",
    "Approvals handed to the next person of the escalation chain.",
    ["tool"],
    registry=REGISTRY,
)
DELIVERIES_FAILED = Counter(
    "countersign_deliveries_failed",
    "Approval requests that did not reach an approver: refused for good by the provider, or bounced.",
    ["channel", "reason"],
    registry=REGISTRY,
)
EFFECTS = Counter(
    "countersign_effects",
    "Tool effects that ended: outcome succeeded, refused (a ToolError) or failed (retries exhausted).",
    ["tool", "outcome"],
    registry=REGISTRY,
)
EFFECT_ATTEMPTS_FAILED = Counter(
    "countersign_effect_attempts_failed",
    "Attempts of a tool effect that raised and were retried (or given up).",
    ["tool"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES_FAILED = Counter(
    "countersign_webhook_deliveries_failed",
    "Outbound webhook events that were never delivered: gave_up after every attempt, or dropped.",
    ["outcome"],
    registry=REGISTRY,
)
RUNS_FINISHED = Counter(
    "countersign_runs_finished",
    "Agent runs that ended, by status (completed, failed, cancelled, model_retired).",
    ["status"],
    registry=REGISTRY,
)

VERDICT_LABEL = {"approved_with_edits": "edited"}
"""How an approval's state is named in the `verdict` label (the rest keep their own names)."""


def fresh() -> bool:
    """Whether the code that calls this runs for the first time (not a replay of the journal)."""
    return not restate_context_is_replaying.get()


def record_requested(tool: str, tenant: str, channels: Iterable[str]) -> None:
    if fresh():
        for channel in sorted(set(channels)):
            APPROVALS_REQUESTED.labels(tool, tenant, channel).inc()


def record_decided(tool: str, state: str, source: str, seconds: float) -> None:
    if fresh():
        APPROVALS_DECIDED.labels(tool, VERDICT_LABEL.get(state, state), source).inc()
        DECISION_SECONDS.labels(tool, source).observe(max(0.0, seconds))


def record_reminder(tool: str) -> None:
    if fresh():
        REMINDERS_SENT.labels(tool).inc()


def record_escalation(tool: str) -> None:
    if fresh():
        ESCALATIONS.labels(tool).inc()


def record_delivery_failed(channel: str, reason: str) -> None:
    if fresh():
        DELIVERIES_FAILED.labels(channel, reason).inc()


def record_effect(tool: str, outcome: str) -> None:
    if fresh():
        EFFECTS.labels(tool, outcome).inc()


def effect_attempt_failed(tool: str) -> None:
    """Inside the effect's step body: the attempt ran, whatever the journal holds."""
    EFFECT_ATTEMPTS_FAILED.labels(tool).inc()


def record_webhook_failed(outcome: str) -> None:
    if fresh():
        WEBHOOK_DELIVERIES_FAILED.labels(outcome).inc()


def record_run_finished(status: str) -> None:
    if fresh():
        RUNS_FINISHED.labels(status).inc()
