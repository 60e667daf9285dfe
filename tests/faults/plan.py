"""The plan of one randomized fault session, drawn from a seed: the runs, who decides what and when,
when the harness kills which process, and the order in which crash points are armed.

Guarantee: `draw(seed, runs)` is a pure function, so a printed seed reproduces the same plan; the
interleaving with the real processes (what a kill lands on) still varies from one machine to the next.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal["approve", "reject", "leave"]
VERDICTS: tuple[Verdict, ...] = ("approve", "reject", "leave")
RunKind = Literal["refund", "small_refund", "delete", "batch"]
FaultKind = Literal[
    "kill -9 handler",
    "kill -9 restate-server",
    "kill -9 both",
    "resend 5xx",
    "resend 429",
    "resend refuses connections",
    "resend drops the answer",
]
PROCESS_FAULTS: tuple[FaultKind, ...] = ("kill -9 handler", "kill -9 restate-server", "kill -9 both")
PROVIDER_FAULTS: tuple[FaultKind, ...] = (
    "resend 5xx",
    "resend 429",
    "resend refuses connections",
    "resend drops the answer",
)
OUTAGE_SECONDS = 4.0
"""How long the provider refuses connections in a 'resend refuses connections' fault."""

DEADLINE_SECONDS = 10
REMINDER_SECONDS = 4
FINANCE, OPS, SECURITY = "finance@example.com", "ops@example.com", "security@example.com"
APPROVERS: dict[RunKind, tuple[str, ...]] = {
    "refund": (FINANCE,),
    "small_refund": (),
    "delete": (OPS, SECURITY),
    "batch": (FINANCE, OPS),
}
# The first two armed points are fixed so every session starts by crashing inside an email step and
# then inside a tool step; the rest of the rotation is shuffled by the seed.
FIRST_POINTS = ("crash-after-send:request", "crash-after-effect:issue_refund")
OTHER_POINTS = (
    None,
    "crash-after-send:batch",
    "crash-after-send:reminder",
    "crash-after-effect:lookup_order",
    "crash-after-effect:delete_customer",
    "crash-after-effect:email_customer",
    "crash-after-send:receipt",
    "crash-after-send:outcome",
)

POLICY_TOML = f"""
[tools.issue_refund]
deadline_seconds = {DEADLINE_SECONDS}
reminders_seconds = [{REMINDER_SECONDS}]
escalate_to = []

[tools.delete_customer]
deadline_seconds = {DEADLINE_SECONDS}

[tools.email_customer]
deadline_seconds = {DEADLINE_SECONDS}
"""


@dataclass(frozen=True)
class Choice:
    """What one approver does with the email: the verdict, and how long after opening it they press."""

    verdict: Verdict
    think_seconds: float


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    kind: RunKind
    start_at: float
    amount_usd: str
    follow_up_usd: str | None
    """A smaller (autonomous) refund the script proposes if the approver rejects the first."""
    choices: dict[str, Choice] = field(default_factory=dict)
    cancel_after: float | None = None
    """Seconds after the start at which an operator cancels the run, if at all."""


@dataclass(frozen=True)
class Fault:
    at: float
    kind: FaultKind


@dataclass(frozen=True)
class FaultPlan:
    seed: int
    runs: list[RunPlan]
    faults: list[Fault]
    rotation: list[str | None]

    @property
    def active_seconds(self) -> float:
        """When the last planned event (a start, a click, a fault, a deadline) is due, roughly."""
        last_start = max(r.start_at for r in self.runs)
        last_fault = max((f.at for f in self.faults), default=0.0)
        return max(last_start + DEADLINE_SECONDS + 2, last_fault)


def _choice(rng: random.Random) -> Choice:
    verdict = rng.choices(VERDICTS, weights=[5, 3, 2])[0]
    return Choice(verdict, round(rng.uniform(0.2, DEADLINE_SECONDS - 1.5), 2))


def _kinds(rng: random.Random, count: int) -> list[RunKind]:
    """Every kind at least once when there is room, so small sessions still cover each path."""
    every: list[RunKind] = ["refund", "small_refund", "delete", "batch"]
    kinds = every[:count] + rng.choices(every, weights=[4, 2, 2, 2], k=max(0, count - len(every)))
    rng.shuffle(kinds)
    return kinds


def draw(seed: int, runs: int, *, provider: bool = False) -> FaultPlan:
    """`provider`: the app sends through the fake Resend, so its outages are drawn too."""
    rng = random.Random(seed)
    window = max(3.0, runs * 0.5)
    plans = []
    for i, kind in enumerate(_kinds(rng, runs)):
        start = round(rng.uniform(0, window), 2)
        amount = f"{rng.randint(501, 900)}.{rng.randint(0, 99):02d}"
        if kind == "small_refund":
            amount = f"{rng.randint(5, 500)}.00"
        follow_up = f"{rng.randint(5, 400)}.00" if kind == "refund" and rng.random() < 0.5 else None
        choices = {person: _choice(rng) for person in APPROVERS[kind]}
        cancel = (
            round(rng.uniform(1, DEADLINE_SECONDS - 2), 2) if kind != "small_refund" and rng.random() < 0.1 else None
        )
        plans.append(RunPlan(f"s{seed}-{i}-{kind.replace('_', '-')}", kind, start, amount, follow_up, choices, cancel))
    kinds = rng.choices(PROCESS_FAULTS, weights=[4, 3, 1], k=max(3, runs // 2))
    if provider:  # every kind of provider outage at least once
        kinds += [*PROVIDER_FAULTS, *rng.choices(PROVIDER_FAULTS, k=runs // 4)]
    faults = [Fault(round(rng.uniform(1, window + DEADLINE_SECONDS), 2), kind) for kind in kinds]
    others = list(OTHER_POINTS)
    rng.shuffle(others)
    return FaultPlan(
        seed, sorted(plans, key=lambda r: r.start_at), sorted(faults, key=lambda f: f.at), [*FIRST_POINTS, *others]
    )
