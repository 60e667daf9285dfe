"""Spans of time in the words pages and emails share ("3 days 4 hours", "less than a minute").

Guarantee: pure and clock-free, so an email rendered on a retry says exactly what it said before.
"""

from __future__ import annotations


def _plural(count: int, unit: str) -> str:
    return f"{count} {unit}" if count == 1 else f"{count} {unit}s"


def duration(seconds: float) -> str:
    """`2 days 3 hours`, `5 hours 12 minutes`, `45 minutes`, `less than a minute` (two units at most)."""
    whole = int(seconds)
    if whole < 60:
        return "less than a minute"
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return _plural(days, "day") + (f" {_plural(hours, 'hour')}" if hours else "")
    if hours:
        return _plural(hours, "hour") + (f" {_plural(minutes, 'minute')}" if minutes else "")
    return _plural(minutes, "minute")
