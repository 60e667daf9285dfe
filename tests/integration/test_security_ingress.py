"""The ingress as an attack surface: internal handlers refused, forged audit ids loud, reassign bounded.

Against the real restate-server (both deployment protocols): every handler that only Countersign's
own services call is `ingress_private`, so the ingress refuses it and nothing changes, while the
same handlers keep working service to service; an audit entry id reused with other content is a
conflict that `verify` reports; `reassign` refuses an address the policy does not allow, changing
nothing, and records who asked when it is allowed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest
from support.approver import open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.operator import audit_entries, cli, inbox
from support.processes import REPO, AppServer, Ingress, RestateServer, wait_until
from support.runs import refund_task

from countersign.objects.audit import GENESIS, AuditEntry, AuditLog, _append, verify
from countersign.objects.shards import books_key
from countersign.settings import Settings


def forged_entry(run_id: str, approval: str, kind: str, entry_id: str) -> dict[str, Any]:
    return {
        "entry_id": entry_id,
        "approval_id": approval,
        "run_id": run_id,
        "tenant": "default",
        "kind": kind,
        "at": time.time(),
        "actor": "mallory@evil.test",
        "details": {"forged": True},
    }


def internal_calls(run_id: str, approval: str) -> list[tuple[str, str, str, Any]]:
    """(service, key, handler, a well-formed body) of every handler only Countersign's services call."""
    event = {
        "id": "evt_" + "0" * 32,
        "type": "approval.decided",
        "tenant": "default",
        "run_id": run_id,
        "subject": approval,
        "at": 1.0,
        "data": {"verdict": "approved", "forged": True},
    }
    inbox_entry = {
        "approval_id": approval,
        "run_id": run_id,
        "tenant": "default",
        "tool": "issue_refund",
        "summary": "forged",
        "digest": "0" * 64,
        "round": 99,
        "requested_at": 1.0,
        "deadline": 2.0,
    }
    return [
        ("ApprovalAudit", approval, "append", forged_entry(run_id, approval, "requested", "requested/r1")),
        (
            "ApprovalAudit",
            approval,
            "append_all",
            {"entries": [forged_entry(run_id, approval, "decided", "decided/r1/s0")]},
        ),
        ("ApprovalInbox", "finance@example.com", "apply", {"change": "remove", "entry": inbox_entry}),
        (
            "Bookkeeping",
            books_key(approval),
            "apply",
            {
                "approval_id": approval,
                "audit": [forged_entry(run_id, approval, "decided", "decided/r1/s0")],
                "inbox": [{"approver": "finance@example.com", "event": {"change": "remove", "entry": inbox_entry}}],
                "sample": {"approval_id": approval, "outcome": "approved", "human": True},
                "tool": "issue_refund",
            },
        ),
        (
            "Bookkeeping",
            books_key(approval),
            "apply_run",
            {
                "notices": [
                    {"approval_id": approval, "audit": [forged_entry(run_id, approval, "decided", "decided/r1/s1")]}
                ]
            },
        ),
        ("Bookkeeping", books_key(approval), "audit", approval),
        ("ApprovalInbox", "mallory@evil.test", "apply", {"change": "add", "entry": inbox_entry}),
        (
            "ToolStats",
            "issue_refund",
            "record",
            {"approval_id": f"{approval}-forged", "outcome": "approved", "human": True, "seconds_to_decision": 1.0},
        ),
        (
            "EmailDelivery",
            approval,
            "record",
            {
                "event_id": "msg_forged",
                "type": "email.bounced",
                "email_id": "em_forged",
                "kind": "request",
                "run_id": run_id,
                "approval_id": approval,
                "round": 1,
                "slot": 0,
            },
        ),
        ("Approval", approval, "run", {"record": {"approval_id": approval}, "policy": {"forged": True}}),
        (
            "Approval",
            approval,
            "cancel_frozen",
            {"request": {"reason": "forged", "by": "mallory"}, "digest": "0" * 64, "approvers": 1},
        ),
        (
            "Approval",
            approval,
            "delivery_failed",
            {
                "run_id": run_id,
                "approval_id": approval,
                "round": 1,
                "slot": 0,
                "kind": "request",
                "event": "email.bounced",
                "email_id": "em_forged",
                "detail": "forged",
                "failed_slots": [0],
            },
        ),
        (
            "AgentRun",
            run_id,
            "delivery_failed",
            {
                "run_id": run_id,
                "approval_id": approval,
                "round": 1,
                "slot": 0,
                "kind": "request",
                "event": "email.bounced",
                "email_id": "em_forged",
                "detail": "forged",
                "failed_slots": [0],
            },
        ),
        ("WebhookEvents", f"default:{approval}", "publish", event),
        ("WebhookDelivery", f"default:r0:{approval}", "deliver", event),
        (
            "WebhookLog",
            run_id,
            "record",
            {
                "webhook_id": event["id"],
                "type": "approval.decided",
                "tenant": "default",
                "subject": approval,
                "endpoint": "r0",
                "outcome": "delivered",
                "attempts": 1,
                "at": 1.0,
            },
        ),
    ]


