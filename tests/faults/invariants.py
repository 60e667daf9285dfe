"""The invariants a fault session must end with, checked from what the system left behind: the
SQLite business database, the outbox, the audit trail (`python -m countersign audit export`), the runs'
results and status, and Restate's own SQL introspection.

Guarantee: every check is counted and every violation collected (not just the first), so a failing
session reports all it broke together with the seed that reproduces its plan.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from fakes.resend_server import FakeResend
from support.processes import REPO, IsolatedStack

from countersign.approval.gate import action_digest
from countersign.mail.intent import APPROVER_KINDS
from faults.mail import Mail, MailSource
from faults.people import Cancel, Click

EXECUTED = {"approved", "approved_with_edits", "autonomous"}
STUCK = ("paused", "backing-off")
EFFECT_TABLES = {
    "issue_refund": "refunds",
    "delete_customer": "customer_deletions",
    "email_customer": "outbound_emails",
}


@dataclass
class Checks:
    count: int = 0
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, message: str) -> bool:
        self.count += 1
        if not ok:
            self.failures.append(message)
        return ok


@dataclass
class Evidence:
    """Everything the checks read, gathered once the session is quiet."""

    results: dict[str, dict[str, Any]]
    approvals: dict[str, dict[str, Any]]
    """approval id -> the approval record from the run's `status`."""
    audit: dict[str, list[dict[str, Any]]]
    rows: dict[str, list[dict[str, Any]]]
    """table -> its rows."""
    mails: list[Mail]
    invocations: list[dict[str, Any]]
    inboxes: dict[str, list[dict[str, Any]]]
    audit_verify: str


