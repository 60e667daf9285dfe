"""Unit tests: whether approvers still read, from a scripted series of audit entries with chosen
times (a fast reader who approves everything within seconds, a slow one who reads and sometimes
edits or rejects)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from support.approver import form_csrf, wait_for_email
from support.business import new_order
from support.operator import cli
from support.processes import StackFactory, wait_until
from support.runs import refund_task

from countersign.ops.fatigue import fatigue, samples

FAST, SLOW = "fast@example.com", "slow@example.com"


def decision(
    approval: str,
    tool: str,
    approver: str,
    opened: float | None,
    after: float,
    verdict: str = "approve",
    edits: dict[str, str] | None = None,
    source: str = "human",
    unviewed_at: float = 0.0,
) -> list[dict[str, Any]]:
    """The audit entries of one approval: requested, (page viewed), decided `after` seconds later."""
    start = opened if opened is not None else unviewed_at
    entries: list[dict[str, Any]] = [
        {
            "approval_id": approval,
            "kind": "requested",
            "entry_id": "requested/r1",
            "at": start - 60,
            "details": {"tool": tool},
        }
    ]
    if opened is not None:
        for again in (0.0, 90.0):  # a second view later in the same round does not restart the clock
            entries.append(
                {
                    "approval_id": approval,
                    "kind": "page_viewed",
                    "entry_id": f"page_viewed/r1/s0/m{int(opened + again) // 60}",
                    "at": opened + again,
                    "actor": approver,
                    "details": {},
                }
            )
    entries.append(
        {
            "approval_id": approval,
            "kind": "decided",
            "entry_id": "decided/r1/s0",
            "at": start + after,
            "actor": approver,
            "details": {"verdict": verdict, "edits": edits, "source": source},
        }
    )
    return entries


def series() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    at = 1_000_000.0
    for n in range(50):  # fast: 50 unedited approvals, each 2 s after opening the page
        entries += decision(f"f-{n}-a0", "issue_refund", FAST, at + n * 1000, 2.0)
    slow_times = [30.0, 45.0, 60.0, 20.0, 120.0, 40.0, 35.0, 50.0, 25.0, 90.0]
    for n, seconds in enumerate(slow_times):
        verdict = "reject" if n == 3 else "approve"
        edits = {"amount_usd": "100.00"} if n == 5 else None
        entries += decision(f"s-{n}-a0", "email_customer", SLOW, at + 100_000 + n * 1000, seconds, verdict, edits)
    entries += decision(
        "d-0-a0", "email_customer", "deadline", at + 200_000, 1.0, verdict="reject", source="deadline_default"
    )
    entries += decision(
        "b-0-a0", "email_customer", SLOW, None, 3.0, unviewed_at=at + 300_000
    )  # decided without a recorded view
    return entries


def test_reading_times_start_at_the_first_view_of_the_round() -> None:
    found = samples(decision("x-a0", "t", FAST, 500.0, 7.5))
    assert [(s.approver, s.seconds, s.verdict) for s in found] == [(FAST, 7.5, "approve")]


def test_a_fast_reader_is_warned_about_and_a_slow_one_is_not() -> None:
    result = fatigue(series(), reading_seconds=5, streak_warning=50)
    fast, slow = result.approvers
    assert (fast.name, fast.decisions, fast.approval_rate, fast.edit_rate) == (FAST, 50, 1.0, 0.0)
    assert (fast.median_seconds_to_decide, fast.p10_seconds_to_decide, fast.fast_decisions) == (2.0, 2.0, 50)
    assert (fast.longest_streak, fast.current_fast_streak) == (50, 50)
    assert fast.warning is not None and "approved the last 50 in a row, each in under 5 s" in fast.warning
    assert result.warnings == [fast.warning]

    assert (slow.name, slow.decisions, slow.timed) == (SLOW, 11, 10), "the deadline's default is no person's"
    assert (slow.approval_rate, slow.rejection_rate, slow.edit_rate) == (0.9091, 0.0909, 0.0909)
    assert slow.median_seconds_to_decide == 42.5 and slow.p10_seconds_to_decide == 20.0
    assert slow.fast_decisions == 0 and slow.warning is None
    assert (slow.longest_streak, slow.current_streak, slow.current_fast_streak) == (5, 5, 0)


def test_the_same_series_per_tool_and_under_other_thresholds() -> None:
    result = fatigue(series(), reading_seconds=5, streak_warning=50)
    assert [(t.name, t.decisions) for t in result.tools] == [("email_customer", 11), ("issue_refund", 50)]
    one_short = fatigue(series(), reading_seconds=5, streak_warning=51)
    assert one_short.warnings == []
    patient = fatigue(series(), reading_seconds=1, streak_warning=50)
    assert patient.warnings == [] and patient.approvers[0].fast_decisions == 0
    strict = fatigue(series(), reading_seconds=3600, streak_warning=5)
    # The slow reader's latest decision has no recorded view: not known to be fast, so no streak.
    assert [a.name for a in strict.approvers if a.warning] == [FAST]


def test_stats_reads_the_real_audit_trail(private_stacks: StackFactory) -> None:
    """Three refunds decided through their pages; what counts as fast is set by the command (an hour),
    so the figures do not depend on how quickly this machine runs."""
    stack = private_stacks()
    for n in range(3):
        run = f"fatigue-{n}"
        stack.ingress.start_run(run, refund_task(new_order(stack.db_path, 100000)))
        [mail] = wait_for_email(stack.outbox_dir, run)
        csrf = form_csrf(mail.link)  # opens the page (GET): the `page_viewed` entry
        reply = httpx.post(
            mail.link, data={"csrf": csrf, "verdict": "approve"}, headers={"Origin": stack.app.url}, timeout=30
        )
        assert reply.status_code == 200, reply.text
        stack.ingress.wait_output(run)

    def reviewers(*flags: str) -> list[dict[str, Any]] | None:
        done = cli(stack.restate, "stats", "--reviewers", "--json", "--reading-time", "1h", *flags)
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        return rows if rows and rows[0]["timed"] == 3 else None

    [finance] = wait_until(lambda: reviewers("--streak", "3"), 30, "three timed decisions in the audit trail")
    assert (finance["name"], finance["decisions"], finance["approval_rate"]) == ("finance@example.com", 3, 1.0)
    assert finance["current_fast_streak"] == 3 and finance["median_seconds_to_decide"] is not None
    assert "approved the last 3 in a row" in finance["warning"]
    [calm] = reviewers("--streak", "4") or []
    assert calm["warning"] is None

    table = cli(stack.restate, "stats", "--reading-time", "1h", "--streak", "3")
    assert table.returncode == 0, table.stderr
    assert "GRADUATION_HINT" in table.stdout and "CURRENT_FAST_STREAK" in table.stdout
    assert "warning: finance@example.com approved the last 3 in a row" in table.stdout
    listed = json.loads(cli(stack.restate, "stats", "--json").stdout)
    [refunds] = [t for t in listed if t["tool"] == "issue_refund"]
    assert refunds["fatigue"]["decisions"] == 3, "the trust ramp's list, each tool with its reading figures"
    bad = cli(stack.restate, "stats", "--streak", "0")
    assert bad.returncode == 2 and "at least 1" in bad.stderr
