"""Noticing when a run has handed its notification over: new files in an outbox-like folder.

Guarantee: the time reported for a run is the file's own modification time (set by the writer inside
its journaled step, accurate to microseconds on this kernel), so how often we poll changes only when
a waiter wakes, never the figure. Files are moved into `seen/` once read, which keeps each scan as
small as the number of runs in flight; a second file for a run already seen counts as a duplicate.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from pathlib import Path

SCAN_INTERVAL = 0.002


class MarkerWatcher:
    def __init__(self, folder: Path, parse: Callable[[str], str | None]) -> None:
        self.folder = folder
        self.seen_dir = folder / "seen"
        self.seen_dir.mkdir(parents=True, exist_ok=True)
        self._parse = parse
        self.times: dict[str, float] = {}
        """Run id -> the marker's mtime (epoch seconds)."""
        self.paths: dict[str, Path] = {}
        self.duplicates = 0
        self._waiters: dict[str, asyncio.Future[float]] = {}

    def scan(self) -> int:
        """Pick up new files now; returns how many were new."""
        found = 0
        with os.scandir(self.folder) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                run_id = self._parse(entry.name)
                if run_id is None:
                    continue
                mtime = entry.stat().st_mtime_ns / 1e9
                target = self.seen_dir / entry.name
                if run_id in self.times:
                    self.duplicates += 1
                    target = self.seen_dir / f"duplicate-{self.duplicates}-{entry.name}"
                else:
                    self.times[run_id] = mtime
                    self.paths[run_id] = target
                    found += 1
                os.replace(entry.path, target)
                waiter = self._waiters.pop(run_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(mtime)
        return found

    async def wait(self, run_id: str, limit_s: float) -> float:
        """The mtime of `run_id`'s marker, waiting up to `limit_s` seconds for it to appear."""
        self.scan()
        if run_id in self.times:
            return self.times[run_id]
        waiter = self._waiters.setdefault(run_id, asyncio.get_running_loop().create_future())
        try:
            async with asyncio.timeout(limit_s):
                return await asyncio.shield(waiter)
        except TimeoutError:
            raise TimeoutError(f"no notification for {run_id} within {limit_s}s in {self.folder}") from None

    async def run(self, stop: asyncio.Event) -> None:
        """Scan every few milliseconds while anyone is waiting, until `stop` is set."""
        while not stop.is_set():
            if self._waiters:
                self.scan()
            await asyncio.sleep(SCAN_INTERVAL)


_EMAIL = re.compile(r"^approval-request_(?P<run>.+)-a\d+_r\d+_s\d+-[0-9a-f]+\.eml$")
_NOTIFY = re.compile(r"^(?P<run>.+)\.notify$")
_PRODUCT_REQUEST = re.compile(r"^request_(?P<run>.+)\.eml$")


def approval_email_run(name: str) -> str | None:
    """The run id of an outbox file named after its idempotency key `approval-request/<run>-a<i>/r<n>/s<k>`."""
    match = _EMAIL.match(name)
    return match.group("run") if match else None


def floor_marker_run(name: str) -> str | None:
    match = _NOTIFY.match(name)
    return match.group("run") if match else None


def product_request_run(name: str) -> str | None:
    """The run id of a product-floor request email, named after its key `request/<run>`."""
    match = _PRODUCT_REQUEST.match(name)
    return match.group("run") if match else None
