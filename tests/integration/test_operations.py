"""Issue 6: inboxes, reassignment, bulk cancel, the audit trail, the trust ramp and the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.approver import form_csrf, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.operator import cli, inbox
from support.processes import AppServer, Ingress, IsolatedStack, RestateServer, StackFactory, wait_until
from support.runs import refund_task

from countersign.ops import show_view


def test_inbox_follows_approve_reject_and_cancel(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    runs = [f"{run_id}-{verdict}" for verdict in ("approve", "reject", "cancel")]
    for run in runs:
        ingress.start_run(run, refund_task(new_order(demo_db, 100000)))
    mails = {run: wait_for_email(outbox_dir, run)[0] for run in runs}
    wanted = {f"{run}-a0" for run in runs}
    wait_until(lambda: wanted <= set(inbox(ingress, "finance@example.com")), 20, "the inbox to list all three")

    assert submit(mails[runs[0]].link, "approve").status_code == 200
    assert submit(mails[runs[1]].link, "reject", "no").status_code == 200
    ingress.call("AgentRun", runs[2], "cancel", {"reason": "stop"})
    wait_until(lambda: not wanted & set(inbox(ingress, "finance@example.com")), 20, "the inbox to drop them")


def test_a_finished_run_keeps_its_record_but_no_journal(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund_task(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    approval = f"{run_id}-a0"

    def audited(last: str) -> list[Any] | None:
        kinds = [e["kind"] for e in ingress.call("ApprovalAudit", approval, "entries", None).json()["entries"]]
        return kinds if last in kinds else None

    # Sent together before the run waits for the approver, not after.
    assert wait_until(lambda: audited("email_accepted"), 20, "the request in the trail") == [
        "requested",
        "email_accepted",
    ]
    waiting = restate_server.sql(
        "select count(*) as n from sys_journal j join sys_invocation i on i.id = j.id"
        f" where i.target_service_key = '{approval}' and i.target_handler_name = 'run'"
    )
    assert waiting[0]["n"] > 0, "a waiting approval has its journal (it replays from it)"
    assert submit(mail.link, "approve").status_code == 200
    assert ingress.wait_output(run_id).json()["status"] == "completed"
    kinds = wait_until(lambda: audited("outcome"), 20, "the audit trail to record the outcome")
    assert kinds[-3:] == ["decided", "executed", "outcome"], kinds

    def journals() -> dict[str, int]:
        rows = restate_server.sql(
            "select i.target_service_name as service, count(*) as entries from sys_journal j"
            " join sys_invocation i on i.id = j.id"
            f" where i.target_service_key in ('{run_id}', '{approval}')"
            " or i.target_service_key like 'finance@example.com%' or i.target_service_key like 'issue_refund%'"
            " group by i.target_service_name"
        )
        return {row["service"]: row["entries"] for row in rows}

    # Once decided and done, the journals go (the run's, the approval's, the click's, the bookkeeping's):
    # the record is the workflows' state and promises, and the audit trail.
    wait_until(lambda: journals() == {}, 20, "the finished journals to be dropped")
    kept = {
        (row["service_name"], row["key"])
        for row in restate_server.sql(
            f"select service_name, key from state where service_key in ('{run_id}', '{approval}')"
        )
    }
    assert {("AgentRun", "run"), ("Approval", "run"), ("Approval", f"approval:{approval}")} <= kept, kept
    [promise] = restate_server.sql(
        f"select completed from sys_promise where service_key = '{approval}' and key like 'decision:%'"
    )
    assert promise["completed"], "the decision stays readable for late clicks"
    status = ingress.call("Approval", approval, "status", None).json()
    assert status["approvals"][0]["state"] == "approved" and status["approvals"][0]["decided_by"]


def test_reassign_moves_the_inbox_and_kills_old_links(
    app_server: AppServer, restate_server: RestateServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 100000)
    ingress.start_run(run_id, refund_task(order))
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    approval = f"{run_id}-a0"
    wait_until(lambda: approval in inbox(ingress, "finance@example.com"), 20, "the first inbox")

    bad = cli(restate_server, "reassign", approval, "--to", "not-an-email")
    assert bad.returncode == 2 and "not an email address" in bad.stderr and "Traceback" not in bad.stderr
    # finance-lead@ is issue_refund's escalation chain, so the policy lets them decide it.
    moved = cli(
        restate_server, "reassign", approval, "--to", "Finance-Lead@Example.com", "--reason", "on leave", "--json"
    )
    assert moved.returncode == 0, moved.stderr
    receipt = json.loads(moved.stdout)
    assert receipt.pop("by").startswith("cli"), "who asked defaults to the CLI's login name"
    assert receipt == {
        "approval_id": approval,
        "accepted": True,
        "replaced": "finance@example.com",
        "to": "finance-lead@example.com",
    }
    lead = "finance-lead@example.com"
    fresh = next(m for m in wait_for_email(outbox_dir, run_id, count=2) if m.message["To"] == lead)
    wait_until(lambda: approval in inbox(ingress, lead), 20, "the new inbox")
    wait_until(lambda: approval not in inbox(ingress, "finance@example.com"), 20, "the old inbox to drop it")

    assert httpx.get(mail.link, timeout=30).status_code == 410
    assert submit(mail.link, "approve", "late", csrf=csrf).status_code in (409, 410)
    again = cli(restate_server, "reassign", approval, "--to", lead)
    assert again.returncode == 1 and "already decides" in again.stderr

    assert submit(fresh.link, "approve").status_code == 200
    action = ingress.wait_output(run_id).json()["actions"][0]
    assert action["approved_by"] == [lead]
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/0", order, 70000)]


@pytest.mark.slow
def test_inbox_survives_a_handler_kill_and_expiry(isolated_stack: StackFactory, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[tools.issue_refund]\ndeadline_seconds = 6\nreminders_seconds = []\nescalate_to = []\n")
    stack = isolated_stack(app_env={"APPROVALS_POLICY_FILE": str(policy)})
    stack.ingress.start_run("inbox-kill", refund_task(new_order(stack.db_path, 100000)))
    wait_for_email(stack.outbox_dir, "inbox-kill")
    wait_until(lambda: inbox(stack.ingress, "finance@example.com") == ["inbox-kill-a0"], 20, "the inbox entry")
    stack.app.kill9()
    stack.app.restart()
    assert inbox(stack.ingress, "finance@example.com") == ["inbox-kill-a0"]
    assert stack.ingress.wait_output("inbox-kill", timeout=30).json()["actions"][0]["outcome"] == "expired"
    wait_until(lambda: inbox(stack.ingress, "finance@example.com") == [], 20, "expiry to clear the inbox")


@pytest.mark.slow
def test_bulk_cancel_and_pending_filters(isolated_stack: StackFactory) -> None:
    stack = isolated_stack()
    for run in ("old-1", "old-2"):
        stack.ingress.start_run(run, refund_task(new_order(stack.db_path, 100000)))
        wait_for_email(stack.outbox_dir, run)
    listed = cli(stack.restate, "pending", "--approver", "finance@example.com", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert {r["approval_id"] for r in rows} == {"old-1-a0", "old-2-a0"}
    assert all(r["tool"] == "issue_refund" and r["approvers"] == ["finance@example.com"] for r in rows)
    assert json.loads(cli(stack.restate, "pending", "--tool", "delete_customer", "--json").stdout) == []
    assert json.loads(cli(stack.restate, "pending", "--older-than", "1d", "--json").stdout) == []
    table = cli(stack.restate, "pending")
    assert "APPROVAL_ID" in table.stdout and "old-1-a0" in table.stdout

    wait_until(lambda: json.loads(cli(stack.restate, "pending", "--older-than", "1s", "--json").stdout), 20, "age")
    cancelled = cli(stack.restate, "cancel", "--older-than", "1s", "--reason", "stale", "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert sorted(r["run_id"] for r in json.loads(cancelled.stdout)) == ["old-1", "old-2"]
    for run in ("old-1", "old-2"):
        assert stack.ingress.wait_output(run).json()["status"] == "cancelled"
    assert cli(stack.restate, "cancel", "--reason", "x").returncode == 2


def _decided_run(stack: IsolatedStack, run: str, verdict: str, **fields: str) -> None:
    stack.ingress.start_run(run, refund_task(new_order(stack.db_path, 100000)))
    [mail] = wait_for_email(stack.outbox_dir, run)
    csrf = form_csrf(mail.link)
    origin = {"Origin": stack.app.url}
    reply = httpx.post(mail.link, data={"csrf": csrf, "verdict": verdict, **fields}, headers=origin, timeout=30)
    assert reply.status_code == 200, reply.text
    stack.ingress.wait_output(run)


@pytest.mark.slow
def test_audit_export_verify_and_tampering(isolated_stack: StackFactory, tmp_path: Path) -> None:
    stack = isolated_stack()
    _decided_run(stack, "audited", "approve", **{"edit.amount_usd": "650.00"})
    export = tmp_path / "audit.jsonl"
    wait_until(
        lambda: (
            cli(stack.restate, "audit", "export", "--run", "audited", "--out", str(export)).returncode == 0
            and '"kind":"outcome"' in export.read_text()
        ),
        20,
        "the outcome entry in the export",
    )
    entries = [json.loads(line) for line in export.read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    for kind in ("requested", "email_accepted", "page_viewed", "decided", "executed", "outcome"):
        assert kind in kinds, kinds
    requested = entries[kinds.index("requested")]
    assert requested["details"]["digest"] and requested["details"]["model"] == "scripted"
    decided = entries[kinds.index("decided")]
    assert decided["actor"] == "finance@example.com" and decided["details"]["edits"] == {"amount_usd": "650.00"}
    executed = entries[kinds.index("executed")]
    assert executed["details"]["idempotency_key"] == "audited/0"

    ok = cli(stack.restate, "audit", "verify", str(export), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"ok": True, "problems": []}

    def tampered(name: str, lines: list[str]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n")
        return cli(stack.restate, "audit", "verify", str(path), "--offline")

    lines = export.read_text().splitlines()
    changed = lines.copy()
    changed[kinds.index("decided")] = changed[kinds.index("decided")].replace("finance@", "mallory@")
    assert "changed entry" in tampered("changed", changed).stdout
    removed = lines[:2] + lines[3:]
    assert "removed or reordered" in tampered("removed", removed).stdout
    reordered = [lines[1], lines[0], *lines[2:]]
    assert "removed or reordered" in tampered("reordered", reordered).stdout
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("\n".join(lines[:-1]) + "\n")
    live = cli(stack.restate, "audit", "verify", str(truncated))
    assert live.returncode == 1 and "truncated" in live.stdout


def _refund_figures(stack: IsolatedStack, total: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        reply = cli(stack.restate, "stats", "--json")
        assert reply.returncode == 0, reply.stderr
        tools = {t["tool"]: t for t in json.loads(reply.stdout)}
        return tools["issue_refund"] if tools["issue_refund"]["total"] == total else None

    return wait_until(ready, 20, f"{total} trust-ramp samples")


@pytest.mark.slow
def test_trust_ramp_figures_and_graduation_hint(isolated_stack: StackFactory) -> None:
    stack = isolated_stack(app_env={"TRUST_RAMP_MIN_DECISIONS": "2"})
    _decided_run(stack, "t1", "approve")
    _decided_run(stack, "t2", "approve")
    clean = _refund_figures(stack, 2)
    assert clean["approval_rate"] == 1.0 and clean["rejection_rate"] == 0.0
    assert clean["graduation_hint"] and "issue_refund" in clean["graduation_hint"]
    assert clean["median_seconds_to_decision"] is not None

    _decided_run(stack, "t3", "reject", reason="too much")
    _decided_run(stack, "t4", "approve", **{"edit.amount_usd": "100.00"})
    figures = _refund_figures(stack, 4)
    assert figures["counts"] == {"approved": 2, "rejected": 1, "approved_with_edits": 1}
    assert (figures["approval_rate"], figures["rejection_rate"], figures["edit_rate"]) == (0.75, 0.25, 0.25)
    assert figures["graduation_hint"] is None
    table = cli(stack.restate, "stats")
    assert "issue_refund" in table.stdout and "GRADUATION_HINT" in table.stdout


def test_show_and_unknown_run(
    app_server: AppServer, restate_server: RestateServer, ingress: Ingress, run_id: str
) -> None:
    ingress.start_run(run_id, {"goal": "Look", "requester": "a@example.com", "script": []})
    ingress.wait_output(run_id)
    shown = cli(restate_server, "show", run_id, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["model"] == "scripted"
    text = cli(restate_server, "show", run_id)
    assert text.returncode == 0 and text.stdout.startswith(f"run {run_id}  completed  model scripted"), text.stdout
    assert "approvals: none" in text.stdout and "actions: none" in text.stdout
    missing = cli(restate_server, "show", "no-such-run")
    assert missing.returncode == 1 and "no run or approval no-such-run" in missing.stderr


def test_inbox_page(app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str) -> None:
    ingress.start_run(run_id, refund_task(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    [inbox_url] = [u for u in mail.text.split() if "/inbox/" in u]
    wait_until(lambda: f"{run_id}-a0" in inbox(ingress, "finance@example.com"), 20, "the inbox entry")
    page = httpx.get(inbox_url, timeout=30)
    assert page.status_code == 200 and "Refund $700.00" in page.text
    assert httpx.get(inbox_url[:-3] + "AAA", timeout=30).status_code == 403
    assert "Refund $700.00" in open_page(mail.link).text
    ingress.call("AgentRun", run_id, "cancel", {"reason": "cleanup"})


def test_inbox_revoke_stops_every_earlier_inbox_link_and_newer_ones_work(
    app_server: AppServer, restate_server: RestateServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    person = f"inbox-{run_id[-8:]}@reassign.example"  # an approver of this test only: revocation is per person

    def hand_to_person(run: str) -> str:
        """Start a refund, reassign it to `person`, and return the inbox link of the email they get."""
        ingress.start_run(run, refund_task(new_order(demo_db, 100000)))
        wait_for_email(outbox_dir, run)
        moved = cli(restate_server, "reassign", f"{run}-a0", "--to", person)
        assert moved.returncode == 0, moved.stderr
        mail = next(m for m in wait_for_email(outbox_dir, run, count=2) if m.message["To"] == person)
        assert "Anyone with this link can open and decide all of it for 30 days." in mail.text
        assert "anyone with that link can open and decide all of it for 30 days" in mail.html
        wait_until(lambda: f"{run}-a0" in inbox(ingress, person), 20, f"{run} in the inbox")
        [url] = [u for u in mail.text.split() if "/inbox/" in u]
        return url

    first_run, second_run = f"{run_id}-1", f"{run_id}-2"
    older = hand_to_person(first_run)
    assert httpx.get(older, timeout=30).status_code == 200

    bad = cli(restate_server, "inbox", "revoke", f"{person},mallory@example.com")
    assert bad.returncode == 2 and "not an email address" in bad.stderr
    revoked = cli(restate_server, "inbox", "revoke", person.upper(), "--json")
    assert revoked.returncode == 0, revoked.stderr
    answer = json.loads(revoked.stdout)
    assert answer["approver"] == person and answer["revoked_before_ms"] > 0
    refused = httpx.get(older, timeout=30)
    assert refused.status_code == 410 and "revoked" in refused.text and "Refund $700.00" not in refused.text
    assert httpx.head(older, timeout=30).status_code == 410

    newer = hand_to_person(second_run)
    page = httpx.get(newer, timeout=30)
    assert page.status_code == 200 and page.text.count("Refund $700.00") == 2, "both approvals, one fresh link"
    assert httpx.get(older, timeout=30).status_code == 410, "still revoked"
    for run in (first_run, second_run):
        ingress.call("AgentRun", run, "cancel", {"reason": "cleanup"})


def test_the_text_of_show_says_who_decided_what_ran_and_stays_short() -> None:
    status = {
        "run_id": "r-9",
        "phase": "completed",
        "model": "scripted",
        "goal": "Refund " + "x" * 500,
        "approvals": [
            {
                "approval_id": "r-9-a1",
                "tool": "issue_refund",
                "state": "approved_with_edits",
                "summary": "Refund $700.00 to order 7",
                "approvers": ["finance@example.com"],
                "approved_by": ["finance@example.com"],
                "decided_via": "email",
                "decided_at": 0,
                "edits": {"amount_usd": "500.00"},
                "args": {"order_id": 7, "amount_usd": "700.00"},
            }
        ],
        "audit": {"r-9-a1": [{"kind": "requested"}, {"kind": "approved"}]},
        "history": [
            {
                "index": 1,
                "tool": "issue_refund",
                "outcome": "approved_with_edits",
                "idempotency_key": "r-9/1",
                "result": {"refund_id": "rf_1"},
            }
        ],
        "webhooks": [{"outcome": "delivered"}, {"outcome": "delivered"}, {"outcome": "gave_up"}],
        "answer": "done",
    }
    text = show_view.render(status)
    lines = text.splitlines()
    assert lines[0] == "run r-9  completed  model scripted"
    assert max(len(line) for line in lines) <= 110, "long values are cut"
    assert "    approved_with_edits by finance@example.com via email at 1970-01-01 00:00:00Z" in lines
    assert '    edits: {"amount_usd": "500.00"}' in lines and "    audit: requested · approved" in lines
    assert "  #1 issue_refund  approved_with_edits  key r-9/1" in lines and '    {"refund_id": "rf_1"}' in lines
    assert "webhooks: 2 delivered, 1 gave_up" in lines and "answer: done" in lines

    # A quorum of two, one approved this round: it waits on the approver who has not voted.
    waiting = {
        "approval_id": "r-9-a2",
        "tool": "delete_customer",
        "state": "pending",
        "summary": "Delete c_31",
        "approvers": ["a@example.com", "b@example.com", "c@example.com"],
        "active_slots": [1, 2],
        "round": 2,
        "quorum": 2,
        "deadline": 86400,
        "votes": [
            {"slot": 0, "round": 1, "kind": "approve"},
            {"slot": 1, "round": 2, "kind": "approve"},
        ],
    }
    lines = show_view.render({"run_id": "r-9", "phase": "awaiting_approval", "approvals": [waiting]}).splitlines()
    assert "    waiting on c@example.com (round 2, 1 of 2 approvals), deadline 1970-01-02 00:00:00Z" in lines


def test_the_text_of_show_says_a_question_was_answered_declined_or_defaulted() -> None:
    def question(state: str, **more: Any) -> dict[str, Any]:
        return {"approval_id": f"q-{state}", "kind": "question", "tool": "question", "state": state, **more}

    answered = question("approved", decided_by="desk@example.com", decided_via="email", decided_at=0)
    answered["edits"] = {"floor": 2}
    declined = question("rejected", decided_by="desk@example.com", decided_at=0, reason="ask the customer")
    defaulted = question("approved", decision_source="deadline_default", decided_at=0, edits={"floor": 0})
    approvals = [answered, declined, defaulted]
    lines = show_view.render({"run_id": "q", "phase": "completed", "approvals": approvals}).splitlines()
    assert "  q-approved  question  answered" in lines and "  q-rejected  question  declined" in lines
    assert "    answered by desk@example.com via email at 1970-01-01 00:00:00Z" in lines
    assert '    answer: {"floor": 2}' in lines and "    reason: ask the customer" in lines
    assert "    defaulted: nobody answered by the deadline, 1970-01-01 00:00:00Z" in lines
    assert not any(line.lstrip().startswith(("approved", "rejected", "edits:")) for line in lines)
