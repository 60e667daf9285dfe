"""The fault injector: kill -9 the handler and restate-server, arm crash points in rotation, and
(when the app sends through the fake Resend) make the provider fail: 5xx, 429, refused connections,
an answer lost after the email was accepted.

Guarantee: only the driver thread calls it, so a kill and a restart never overlap; `COUNTERSIGN_FAULT`
can name one crash point per process start, so every start of the handler (after a kill, or after a
crash point fired) arms the next point of the rotation, never the one that just fired; `disarm`
leaves the handler running with no crash point. Every fault is counted by kind.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from fakes.resend_server import FakeResend
from fakes.resend_server import Fault as ResendFault
from support.processes import IsolatedStack, ProcessStartError

from faults.plan import OUTAGE_SECONDS, FaultKind
from faults.switch import Switch

FAULT = "COUNTERSIGN_FAULT"


@dataclass(frozen=True)
class Provider:
    """The fake Resend the app sends through, behind a switch that can refuse connections."""

    fake: FakeResend
    switch: Switch


class Chaos:
    def __init__(
        self,
        stack: IsolatedStack,
        rotation: list[str | None],
        log: Callable[[str], None],
        provider: Provider | None = None,
    ) -> None:
        self.stack = stack
        self.provider = provider
        self._back_on_at: float | None = None
        self._points = rotation
        self._rotation = itertools.cycle(rotation)
        self._log = log
        self.injected: Counter[str] = Counter()
        self.armed: str | None = stack.app.env.get(FAULT)

    def _next_point(self) -> str | None:
        while (point := next(self._rotation)) == self.armed and point is not None:
            pass
        return point

    def _start_app(self, point: str | None) -> None:
        """Start the handler with `point` armed. Restate retries at once, so the point may fire before
        the handler reports healthy: that counts as fired, and the next point is armed instead."""
        for _ in range(2 * len(self._points) + 1):
            if point is None:
                self.stack.app.env.pop(FAULT, None)
            else:
                self.stack.app.env[FAULT] = point
            self.armed = point
            try:
                self.stack.app.restart()
            except ProcessStartError as exc:
                if point is None or "exit code 137" not in str(exc):
                    raise
                self._log(f"crash point fired while the handler started: {point}")
                self.injected[f"crash point {point}"] += 1
                point = self._next_point()
                continue
            self._log(f"handler started, crash point armed: {point or '(none)'}")
            return
        raise AssertionError("every crash point fired during startup, again and again")

    def arm(self, point: str | None) -> None:
        """Restart the handler (kill -9) with `point` armed, counting the kill."""
        self.stack.app.kill9()
        self.injected["kill -9 handler"] += 1
        self._start_app(point)

    def inject(self, kind: FaultKind) -> None:
        self._log(f"injecting {kind}")
        self.injected[kind] += 1
        if kind.startswith("resend"):
            self._provider_fault(kind)
            return
        if kind in ("kill -9 handler", "kill -9 both"):
            self.stack.app.kill9()
        if kind in ("kill -9 restate-server", "kill -9 both"):
            self.stack.restate.restart(hard=True)
        if kind != "kill -9 restate-server":
            self._start_app(self._next_point())

    def _provider_fault(self, kind: FaultKind) -> None:
        assert self.provider is not None, f"{kind} needs the fake Resend"
        fake = self.provider.fake
        if kind == "resend 5xx":
            fake.fail_next(*[ResendFault("server_error")] * 3, ResendFault("bad_gateway"))
        elif kind == "resend 429":
            fake.fail_next(*[ResendFault("rate_limit", retry_after="1")] * 3)
        elif kind == "resend drops the answer":
            fake.fail_next(ResendFault("drop", accept=True))
        else:
            self.provider.switch.off()
            self._back_on_at = time.monotonic() + OUTAGE_SECONDS

    def tick(self) -> None:
        """End a provider outage that has lasted its time."""
        if self.provider is not None and self._back_on_at is not None and time.monotonic() >= self._back_on_at:
            self._back_on_at = None
            self.provider.switch.on()
            self._log("resend accepts connections again")

    def calm(self) -> None:
        """The provider accepts connections again (failures already queued are answered as they come)."""
        if self.provider is not None:
            self._back_on_at = None
            self.provider.switch.on()

    def notice_crash(self) -> bool:
        """If an armed crash point killed the handler, count it and restart with the next point."""
        if self.stack.app.alive():
            return False
        self._log(f"crash point fired: {self.armed}")
        self.injected[f"crash point {self.armed}"] += 1
        self._start_app(self._next_point())
        return True

    def disarm(self) -> None:
        if self.armed is not None:
            self.stack.app.kill9()
            self.injected["kill -9 handler"] += 1
            self._start_app(None)

    def fired(self, prefix: str) -> int:
        return sum(n for kind, n in self.injected.items() if kind.startswith(f"crash point {prefix}"))
