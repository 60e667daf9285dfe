"""Randomized fault runs: agent runs (refunds, deletions, batches; some approved, some rejected, some
left to expire, some cancelled) while the harness kill -9s the handler and restate-server at random
moments and arms crash points inside tool steps (after the effect) and email steps (after the mailer
accepted). At the end: nothing lost, nothing done twice, nothing done without its approval.

`pytest tests/faults --runs 200 --seed 42` for a long local soak; see tests/faults/conftest.py.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.resend_server import FakeResend
from fakes.resend_stack import resend_env
from support.business import new_order
from support.processes import REPO, IsolatedStack, StackFactory, wait_until

from faults.chaos import Chaos, Provider
from faults.conftest import FaultOptions
from faults.invariants import (
    Checks,
    Evidence,
    check_audit,
    check_decisions,
    check_effects,
    check_emails,
    check_liveness,
    gather,
)
from faults.mail import MailSource, Outbox, ResendLog
from faults.people import Click, People
from faults.plan import FINANCE, OPS, POLICY_TOML, SECURITY, Choice, FaultPlan, RunPlan, draw
from faults.switch import Switch
from handlers.demo.business_db import connect, transaction

ARTIFACTS = REPO / "test-artifacts" / "faults"
MODES = ["outbox-http2", "resend-http1.1"]
"""Where emails go and how Restate invokes the handler: each mode is one session per test run."""
QUIET_TIMEOUT = 180.0
"""How long, after the last planned event, every run may take to finish (restarts included)."""


def _refund(order: int, amount: str, **extra: Any) -> dict[str, Any]:
    return {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "fault run"}, **extra}


def task_for(run: RunPlan, db: Path) -> dict[str, Any]:
    """The scripted task of one planned run, against fresh rows of the business database."""
    order = new_order(db, 100000)
    steps: list[dict[str, Any]]
    if run.kind == "refund":
        follow_up = {"if_rejected": _refund(order, run.follow_up_usd)} if run.follow_up_usd else {}
        steps = [{"tool": "lookup_order", "args": {"order_id": order}}, _refund(order, run.amount_usd, **follow_up)]
    elif run.kind == "small_refund":
        steps = [_refund(order, run.amount_usd)]
    elif run.kind == "delete":
        customer = f"c_{order}"
        with connect(db) as conn, transaction(conn):
            conn.execute("INSERT INTO customers(id, name, email) VALUES (?, 'Fault Run', 'f@example.com')", (customer,))
        steps = [{"tool": "delete_customer", "args": {"customer_id": customer, "reason": f"fault run {run.run_id}"}}]
    else:
        note = {"tool": "email_customer", "args": {"customer_id": "c_17", "subject": run.run_id, "body": "Refunded."}}
        steps = [_refund(order, run.amount_usd, also=[note])]
    return {"goal": f"fault run {run.run_id}", "requester": "alice@example.com", "script": steps}


@dataclass
class Session:
    """The driver's view of one fault session: what is due, what was seen, what people were told."""

    plan: FaultPlan
    stack: IsolatedStack
    mail: MailSource
    provider: Provider | None = None
    log: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    runs: dict[str, RunPlan] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    presses: list[tuple[float, threading.Event]] = field(default_factory=list)
    faults_done: int = 0
    cancels_done: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    people: People = field(init=False)
    chaos: Chaos = field(init=False)

    def __post_init__(self) -> None:
        self.people = People(self.stack.app.url, self.stack.ingress)
        self.chaos = Chaos(self.stack, self.plan.rotation, self.note, self.provider)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, line: str) -> None:
        self.log.append(f"{self.now():7.2f}s {line}")

    def start(self, run: RunPlan) -> None:
        self.runs[run.run_id] = run
        task = task_for(run, self.stack.db_path)

        def accepted() -> bool:
            try:
                return self.stack.ingress.start_run(run.run_id, task).status_code in (200, 202)
            except httpx.TransportError:
                return False

        wait_until(accepted, 60, f"restate to accept run {run.run_id}", interval=0.3)
        self.started.add(run.run_id)
        self.note(f"started {run.run_id}")

    def read_mail(self) -> None:
        """Every new approval email is opened by its approver, who will press after thinking."""
        for mail in self.mail.new(self.seen):
            self.seen.add(mail.source_id)
            run = self.runs.get(mail.run_id)
            if mail.kind not in ("request", "batch") or run is None or mail.link is None:
                continue
            choice = run.choices.get(mail.to, Choice("leave", 0))
            reason = f"{choice.verdict} {mail.run_id} by {mail.to}"
            press = threading.Event()
            self.people.open(
                Click(mail.run_id, mail.to, mail.link, choice.verdict, reason, mail.kind == "batch"), press
            )
            self.presses.append((self.now() + choice.think_seconds, press))
            self.note(f"{mail.to} opened {mail.kind} email of {mail.run_id}; will {choice.verdict}")

    def step(self) -> None:
        """One pass of the driver: crashes, starts, faults, cancels, new emails, button presses."""
        self.chaos.notice_crash()
        self.chaos.tick()
        now = self.now()
        for run in self.plan.runs:
            if run.run_id not in self.started and run.start_at <= now:
                self.start(run)
            due = run.cancel_after is not None and run.start_at + run.cancel_after <= now
            if due and run.run_id in self.started and run.run_id not in self.cancels_done:
                self.cancels_done.add(run.run_id)
                self.people.cancel(run.run_id, f"operator cancels {run.run_id}")
                self.note(f"operator cancels {run.run_id}")
        while self.faults_done < len(self.plan.faults) and self.plan.faults[self.faults_done].at <= now:
            fault = self.plan.faults[self.faults_done]
            self.faults_done += 1
            self.chaos.inject(fault.kind)
        self.read_mail()
        for at, press in self.presses:
            if at <= self.now():
                press.set()

    def quiet(self) -> bool:
        if not (
            all(r.run_id in self.started for r in self.plan.runs)
            and self.faults_done == len(self.plan.faults)
            and all(p.is_set() for _, p in self.presses)
            and not self.people.busy()
        ):
            return False
        for run in self.started - self.finished:
            if self.stack.ingress.output(run).status_code == 470:
                return False
            self.finished.add(run)
        return True

    def drive(self, until: float) -> None:
        """Run the plan until every run ended and every person got an answer, or `until` passes."""
        pace = threading.Event()
        while self.now() < until:
            self.step()
            if self.now() > self.plan.active_seconds and self.quiet():
                return
            pace.wait(0.1)
        self.note("driver stopped at its time limit")

    def cover(self, prefix: str, point: str, run: RunPlan) -> None:
        """Make sure a crash point of this kind fired at least once in the session."""
        if self.chaos.fired(prefix):
            return
        self.note(f"coverage: arming {point} for {run.run_id}")
        self.chaos.arm(point)
        self.start(run)
        self.drive(self.now() + QUIET_TIMEOUT)

    def finish(self) -> list[str]:
        """The plan played out, both kinds of crash point covered, disarmed, drained: every run's id."""
        self.drive(self.plan.active_seconds + QUIET_TIMEOUT)
        seed = self.plan.seed
        effect = RunPlan(f"s{seed}-cover-effect", "small_refund", self.now(), "20.00", None)
        self.cover("crash-after-effect", "crash-after-effect:issue_refund", effect)
        approve = {FINANCE: Choice("approve", 0.5)}
        send = RunPlan(f"s{seed}-cover-send", "refund", self.now(), "600.00", None, approve)
        self.cover("crash-after-send", "crash-after-send:request", send)
        self.chaos.calm()
        self.chaos.disarm()
        self.drive(self.now() + QUIET_TIMEOUT)
        self.people.join(60)
        for run in self.started:
            self.stack.ingress.wait_output(run, timeout=60)
        try:
            wait_until(self._all_completed, 60, "every invocation to complete")
        except TimeoutError:
            self.note("some invocations never completed (the checks say which)")
        return sorted(self.started)

    def _all_completed(self) -> bool:
        return all(r["status"] == "completed" for r in self.stack.restate.sql("SELECT status FROM sys_invocation"))

    def save(self, folder: Path) -> None:
        """What happened, for the person reading a failure: the log, every click and cancel, process logs."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "session.log").write_text("\n".join(self.log) + "\n")
        people = {
            "clicks": [asdict(c) for c in self.people.clicks],
            "cancels": [asdict(c) for c in self.people.cancels],
        }
        (folder / "people.json").write_text(json.dumps(people, indent=1, default=str))
        shutil.copy(self.stack.app.log_path, folder / "app.log")
        shutil.copy(self.stack.restate.log_path, folder / "restate-server.log")

    def verify(self, run_ids: list[str], folder: Path) -> tuple[Checks, Evidence]:
        folder.mkdir(parents=True, exist_ok=True)
        evidence = gather(self.stack, run_ids, self.mail.all(), [FINANCE, OPS, SECURITY], folder)
        (folder / "evidence.json").write_text(json.dumps(asdict(evidence), indent=1, default=str))
        checks = Checks()
        check_liveness(evidence, run_ids, self.people.cancels, checks)
        check_decisions(evidence, self.people.clicks, self.people.cancels, checks)
        check_effects(evidence, checks)
        check_emails(evidence, self.mail, checks, self.provider.fake if self.provider else None)
        check_audit(evidence, checks)
        return checks, evidence


@contextmanager
def session_for(mode: str, stacks: StackFactory, tmp_path: Path, plan: FaultPlan) -> Iterator[Session]:
    """A private stack for the plan: sending to the outbox, or to the fake Resend behind a switch."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_TOML)
    env = {"APPROVALS_POLICY_FILE": str(policy), "COUNTERSIGN_FAULT": plan.rotation[0] or ""}
    http1 = mode.endswith("http1.1")
    if not mode.startswith("resend"):
        stack = stacks(app_env=env, http1=http1)
        yield Session(plan, stack, Outbox(stack.outbox_dir))
        return
    with FakeResend.running() as fake:
        host, port = fake.url.removeprefix("http://").split(":")
        switch = Switch((host, int(port)))
        switch.on()
        try:
            stack = stacks(app_env={**env, **resend_env(fake), "RESEND_API_URL": switch.url}, http1=http1)
            yield Session(plan, stack, ResendLog(fake), Provider(fake, switch))
        finally:
            switch.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_randomized_faults_lose_nothing_and_repeat_nothing(
    mode: str, private_stacks: StackFactory, tmp_path: Path, fault_options: FaultOptions, fault_report: list[str]
) -> None:
    plan = draw(fault_options.seed, fault_options.runs, provider=mode.startswith("resend"))
    reproduce = f"pytest tests/faults --seed {plan.seed} --runs {len(plan.runs)} -k {mode}"
    artifacts = ARTIFACTS / f"{time.strftime('%Y%m%d-%H%M%S')}-{mode}-seed-{plan.seed}-runs-{len(plan.runs)}"
    fault_report.append(f"fault session {mode}, seed={plan.seed} runs={len(plan.runs)} (same plan: {reproduce})")
    with session_for(mode, private_stacks, tmp_path, plan) as session:
        session.note(f"fault session {mode} seed={plan.seed} runs={len(plan.runs)}")
        try:
            checks, evidence = session.verify(session.finish(), artifacts)
        finally:
            injected = dict(sorted(session.chaos.injected.items()))
            fault_report.append(f"  faults injected ({sum(injected.values())}): {injected}")
            fault_report.append(f"  session log, evidence and process logs: {artifacts}")
            session.save(artifacts)
    outcomes = Counter(f"{a['tool']}:{a['outcome']}" for r in evidence.results.values() for a in r.get("actions", []))
    fault_report.append(f"  invariants checked: {checks.count}, violated: {len(checks.failures)}")
    fault_report.append(f"  outcomes: {dict(sorted(outcomes.items()))}")
    if session.provider is not None:
        answers = Counter(r.status for r in session.provider.fake.requests)
        fault_report.append(f"  fake Resend answers (status: count, -1 = dropped): {dict(sorted(answers.items()))}")
    assert not checks.failures, "\n".join([reproduce, *checks.failures, "--- session log ---", *session.log])
    assert session.chaos.fired("crash-after-effect") and session.chaos.fired("crash-after-send"), injected
