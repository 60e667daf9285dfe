"""Crash points for the fault tests: `COUNTERSIGN_FAULT=<point>` makes the process die there.

Guarantee: honoured only when `COUNTERSIGN_ENV=test`; anywhere else a crash point is a no-op.
"""

from __future__ import annotations

import os

from handlers.settings import get_settings


def crash_point(name: str) -> None:
    settings = get_settings()
    if settings.countersign_env == "test" and settings.countersign_fault == name:
        os._exit(137)
