"""How big each scenario is: the full run, the `--quick` run, and the knobs that override either.

Guarantee: every size is bounded (checked here), so every load the bench generates ends by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from annotated_types import MaxLen

from countersign.contract import AgentTask


def script_cap() -> int:
    """The longest script `AgentTask` accepts (the contract's `max_length` on `script`)."""
    for meta in AgentTask.model_fields["script"].metadata:
        if isinstance(meta, MaxLen):
            return int(meta.max_length)
    return 50


THINK_MS = 50.0
"""Long enough for what a run does after its email (a bookkeeping call, the approval workflow's start:
a few ms on this machine) to be over before the next start, short next to a person's pace."""


@dataclass(frozen=True)
class Plan:
    mode: str
    warmup: int
    """Unmeasured approve cycles per system before anything is measured."""
    latency_samples: int
    """Runs per system for start -> email and POST -> done."""
    block: int
    """Consecutive samples of one system before switching to the other (CPU is accounted per block)."""
    think_ms: float
    """For `start_to_email_alone`: the pause after each approval email before the next start."""
    step_counts: tuple[int, ...]
    step_samples: int
    resume_turns: tuple[int, ...]
    resume_samples: int
    concurrency: int
    paused_sizes: tuple[int, ...]
    """Cumulative paused runs at which disk and RSS are read; the first batch is also the throughput figure."""
    crash_runs: int
    crash_turns: int
    fleet_runs: int
    """Runs per system in the fleet burst (the issue's figure is a burst of 2,000 decisions)."""
    timeout: float
    """Upper bound (s) on any single wait."""

    def check(self) -> Plan:
        cap = script_cap()
        for f in fields(self):
            value = getattr(self, f.name)
            values = value if isinstance(value, tuple) else (value,)
            for v in values:
                if isinstance(v, int | float) and not isinstance(v, bool) and v < 0:
                    raise ValueError(f"{f.name} must not be negative")
        if self.latency_samples < 1 or self.step_samples < 1 or self.resume_samples < 1 or self.block < 1:
            raise ValueError("sample counts must be at least 1")
        if len(set(self.step_counts)) < 2 or min(self.step_counts) < 1 or max(self.step_counts) > cap:
            raise ValueError(f"step counts need two distinct values in 1..{cap} (the contract's script cap)")
        if not self.resume_turns or min(self.resume_turns) < 1 or max(self.resume_turns) > cap:
            raise ValueError(f"resume turns must be in 1..{cap} (the contract's script cap)")
        if not self.paused_sizes or list(self.paused_sizes) != sorted(set(self.paused_sizes)):
            raise ValueError("paused sizes must be increasing")
        if self.paused_sizes[-1] > 100_000 or self.crash_runs < 1 or self.crash_turns < 1:
            raise ValueError("paused sizes are capped at 100000; crash runs and turns must be at least 1")
        if not 1 <= self.fleet_runs <= 100_000:
            raise ValueError("fleet runs must be 1..100000")
        if not 1 <= self.concurrency <= 256:
            raise ValueError("concurrency must be 1..256")
        if self.think_ms > 10_000:
            raise ValueError("think time is capped at 10000 ms (a pause, not a wait for anything)")
        return self

    def with_overrides(self, overrides: dict[str, Any]) -> Plan:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None}).check()


def full_plan() -> Plan:
    cap = script_cap()
    return Plan(
        mode="full",
        warmup=30,
        latency_samples=200,
        block=20,
        think_ms=THINK_MS,
        step_counts=(1, 10, 25, min(50, cap)),
        step_samples=20,
        resume_turns=(10, min(100, cap)),
        resume_samples=40,
        concurrency=16,
        paused_sizes=(1_000, 10_000),
        crash_runs=50,
        crash_turns=7,
        fleet_runs=2000,
        timeout=120.0,
    ).check()


def quick_plan() -> Plan:
    return Plan(
        mode="quick",
        warmup=2,
        latency_samples=6,
        block=3,
        think_ms=THINK_MS,
        # Far enough apart that the floor's slope (a no-op step, well under a millisecond) stands out of
        # a loaded machine's noise: at (1, 8) and two runs it once came out at zero, which has no ratio.
        step_counts=(1, 25),
        step_samples=3,
        resume_turns=(2, 6),
        resume_samples=2,
        concurrency=16,
        paused_sizes=(48,),
        crash_runs=6,
        crash_turns=3,
        fleet_runs=20,
        timeout=60.0,
    ).check()
