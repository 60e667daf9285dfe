"""Fault points for the fault tests: `COUNTERSIGN_FAULT=<point>` makes the process die (crash
points), the step raise (fail points) or the handler wait (delay points) there.

Guarantee: honoured only when `COUNTERSIGN_ENV=test`; anywhere else a fault point is a no-op.
Crash points: `crash-after-effect:<tool>` (execute.py: a tool's effect committed, its step not yet
journaled), `crash-after-send:<kind>` (mail/deliver.py: the mailer accepted an email, its step not
yet journaled) and `crash-before-slack-decision` (approval/slack_decision.py: a Slack submission verified
and journaled, the decision not yet recorded), `crash-after-grant-use` (approval/calls.py: a standing
approval's use counted and journaled, the covered call's effect not yet run). Delay point: `slow-cancel`
(agent/run.py: a run's cancel has read the run's state and not yet completed its promise).
"""

from __future__ import annotations

import asyncio
import os

from countersign.settings import get_settings


def crash_point(name: str) -> None:
    settings = get_settings()
    if settings.countersign_env == "test" and settings.countersign_fault == name:
        os._exit(137)


def fail_point(name: str, detail: str) -> None:
    """Raise a plain exception carrying `detail` (e.g. personal data, to test that it is scrubbed)."""
    settings = get_settings()
    if settings.countersign_env == "test" and settings.countersign_fault == name:
        raise RuntimeError(detail)


async def delay_point(name: str, seconds: float) -> None:
    """Wait `seconds` of wall-clock time here (nothing is journaled): a test widens a race window."""
    settings = get_settings()
    if settings.countersign_env == "test" and settings.countersign_fault == name:
        await asyncio.sleep(seconds)