def cli(stack: IsolatedStack, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m countersign ...` against this stack, as an operator would run it."""
    env = {
        **os.environ,
        **stack.env,
        "RESTATE_ADMIN_URL": stack.restate.admin_url,
        "RESTATE_INGRESS_URL": stack.restate.ingress_url,
    }
    env.pop("COUNTERSIGN_FAULT", None)
    return subprocess.run(
        [sys.executable, "-m", "countersign", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def gather(stack: IsolatedStack, run_ids: list[str], mails: list[Mail], people: list[str], tmp: Path) -> Evidence:
    results = {run: stack.ingress.output(run).json() for run in run_ids}
    approvals = {}
    for run in run_ids:
        for record in stack.ingress.status(run)["approvals"]:
            approvals[record["approval_id"]] = record
    export = cli(stack, "audit", "export", "--out", str(tmp / "audit.jsonl"))
    assert export.returncode == 0, export.stderr
    audit: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in (tmp / "audit.jsonl").read_text().splitlines():
        entry = json.loads(line)
        audit[entry["approval_id"]].append(entry)
    verified = cli(stack, "audit", "verify", str(tmp / "audit.jsonl"))
    rows = {}
    with sqlite3.connect(stack.db_path) as db:
        db.row_factory = sqlite3.Row
        for table in EFFECT_TABLES.values():
            rows[table] = [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY id")]
    invocations = stack.restate.sql(
        "SELECT id, target_service_name, target_service_key, target_handler_name, status FROM sys_invocation"
    )
    inboxes = {
        person: stack.ingress.call("ApprovalInbox", person, "pending", None).json()["pending"] for person in people
    }
    return Evidence(
        results, approvals, dict(audit), rows, mails, invocations, inboxes, verified.stdout + verified.stderr
    )


def _cents(usd: str) -> int:
    return int(Decimal(usd) * 100)


def _row_matches(tool: str, row: dict[str, Any], args: dict[str, Any]) -> bool:
    if tool == "issue_refund":
        return bool(row["order_id"] == args["order_id"] and row["amount_cents"] == _cents(args["amount_usd"]))
    if tool == "delete_customer":
        return bool(row["customer_id"] == args["customer_id"] and row["reason"] == args["reason"])
    return bool(row["customer_id"] == args["customer_id"] and row["subject"] == args["subject"])


def check_liveness(ev: Evidence, run_ids: list[str], cancels: list[Cancel], checks: Checks) -> None:
    accepted_cancels = {c.run_id for c in cancels if c.receipt and c.receipt.get("accepted")}
    for run in run_ids:
        result = ev.results[run]
        status = result.get("status")
        if checks.check(status in ("completed", "cancelled"), f"{run}: ended {status!r} ({result})"):
            checks.check(
                status != "cancelled" or run in accepted_cancels, f"{run}: cancelled without an accepted cancel"
            )
        runs = [i for i in ev.invocations if i["target_service_key"] == run and i["target_handler_name"] == "run"]
        checks.check(len(runs) == 1, f"{run}: {len(runs)} run invocations")
    for row in ev.invocations:
        checks.check(
            row["status"] == "completed",
            f"invocation {row['target_service_name']}/{row['target_service_key']}/{row['target_handler_name']} "
            f"is {row['status']}",
        )
    for person, pending in ev.inboxes.items():
        checks.check(pending == [], f"{person}'s inbox still lists {[p['approval_id'] for p in pending]}")


def _decided(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["kind"] == "decided" and e["details"].get("source") == "human"]


def check_decisions(ev: Evidence, clicks: list[Click], cancels: list[Cancel], checks: Checks) -> None:
    by_person = {(c.run_id, c.person): c for c in clicks}
    cancelled_runs = {c.run_id for c in cancels if c.receipt and c.receipt.get("accepted")}
    for click in clicks:
        checks.check(click.error is None, f"{click.run_id}: {click.person} got no answer: {click.error}")
        checks.check(
            click.opened in (None, 200, 410),
            f"{click.run_id}: {click.person}'s page was {click.opened}: {click.text}",
        )
        if click.verdict != "leave" and click.csrf is not None and click.status is not None:
            checks.check(
                click.status in (200, 409, 410),
                f"{click.run_id}: {click.person}'s {click.verdict} answered {click.status}: {click.text[-300:]}",
            )
    for approval_id, record in ev.approvals.items():
        run = record["run_id"]
        decided = _decided(ev.audit.get(approval_id, []))
        for entry in decided:
            voter = by_person.get((run, entry["actor"]))
            checks.check(
                voter is not None
                and voter.status == 200
                and (voter.verdict, voter.reason) == (entry["details"]["verdict"], entry["details"]["reason"]),
                f"{approval_id}: decision {entry['details']} by {entry['actor']} matches no accepted click",
            )
        for person in record["approvers"]:
            own = by_person.get((run, person))
            if own is None or own.verdict == "leave" or own.status is None:
                continue
            counted = [e for e in decided if e["actor"] == person and e["details"]["reason"] == own.reason]
            if own.status == 200:
                checks.check(
                    len(counted) == 1, f"{approval_id}: {person}'s accepted {own.verdict} is not in the audit trail"
                )
            else:
                checks.check(counted == [], f"{approval_id}: {person}'s refused {own.verdict} is in the audit trail")
        approves = {e["actor"] for e in decided if e["details"]["verdict"] == "approve"}
        rejects = [e for e in decided if e["details"]["verdict"] == "reject"]
        state = record["state"]
        if state == "approved":
            checks.check(
                len(approves) >= record["quorum"] and not rejects, f"{approval_id}: approved by {approves}, {rejects}"
            )
        elif state == "rejected":
            checks.check(
                bool(rejects) and record["reason"] == rejects[0]["details"]["reason"], f"{approval_id}: {record}"
            )
        elif state in ("expired", "cancelled"):
            checks.check(not rejects and len(approves) < record["quorum"], f"{approval_id}: {state} yet {decided}")
            checks.check(state != "cancelled" or run in cancelled_runs, f"{approval_id}: cancelled, but no cancel won")
        else:
            checks.check(False, f"{approval_id}: unexpected final state {state!r}")


def check_effects(ev: Evidence, checks: Checks) -> None:
    """Every approved action ran exactly once, and nothing ran without an approval of its exact digest."""
    rows_by_key: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for table, rows in ev.rows.items():
        for row in rows:
            rows_by_key[row["idempotency_key"]].append((table, row))
    expected_keys = set()
    for run, result in ev.results.items():
        for action in result.get("actions", []):
            key, tool = f"{run}/{action['index']}", action["tool"]
            found = rows_by_key.get(key, [])
            if tool not in EFFECT_TABLES:
                checks.check(found == [], f"{key}: {tool} left rows {found}")
                continue
            if action["outcome"] not in EXECUTED:
                checks.check(found == [], f"{key}: {action['outcome']} {tool} executed anyway: {found}")
                continue
            expected_keys.add(key)
            checks.check(len(found) == 1, f"{key}: {action['outcome']} {tool} has {len(found)} rows, not one")
            if found:
                table, row = found[0]
                checks.check(table == EFFECT_TABLES[tool], f"{key}: row in {table}")
                checks.check(_row_matches(tool, row, action["args"]), f"{key}: row {row} != {action}")
            if action["outcome"] == "autonomous":
                checks.check(action["approval_id"] is None, f"{key}: autonomous but gated")
                checks.check(
                    tool == "issue_refund" and Decimal(action["args"]["amount_usd"]) <= 500,
                    f"{key}: {tool} {action['args']} ran without approval",
                )
            else:
                _check_approved_digest(ev, run, action, checks)
    for key, found in rows_by_key.items():
        checks.check(key in expected_keys, f"{key}: rows {found} without an approved or autonomous action")


def _check_approved_digest(ev: Evidence, run: str, action: dict[str, Any], checks: Checks) -> None:
    approval_id = action["approval_id"]
    record = ev.approvals.get(approval_id or "")
    if not checks.check(record is not None, f"{run}/{action['index']}: executed without an approval record"):
        return
    assert record is not None
    digest = action_digest(run, action["index"], action["tool"], action["proposed_args"])
    checks.check(record["digest"] == digest, f"{approval_id}: record digest {record['digest']} != frozen {digest}")
    approved_args = {**action["proposed_args"], **(action["edits"] or {})}
    checks.check(action["args"] == approved_args, f"{approval_id}: ran {action['args']}, approved {approved_args}")
    entries = ev.audit.get(approval_id, [])
    requested = [e for e in entries if e["kind"] == "requested"]
    checks.check(
        bool(requested)
        and all(
            e["details"]["digest"] == digest and e["details"]["args"] == action["proposed_args"] for e in requested
        ),
        f"{approval_id}: the approvers were not shown digest {digest} of {action['proposed_args']}: {requested}",
    )
    executed = [e for e in entries if e["kind"] == "executed"]
    checks.check(
        len(executed) == 1
        and executed[0]["details"]["args"] == action["args"]
        and executed[0]["details"]["idempotency_key"] == f"{run}/{action['index']}",
        f"{approval_id}: audit 'executed' {executed} does not match {action['args']}",
    )
    approves = {e["actor"] for e in _decided(entries) if e["details"]["verdict"] == "approve"}
    checks.check(len(approves) >= record["quorum"], f"{approval_id}: executed with approvals from {approves} only")


def _first_asking(ev: Evidence, record: dict[str, Any], person: str) -> tuple[dict[str, Any], int]:
    """The batch email to `person` is keyed by the first item of the batch that asks them, and their slot there."""
    for index in record["batch"]:
        item = ev.approvals[f"{record['run_id']}-a{index}"]
        for slot in item["active_slots"]:
            if item["approvers"][slot] == person:
                return item, slot
    raise AssertionError(f"{person} is asked about nothing in {record['batch']}")


NOTICES = {
    "approved": "executed",
    "approved_with_edits": "executed",
    "failed": "failed",
    "rejected": "rejected",
    "expired": "expired",
    "undeliverable": "undeliverable",
    "superseded": "superseded",
}
"""The requester's outcome notice for each outcome of a gated action (none when the run was cancelled)."""


def check_emails(ev: Evidence, source: MailSource, checks: Checks, fake: FakeResend | None = None) -> None:
    """One email per intent (approval requests, batches, outcome notices), each approver email recorded
    once in the audit trail, a decision receipt only for a decision the audit trail holds; and at the
    fake Resend, at most one accepted email per idempotency key."""
    by_id = Counter(mail.provider_id for mail in ev.mails)
    checks.check(all(n == 1 for n in by_id.values()), f"emails sharing a provider id: {by_id.most_common(3)}")

    def one(key: str, what: str) -> None:
        found = sum(by_id[i] for i in source.ids_for_key(key))
        checks.check(found == 1, f"{what}: {found} emails for {key}")

    outcome_of = {a["approval_id"]: a["outcome"] for r in ev.results.values() for a in r.get("actions", [])}
    receipts: set[str] = set()
    for approval_id, record in ev.approvals.items():
        for slot in record["active_slots"]:
            if len(record["batch"]) > 1:
                first, first_slot = _first_asking(ev, record, record["approvers"][slot])
                one(f"approval-batch/{first['approval_id']}/r1/s{first_slot}", approval_id)
            else:
                one(f"approval-request/{approval_id}/r1/s{slot}", approval_id)
        if (notice := NOTICES.get(outcome_of.get(approval_id, ""))) is not None:
            one(f"approval-outcome/{approval_id}/r{record['round']}/{notice}", approval_id)
        for entry in _decided(ev.audit.get(approval_id, [])):
            round_slot = entry["entry_id"].removeprefix("decided/")
            receipts |= source.ids_for_key(f"approval-receipt/{approval_id}/{round_slot}")
    for mail in ev.mails:
        if mail.kind == "receipt":
            checks.check(mail.provider_id in receipts, f"{mail.source_id}: a receipt for a decision never recorded")
    audited = {
        e["details"]["provider_id"] for entries in ev.audit.values() for e in entries if e["kind"] == "email_accepted"
    }
    approver_mails = {m.provider_id for m in ev.mails if m.kind in APPROVER_KINDS}
    checks.check(audited == approver_mails, f"audited email ids {sorted(audited)} != sent {sorted(approver_mails)}")
    if fake is not None:
        keys = Counter(a.idempotency_key for a in fake.accepted)
        checks.check(None not in keys, "the fake Resend accepted an email without an idempotency key")
        checks.check(
            all(n == 1 for n in keys.values()), f"keys accepted more than once: {[k for k, n in keys.items() if n > 1]}"
        )


def check_audit(ev: Evidence, checks: Checks) -> None:
    checks.check(ev.audit_verify.strip() == "audit trail intact", f"audit verify: {ev.audit_verify[-500:]}")
    for approval_id, entries in ev.audit.items():
        ids = [e["entry_id"] for e in entries]
        checks.check(len(ids) == len(set(ids)), f"{approval_id}: repeated audit entries {ids}")
        outcomes = [e for e in entries if e["kind"] == "outcome"]
        checks.check(len(outcomes) == 1, f"{approval_id}: {len(outcomes)} outcome entries")