def test_the_ingress_refuses_every_internal_handler_and_nothing_changes(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    approval = f"{run_id}-a0"
    # Before the run exists (the audit ids are predictable) and while it waits: both refused.
    first = internal_calls(run_id, approval)[0]
    early = ingress.call(first[0], first[1], first[2], first[3], {"connection": "close"})  # see below
    assert early.status_code >= 400, early.text
    ingress.start_run(run_id, refund_task(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    wait_until(lambda: approval in inbox(ingress, "finance@example.com"), 20, "the inbox (a service-to-service send)")
    kinds = wait_until(
        lambda: [e["kind"] for e in audit_entries(ingress, approval)] or None, 20, "the trail (service to service)"
    )
    assert kinds[0] == "requested"
    stats_before = ingress.call("ToolStats", "issue_refund", "stats", None).json()

    for service, key, handler, body in internal_calls(run_id, approval):
        for path in (f"/{service}/{key}/{handler}", f"/{service}/{key}/{handler}/send"):
            # Each on a connection of its own: the ingress may close one after refusing a request
            # whose body it did not read, and a client that sent the next request on it meanwhile
            # saw "Server disconnected" (about one run in four).
            answer = ingress.post_json(path, body, {"connection": "close"})
            assert answer.status_code == 400, (path, answer.status_code, answer.text)
            assert "private" in answer.text.lower() or "not public" in answer.text.lower(), answer.text

    # Nothing the forgeries aimed at changed: the trail, the inboxes, the ramp, the delivery log, the run.
    trail = audit_entries(ingress, approval)
    assert not any(e["details"].get("forged") for e in trail), trail
    assert trail[0]["details"]["tool"] == "issue_refund" and trail[0]["actor"] is None
    assert approval in inbox(ingress, "finance@example.com")
    assert inbox(ingress, "mallory@evil.test") == []
    assert ingress.call("ToolStats", "issue_refund", "stats", None).json() == stats_before
    assert ingress.call("EmailDelivery", approval, "log", None).json()["events"] == []
    assert ingress.call("WebhookLog", run_id, "outcomes", None).json()["outcomes"] == []
    [pending] = ingress.status(run_id)["pending"]
    assert pending["approvers"] == ["finance@example.com"] and pending["round"] == 1

    # The public surface still answers, and the run still completes through it.
    assert open_page(mail.link).status_code == 200
    assert submit(mail.link, "approve").status_code == 200
    assert ingress.wait_output(run_id).json()["status"] == "completed"
    done = wait_until(
        lambda: (t := audit_entries(ingress, approval)) and t[-1]["kind"] == "outcome" and t, 20, "the outcome"
    )
    assert "page_viewed" in [e["kind"] for e in done], "page views still reach the trail, via Approval.viewed"
    assert len(refunds_for(demo_db, run_id)) == 1
    check = restate_server.sql(
        "select count(*) as n from sys_invocation where target_handler_name = 'delivery_failed'"
        f" and target_service_key in ('{run_id}', '{approval}')"
    )
    assert check[0]["n"] == 0, "the forged bounce never reached the run"


def test_a_page_view_is_refused_without_a_valid_link(app_server: AppServer, ingress: Ingress, run_id: str) -> None:
    answer = ingress.call("Approval", f"{run_id}-a0", "viewed", {"token": "not-a-valid-token-at-all"})
    assert 400 <= answer.status_code < 500, answer.text


def test_a_forged_audit_entry_id_is_a_conflict_that_verify_reports() -> None:
    real = AuditEntry.model_validate(forged_entry("run-1", "run-1-a0", "requested", "requested/r1"))
    real = real.model_copy(update={"actor": None, "details": {"tool": "issue_refund"}})
    forged = AuditEntry.model_validate(forged_entry("run-1", "run-1-a0", "requested", "requested/r1"))
    log = AuditLog(approval_id="run-1-a0")
    _append(log, forged)  # the forgery came first, with the id the run will use
    written = _append(log, real)
    assert [e.details for e in log.entries] == [{"forged": True}, {"tool": "issue_refund"}], "nothing is dropped"
    assert written.details == {"tool": "issue_refund"} and written.prev == log.entries[0].hash != GENESIS
    problems = verify(log.entries)
    assert len(problems) == 1 and "'requested/r1' was already used by entry 0" in problems[0], problems
    assert _append(log, real) == written and len(log.entries) == 2, "a retried identical entry is still one entry"


def test_a_trail_of_two_chains_verifies_each_and_still_catches_a_change() -> None:
    """An approval begun before the bookkeeping shards keeps the chain it began in `ApprovalAudit`
    and continues in its shard: `entries` gives both, and each is checked on its own."""
    older, newer = AuditLog(approval_id="run-1-a0"), AuditLog(approval_id="run-1-a0")
    for log, kinds in ((older, ("requested", "email_accepted")), (newer, ("page_viewed", "decided", "outcome"))):
        for n, kind in enumerate(kinds):
            _append(log, AuditEntry.model_validate(forged_entry("run-1", "run-1-a0", kind, f"{kind}/{n}")))
    trail = [*older.entries, *newer.entries]
    assert verify(trail) == []
    changed = [*trail[:3], trail[3].model_copy(update={"details": {"verdict": "approve"}}), trail[4]]
    [problem] = verify(changed)
    assert "entry 3" in problem and "content does not match its hash" in problem, problem
    assert verify([*trail[:3], *trail[4:]]), "an entry removed from the second chain is caught"
    assert verify([*trail[:1], *trail[2:]]) == [], "(the end of a chain is checked against Restate's, live)"


def test_audit_verify_says_not_intact_for_a_conflicting_export(tmp_path: Path) -> None:
    log = AuditLog(approval_id="run-1-a0")
    for details in ({"forged": True}, {"tool": "issue_refund"}):
        entry = AuditEntry.model_validate(forged_entry("run-1", "run-1-a0", "requested", "requested/r1"))
        _append(log, entry.model_copy(update={"details": details}))
    export = tmp_path / "audit.jsonl"
    export.write_text("".join(json.dumps(e.model_dump(mode="json")) + "\n" for e in log.entries), encoding="utf-8")
    checked = _verify_offline(export)
    assert checked.returncode == 1 and "already used by entry 0" in checked.stdout, checked.stdout + checked.stderr


def test_audit_verify_of_an_empty_or_unreadable_export_verifies_nothing_and_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    nothing = _verify_offline(empty)
    assert nothing.returncode == 1 and "nothing was verified" in nothing.stdout, nothing.stdout + nothing.stderr
    assert "intact" not in nothing.stdout
    missing = _verify_offline(tmp_path / "missing.jsonl")
    assert missing.returncode == 1 and missing.stdout == "", missing.stdout
    assert missing.stderr == f"error: cannot read {tmp_path / 'missing.jsonl'}: No such file or directory\n"


def _verify_offline(export: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "countersign", "audit", "verify", str(export), "--offline"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_reassign_outside_the_policy_is_refused_and_changes_nothing(
    app_server: AppServer, restate_server: RestateServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund_task(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    approval = f"{run_id}-a0"
    wait_until(lambda: approval in inbox(ingress, "finance@example.com"), 20, "the first inbox")
    trail_before = wait_until(lambda: audit_entries(ingress, approval) or None, 20, "the trail")
    status_before = ingress.status(run_id)["approvals"]

    refused = cli(restate_server, "reassign", approval, "--to", "mallory@evil.test", "--reason", "trust me")
    # The address itself is scrubbed from error text (countersign.security.redact), which bypasses the journal codec.
    assert refused.returncode == 1 and "may not decide issue_refund" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    direct = ingress.call("AgentRun", run_id, "reassign", {"approval_id": approval, "to": "Mallory@Evil.test"})
    assert direct.status_code == 403 and "APPROVALS_REASSIGN_ALLOWED" in direct.text

    assert ingress.status(run_id)["approvals"] == status_before, "same round, approvers, nonces"
    assert inbox(ingress, "mallory@evil.test") == []
    assert audit_entries(ingress, approval) == trail_before
    assert len(wait_for_email(outbox_dir, run_id)) == 1, "no email to the refused address"
    assert open_page(mail.link).status_code == 200, "the approver's link still works"

    # The escalation chain is the policy's: allowed, and the trail says who asked.
    moved = cli(restate_server, "reassign", approval, "--to", "finance-lead@example.com", "--by", "ops:dana", "--json")
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["by"] == "ops:dana"
    entry = wait_until(
        lambda: next((e for e in audit_entries(ingress, approval) if e["kind"] == "reassigned"), None),
        20,
        "the reassignment in the trail",
    )
    assert entry["actor"] == "ops:dana" and entry["details"]["now"] == ["finance-lead@example.com"]
    ingress.call("AgentRun", run_id, "cancel", {"reason": "test cleanup"})


def test_the_reassign_allow_list_is_validated_and_matches_addresses_and_domains() -> None:
    settings = Settings.model_validate({"approvals_reassign_allowed": " Carol@Example.com, @Partner.example.org "})
    assert settings.approvals_reassign_allowed == ["carol@example.com", "@partner.example.org"]
    assert settings.may_reassign_to("CAROL@example.com") and settings.may_reassign_to("x@partner.example.org")
    assert not settings.may_reassign_to("x@example.com") and not settings.may_reassign_to("x@evil.partner.example.org")
    for bad in ("carol", "@", "example.com", "a@b@c.com"):
        with pytest.raises(ValueError, match="neither an email address nor an @domain"):
            Settings.model_validate({"approvals_reassign_allowed": bad})


def test_a_bad_reassign_allow_list_stops_the_process_at_start() -> None:
    started = subprocess.run(
        [sys.executable, "-m", "countersign", "serve", "--bind", "127.0.0.1:1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "APPROVALS_REASSIGN_ALLOWED": "not-an-address"},
    )
    assert started.returncode != 0 and "approvals_reassign_allowed" in started.stderr.lower()
    assert "Traceback" not in started.stderr


def test_public_handlers_stay_public(app_server: AppServer, restate_server: RestateServer) -> None:
    """What the pages, the CLI and the webhook route call through the ingress is still reachable."""
    public = {
        "AgentRun": {"run", "status", "decide", "cancel", "reassign"},
        "Approval": {"status", "decide", "submit", "cancel", "reassign", "viewed", "slack_decide"},
        "ApprovalInbox": {"pending", "revoke_links"},
        "ApprovalAudit": {"entries"},
        "EmailDelivery": {"log"},
        "ToolStats": {"stats"},
        "TrustRamp": {"report"},
        "ResendWebhook": {"receive"},
        "WebhookLog": {"outcomes"},
        "Bookkeeping": set(),
    }
    private = {
        "AgentRun": {"delivery_failed"},
        "Approval": {"run", "delivery_failed", "cancel_frozen"},
        "ApprovalInbox": {"apply", "entries"},
        "ApprovalAudit": {"append", "append_all"},
        "Bookkeeping": {"apply", "apply_run", "audit", "inbox", "samples"},
        "EmailDelivery": {"record"},
        "ToolStats": {"record", "samples"},
        "WebhookEvents": {"publish"},
        "WebhookDelivery": {"deliver"},
        "WebhookLog": {"record"},
    }
    for service in public:
        described = httpx.get(f"{restate_server.admin_url}/services/{service}", timeout=10).json()
        handlers = {h["name"]: h for h in described["handlers"]}
        assert {n for n, h in handlers.items() if h.get("public", True)} == public[service], service
        assert {n for n, h in handlers.items() if not h.get("public", True)} == private.get(service, set()), service


def _public_handlers_with_input() -> list[tuple[str, str]]:
    """(service, handler) of every handler of Countersign's that the ingress reaches with an input."""
    from countersign.runtime.services import countersign_services

    return [
        (service.name, name)
        for service in countersign_services()
        for name, handler in service.handlers.items()
        if handler.arity == 2 and not handler.ingress_private
    ]


BAD_BODIES: list[tuple[str, bytes | None]] = [
    ("no body", None),
    ("empty", b""),
    ("blank", b"  \n"),
    ("null", b"null"),
    ("a list", b"[]"),
    ("a string", b'"x"'),
    ("not JSON", b"{"),
    ("an unknown field", b'{"unexpected": 1}'),
]


@pytest.mark.parametrize(("service", "handler"), _public_handlers_with_input())
def test_a_missing_or_misshaped_input_is_a_terminal_400(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, service: str, handler: str
) -> None:
    """Every input-taking handler the ingress reaches refuses a missing, empty or mis-shaped body
    with a 400 that names what is wrong, and leaves no invocation retrying or paused."""
    keys = []
    for label, body in BAD_BODIES:
        key = f"bad-input-{service.lower()}-{handler}-{uuid4().hex[:8]}"
        keys.append(key)
        path = f"/{service}/{handler}" if service == "ResendWebhook" else f"/{service}/{key}/{handler}"
        headers = {} if body is None else {"content-type": "application/json"}
        reply = ingress.client.post(path, content=body, headers=headers)
        assert reply.status_code == 400, (label, reply.status_code, reply.text)
        message = reply.json()["message"]
        # Restate's ingress itself refuses an empty body sent as JSON; the handler refuses the rest.
        named = ("a JSON body is required", "invalid ", "Empty body not allowed")
        assert any(words in message for words in named), (label, message)
        assert "Traceback" not in reply.text
    quoted = ", ".join(f"'{k}'" for k in keys)
    stuck = restate_server.sql(
        f"SELECT target, status FROM sys_invocation WHERE target_service_name = '{service}' "
        f"AND target_handler_name = '{handler}' AND status != 'completed' "
        + ("" if service == "ResendWebhook" else f"AND target_service_key IN ({quoted})")
    )
    assert stuck == [], stuck
