"""Races on one approval: many mixed clicks, approve against the deadline and against a cancel, the
same link in two tabs, a double submit. Each has one winner and every answer agrees with it.
"""

from __future__ import annotations

import concurrent.futures
import random
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from support.approver import form_csrf, open_page, wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, RestateServer, StackFactory, wait_until

from handlers.demo.business_db import connect, transaction


def refund(order: int, amount: str = "700.00") -> dict[str, Any]:
    return {
        "goal": f"race on order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "race"}}],
    }


def post(link: str, csrf: str, verdict: str, reason: str) -> httpx.Response:
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(link))
    data = {"csrf": csrf, "verdict": verdict, "reason": reason}
    return httpx.post(link, data=data, headers={"Origin": origin}, timeout=60)


def audit_of(ingress: Ingress, approval_id: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = ingress.call("ApprovalAudit", approval_id, "entries", None).json()["entries"]
    return entries


def human_decisions(ingress: Ingress, approval_id: str) -> list[dict[str, Any]]:
    return [e for e in audit_of(ingress, approval_id) if e["kind"] == "decided" and e["details"]["source"] == "human"]


def slot_promises(restate: RestateServer, run_id: str) -> list[dict[str, Any]]:
    return restate.sql(
        f"SELECT key, completed FROM sys_promise WHERE service_name = 'Approval' AND service_key LIKE '{run_id}-a%'"
        " AND key LIKE 'decision:%'"
    )


def test_fifty_concurrent_mixed_clicks_have_one_winner(
    app_server: AppServer,
    ingress: Ingress,
    restate_server: RestateServer,
    outbox_dir: Path,
    demo_db: Path,
    run_id: str,
) -> None:
    order = new_order(demo_db, 125000)
    ingress.start_run(run_id, refund(order))
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    # Identical forms share one ingress idempotency key (and one receipt), so every click differs.
    clicks = [("approve" if i % 2 else "reject", f"click {i}") for i in range(50)]
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        replies = list(pool.map(lambda c: post(mail.link, csrf, *c), clicks))

    statuses = [r.status_code for r in replies]
    assert sorted(set(statuses)) == [200, 409], statuses
    [(verdict, reason)] = [c for c, r in zip(clicks, replies, strict=True) if r.status_code == 200]
    for (tried, _), reply in zip(clicks, replies, strict=True):
        if reply.status_code == 409:
            assert reason in reply.text, "every refused click shows the winning decision's reason"
            assert f"You pressed {tried.capitalize()}" in reply.text

    result = ingress.wait_output(run_id).json()
    action = result["actions"][0]
    assert action["outcome"] == ("approved" if verdict == "approve" else "rejected")
    assert len(refunds_for(demo_db, run_id)) == (1 if verdict == "approve" else 0)
    [decided] = human_decisions(ingress, action["approval_id"])
    assert (decided["details"]["verdict"], decided["details"]["reason"]) == (verdict, reason)
    assert slot_promises(restate_server, run_id) == [{"key": f"decision:{run_id}-a0:r1:s0", "completed": True}]
    assert reason in open_page(mail.link).text, "the page, opened afterwards, shows the same winner"


@pytest.mark.slow
def test_approve_racing_the_deadline_has_one_outcome_per_run(isolated_stack: StackFactory, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[tools.issue_refund]\ndeadline_seconds = 10\nreminders_seconds = []\nescalate_to = []\n")
    stack = isolated_stack(app_env={"APPROVALS_POLICY_FILE": str(policy)})
    runs = [f"deadline-race-{i}" for i in range(8)]
    for run in runs:
        stack.ingress.start_run(run, refund(new_order(stack.db_path, 100000)))
    forms = {}
    for run in runs:
        [mail] = wait_for_email(stack.outbox_dir, run)
        forms[run] = (mail.link, form_csrf(mail.link))
    deadlines = {run: stack.ingress.status(run)["pending"][0]["deadline"] for run in runs}
    # Clicks from well before each run's deadline (the click wins) to after it (the deadline wins),
    # most of them within half a second of it.
    near = sorted(random.Random(7).uniform(-0.5, 0.5) for _ in runs[2:])
    offsets = dict(zip(runs, [-3.0, *near, 1.0], strict=True))

    def click_at(run: str) -> httpx.Response:
        wait_until(lambda: time.time() >= deadlines[run] + offsets[run], 30, f"{run}'s moment to click")
        return post(forms[run][0], forms[run][1], "approve", f"just in time? {run}")

    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        replies = dict(zip(runs, pool.map(click_at, runs), strict=True))
    outcomes = []
    for run, reply in replies.items():
        action = stack.ingress.wait_output(run, timeout=60).json()["actions"][0]
        outcomes.append(action["outcome"])
        rows = refunds_for(stack.db_path, run)
        decided = human_decisions(stack.ingress, action["approval_id"])
        if reply.status_code == 200:
            assert action["outcome"] == "approved" and len(rows) == 1 and len(decided) == 1, run
        else:
            assert reply.status_code in (409, 410), (run, reply.status_code, reply.text[-300:])
            assert action["outcome"] == "expired" and rows == [] and decided == [], run
            assert "expired" in reply.text.lower()
    assert outcomes[0] == "approved" and outcomes[-1] == "expired", outcomes


def test_approve_racing_cancel_is_consistent(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    # When the cancel leaves, relative to the click: before it, together, shortly after, and (None)
    # only once the click was answered, so both sides win at least once.
    offsets: list[float | None] = [-1.0, -0.05, 0.0, 0.0, 0.05, 0.1, 0.3, None]
    runs = [f"{run_id}-{i}" for i in range(len(offsets))]
    for run in runs:
        ingress.start_run(run, refund(new_order(demo_db, 100000)))
    forms = {}
    for run in runs:
        [mail] = wait_for_email(outbox_dir, run)
        forms[run] = (mail.link, form_csrf(mail.link))
    start = time.monotonic() + 0.5

    def at(moment: float) -> None:
        wait_until(lambda: time.monotonic() >= moment, 30, "the moment to act", interval=0.005)

    with concurrent.futures.ThreadPoolExecutor(2 * len(runs)) as pool:

        def approve(run: str, offset: float | None) -> httpx.Response:
            at(start + max(0.0, -(offset or 0.0)))
            return post(*forms[run], "approve", f"approve {run}")

        def cancel(run: str, offset: float | None) -> httpx.Response:
            if offset is None:
                clicks[run].result()
            else:
                at(start + max(0.0, offset))
            return ingress.call("AgentRun", run, "cancel", {"reason": f"cancel {run}"})

        clicks = {run: pool.submit(approve, run, o) for run, o in zip(runs, offsets, strict=True)}
        cancels = {run: pool.submit(cancel, run, o) for run, o in zip(runs, offsets, strict=True)}
        answers = {run: (clicks[run].result(), cancels[run].result()) for run in runs}
    winners = []
    for run, (approved, cancelled) in answers.items():
        receipt = cancelled.json()
        result = ingress.wait_output(run).json()
        action, rows = result["actions"][0], refunds_for(demo_db, run)
        if approved.status_code == 200:
            winners.append("approve")
            assert action["outcome"] == "approved" and len(rows) == 1, run
            assert receipt["cancelled_approvals"] == [], run
        else:
            winners.append("cancel")
            assert approved.status_code == 409 and "cancel" in approved.text.lower(), run
            assert action["outcome"] == "cancelled" and rows == [], run
            assert receipt["cancelled_approvals"] == [action["approval_id"]] and result["status"] == "cancelled"
    assert winners[0] == "cancel" and winners[-1] == "approve", winners


def test_same_link_in_two_tabs(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    first_tab, second_tab = form_csrf(mail.link), form_csrf(mail.link)
    assert post(mail.link, first_tab, "approve", "tab one").status_code == 200
    stale = post(mail.link, second_tab, "reject", "tab two")
    assert stale.status_code == 409 and "You pressed Reject" in stale.text and "tab one" in stale.text
    again = post(mail.link, second_tab, "approve", "tab two, approving too")
    assert again.status_code == 409
    reloaded = open_page(mail.link)
    assert reloaded.status_code == 200 and 'name="csrf"' not in reloaded.text and "tab one" in reloaded.text
    result = ingress.wait_output(run_id).json()
    assert result["actions"][0]["outcome"] == "approved" and result["actions"][0]["reason"] == "tab one"
    assert len(refunds_for(demo_db, run_id)) == 1
    assert [d["details"]["reason"] for d in human_decisions(ingress, f"{run_id}-a0")] == ["tab one"]


def test_double_submit_is_one_decision(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(lambda _: post(mail.link, csrf, "approve", "pressed twice"), range(5)))
    assert [r.status_code for r in replies] == [200] * 5
    assert len({r.text for r in replies}) == 1, "the same receipt, replayed"
    ingress.wait_output(run_id)
    late_double = post(mail.link, csrf, "approve", "pressed twice")
    assert late_double.status_code == 200 and late_double.text == replies[0].text
    assert len(refunds_for(demo_db, run_id)) == 1
    assert len(human_decisions(ingress, f"{run_id}-a0")) == 1
    assert [e["kind"] for e in audit_of(ingress, f"{run_id}-a0")].count("executed") == 1


def test_every_accepted_vote_is_audited_even_when_another_decided_first(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    """Two approvers of one deletion press at once, one to reject and one to approve. When the rejection
    decides before the run has counted the approval, that approval was still accepted (its person was
    told it is recorded), so the audit trail must hold it too."""
    runs = {f"{run_id}-{i}": f"c_{new_order(demo_db, 100)}" for i in range(6)}
    for run, customer in runs.items():
        with connect(demo_db) as db, transaction(db):
            db.execute("INSERT INTO customers(id, name, email) VALUES (?, 'Race', 'r@example.com')", (customer,))
        delete = {"tool": "delete_customer", "args": {"customer_id": customer, "reason": "race"}}
        ingress.start_run(run, {"goal": "quorum race", "requester": "alice@example.com", "script": [delete]})
    forms = []
    for run in runs:
        for mail in wait_for_email(outbox_dir, run, count=2):
            person = str(mail.message["To"])
            vote = "reject" if person == "ops@example.com" else "approve"
            forms.append((run, person, vote, mail.link, form_csrf(mail.link)))
    with concurrent.futures.ThreadPoolExecutor(len(forms)) as pool:
        replies = list(pool.map(lambda f: post(f[3], f[4], f[2], f"{f[2]} by {f[1]}"), forms))
    for (run, person, vote, _, _), reply in zip(forms, replies, strict=True):
        ingress.wait_output(run)
        audited = [d["details"] for d in human_decisions(ingress, f"{run}-a0") if d["actor"] == person]
        if reply.status_code == 200:
            assert [(d["verdict"], d["reason"]) for d in audited] == [(vote, f"{vote} by {person}")], run
        else:
            assert audited == [], (run, person, reply.status_code)
