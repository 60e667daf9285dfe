"""Cost at fleet scale: no object that every run of one approver or one tool shares is on the decision
path, a run's bookkeeping is one call per phase (its approvals' and its look-ups' together), the views
stay whole, and a finished run keeps its record, not its journal.

Every run here has the same approver (finance@example.com) and the same gated tool (issue_refund).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from support.approver import form_csrf, open_page, submit, wait_for_email
from support.business import new_order
from support.processes import AppServer, Ingress, RestateServer, wait_until

from countersign.objects.shards import SHARDS, books_key, books_keys, is_shard, shard_key, shard_keys
from countersign.objects.trust import booked_head

APPROVER, TOOL = "finance@example.com", "issue_refund"
RUNS = 8


def refund_task(order: int) -> dict[str, Any]:
    step = {"tool": TOOL, "args": {"order_id": order, "amount_usd": "700.00", "reason": "fleet"}}
    return {"goal": "fleet test", "requester": "alice@example.com", "script": [step]}


def inbox(ingress: Ingress) -> set[str]:
    reply = ingress.call("ApprovalInbox", APPROVER, "pending", None)
    reply.raise_for_status()
    return {item["approval_id"] for item in reply.json()["pending"]}


def figures(ingress: Ingress) -> dict[str, Any]:
    reply = ingress.call("ToolStats", TOOL, "stats", None)
    reply.raise_for_status()
    found: dict[str, Any] = reply.json()
    return found


def sends_of(restate: RestateServer, approvals: list[str], service: str) -> list[str]:
    """The keys of `service` the approvals' journals send to: their own workflows', and their runs'
    (a run sends the first request, and what the inbox learns of it)."""
    keys = ", ".join(f"'{a}'" for a in approvals)
    runs = ", ".join(f"'{a.rsplit('-a', 1)[0]}'" for a in approvals)
    rows = restate.sql(
        "select j.entry_json from sys_journal j join sys_invocation i on i.id = j.id"
        f" where ((i.target_service_name = 'Approval' and i.target_service_key in ({keys}))"
        f" or (i.target_service_name = 'AgentRun' and i.target_service_key in ({runs})))"
        " and j.entry_type = 'Command: OneWayCall'"
    )
    named = re.compile(f'"name":"{service}","key":"([^"]+)"')
    return [key for row in rows for key in named.findall(row["entry_json"])]


def test_shard_keys_are_stable_spread_and_never_a_plain_key() -> None:
    ids = [f"run-{n}-a0" for n in range(400)]
    assert [shard_key(APPROVER, i) for i in ids] == [shard_key(APPROVER, i) for i in ids], "deterministic"
    used = {shard_key(APPROVER, i) for i in ids}
    assert used == set(shard_keys(APPROVER)) and len(used) == SHARDS
    assert all(is_shard(k) for k in used)
    assert not is_shard(APPROVER) and not is_shard(TOOL) and not is_shard("a#b@example.com")
    assert shard_key("a#b@example.com", "x") != "a#b@example.com"
    assert {books_key(i) for i in ids} == set(books_keys()) and [books_key(i) for i in ids[:5]] == [
        books_key(i) for i in ids[:5]
    ]


def test_one_approver_and_one_tool_share_no_key_and_the_views_stay_whole(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    before = figures(ingress)
    runs = [f"{run_id}-{n}" for n in range(RUNS)]
    approvals = [f"{run}-a0" for run in runs]
    for run in runs:
        ingress.start_run(run, refund_task(new_order(demo_db, 100000)))
    mails = {run: wait_for_email(outbox_dir, run)[0] for run in runs}
    wait_until(lambda: set(approvals) <= inbox(ingress), 30, "the approver's inbox to list every run")

    # While they wait: each approval's request reached its bookkeeping shard in one call (inbox entry
    # and audit entries together), the shards spread over several keys, and no call went to an
    # object of the approver or the tool.
    booked = sends_of(restate_server, approvals, "Bookkeeping")
    assert sorted(booked) == sorted(books_key(a) for a in approvals), booked
    assert len(set(booked)) > 1, "runs of one approver spread over several keys"
    for service in ("ApprovalInbox", "ApprovalAudit", "ToolStats"):
        assert sends_of(restate_server, approvals, service) == [], service
    own = restate_server.sql(
        f"select key from state where service_name = 'ApprovalInbox' and service_key like '{APPROVER}%'"
        " and key like 'entry:%'"
    )
    assert own == [], "the approver's keys hold no entry (only the revocation point)"

    for run in runs:
        assert submit(mails[run].link, "approve").status_code == 200
    for run in runs:
        assert ingress.wait_output(run).json()["status"] == "completed"
    wait_until(lambda: not set(approvals) & inbox(ingress), 30, "the inbox to drop every decided run")

    def counted() -> dict[str, Any] | None:
        now = figures(ingress)
        return now if now["total"] == before["total"] + RUNS else None

    after = wait_until(counted, 30, "every decision in the trust figures")
    assert after["counts"].get("approved", 0) == before["counts"].get("approved", 0) + RUNS
    assert after["human_decisions"] == before["human_decisions"] + RUNS
    assert after["median_seconds_to_decision"] is not None

    # The tool's figures: one small value per sample in the bookkeeping shards, nothing in ToolStats,
    # and no value that grows with the number of decisions; an approval's audit trail is its own value.
    kept = restate_server.sql(
        "select service_key, key, length(value) as n from state where service_name = 'Bookkeeping'"
    )
    ring = {(row["service_key"], row["key"]) for row in kept if row["key"].startswith(f"{booked_head(TOOL)}:")}
    assert len(ring) >= RUNS and {shard for shard, _ in ring} >= {books_key(a) for a in approvals}
    tool_keys = f"select key from state where service_name = 'ToolStats' and service_key like '{TOOL}%'"
    assert not restate_server.sql(tool_keys), "nothing in the tool's own objects"
    assert max(int(row["n"]) for row in kept if not row["key"].startswith("audit:")) < 1024, "figures stay small"
    trails = [int(row["n"]) for row in kept if row["key"] in {f"audit:{a}" for a in approvals}]
    assert len(trails) == RUNS and max(trails) < 8192, trails


def test_a_run_tells_its_shard_once_before_it_waits_its_look_ups_included(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    """Two look-ups that run alone, then a gated refund: the look-ups' trail entries wait in the run's
    book and go with the request's inbox entry and audit entries, in one call to the run's shard."""
    order = new_order(demo_db, 100000)
    lookup = {"tool": "lookup_order", "args": {"order_id": order}}
    refund = {"tool": TOOL, "args": {"order_id": order, "amount_usd": "700.00", "reason": "fleet"}}
    ingress.start_run(run_id, {"goal": "g", "requester": "alice@example.com", "script": [lookup, lookup, refund]})
    [mail] = wait_for_email(outbox_dir, run_id)
    lookups, gated = [f"{run_id}-a0", f"{run_id}-a1"], f"{run_id}-a2"

    def trail(approval_id: str) -> list[str]:
        return [e["kind"] for e in ingress.call("ApprovalAudit", approval_id, "entries", None).json()["entries"]]

    wait_until(lambda: all(trail(a) == ["autonomous"] for a in lookups), 30, "the look-ups' trails")
    assert sends_of(restate_server, [gated], "Bookkeeping") == [books_key(gated)], "one call while it waits"
    assert {books_key(a) for a in [*lookups, gated]} == {books_key(gated)}, "one shard for the run"
    assert trail(gated)[0] == "requested" and gated in inbox(ingress)
    assert submit(mail.link, "approve").status_code == 200
    assert ingress.wait_output(run_id).json()["status"] == "completed"
    assert trail(lookups[0]) == ["autonomous"], "sent once"


def test_a_run_of_look_ups_alone_leaves_their_trails_when_it_ends(
    app_server: AppServer, ingress: Ingress, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 100000)
    lookup = {"tool": "lookup_order", "args": {"order_id": order}}
    ingress.start_run(run_id, {"goal": "g", "requester": "alice@example.com", "script": [lookup] * 3})
    assert ingress.wait_output(run_id).json()["status"] == "completed"

    def kinds(approval_id: str) -> list[str]:
        return [e["kind"] for e in ingress.call("ApprovalAudit", approval_id, "entries", None).json()["entries"]]

    wait_until(lambda: all(kinds(f"{run_id}-a{i}") == ["autonomous"] for i in range(3)), 30, "every trail")


def test_a_late_click_on_a_finished_run_reads_the_decision_from_the_kept_record(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund_task(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    stale_tab = form_csrf(mail.link)
    assert submit(mail.link, "approve").status_code == 200
    assert ingress.wait_output(run_id).json()["status"] == "completed"
    approval = f"{run_id}-a0"

    def journals() -> int:
        rows = restate_server.sql(
            "select count(*) as n from sys_journal j join sys_invocation i on i.id = j.id"
            f" where i.target_service_key in ('{run_id}', '{approval}')"
        )
        return int(rows[0]["n"])

    wait_until(lambda: journals() == 0, 20, "the finished run's journals to go")
    page = open_page(mail.link)
    assert page.status_code == 200 and "approved by finance@example.com at " in page.text, page.text
    late = submit(mail.link, "reject", "changed my mind", csrf=stale_tab)
    assert late.status_code == 409, late.text
    assert "this was already decided" in late.text and "approved by finance@example.com at " in late.text, late.text
    assert journals() == 0, "a late click leaves no journal behind either"
