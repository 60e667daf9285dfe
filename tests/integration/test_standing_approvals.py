"""Standing approvals against the real restate-server: an approver approves a refund and lets calls
like it (same order, an amount no larger, at most two calls, for the time they pick) run without
asking; the next such call runs alone, once, with its audit entry naming the grant and who gave it;
a call outside a bound is asked, and its email says which bound it missed; the use limit holds under
concurrent calls; an expired or revoked grant covers nothing; a kill -9 between a grant's use and the
effect uses it once and runs the effect once; a forged grant field is a 400 that grants nothing."""

from __future__ import annotations

import contextlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fakes.webhook_receiver import Delivery, config, running
from support.approver import approval_emails, form_csrf, open_page, submit, submit_form, wait_for_email
from support.business import new_order, refunds_for
from support.operator import cli
from support.processes import IsolatedStack, StackFactory, user_services, wait_until
from support.runs import refund

from countersign.approval.standing import offer
from countersign.contract import GrantOffer
from countersign.ops.fatigue import fatigue
from countersign.tools.policy import GrantPolicy, PolicyError, PolicyVerdict, ToolPolicy
from countersign.tools.policy_file import merge

POLICY = """
[tools.issue_refund.grants]
max_seconds = 86400
max_uses = 2
same = ["order_id"]
at_most = ["amount_usd"]

[tools.email_customer.grants]
max_seconds = 3600
max_uses = 1
same = ["customer_id"]
"""
GRANTOR = "finance@example.com"
ALICE = "alice@example.com"
"""The requester of the tests on a stack of their own. A grant covers the calls of one tool for one
requester, and a call not covered is told why the last live grant under that key missed it: so each
test on the module's stack asks for a requester of its own (and lists only its grants)."""


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("project") / "policy.toml"
    path.write_text(POLICY)
    return path


def _env(policy_file: Path, **more: str) -> dict[str, str]:
    """The user's handlers (`myshop.agents` in tests/support/user_code) and the grants policy."""
    return {**user_services("myshop.agents:served"), "APPROVALS_POLICY_FILE": str(policy_file), **more}


@pytest.fixture(scope="module")
def module_stack_app_env(policy_file: Path) -> dict[str, str]:
    """The app's settings (conftest's `module_stack`): the user's handlers and the grants policy."""
    return _env(policy_file)


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test asks under run ids, object keys, orders and a requester of its own."""
    return module_stack


def _act(stack: IsolatedStack, run_id: str, order: int, amount: str, customer: str = "", requester: str = ALICE) -> str:
    """Ask at the desk `customer` (a Virtual Object: one call at a time per key; by default the
    requester's own desk, so a call another test left waiting there holds up none of this test's)."""
    ask = {"run_id": run_id, "tool": "issue_refund", "args": refund(order, amount), "index": 0, "requester": requester}
    return stack.ingress.send("RefundDesk", customer or f"c-{requester}", "act", ask)


def _grant_first(
    stack: IsolatedStack, run_id: str, order: int, seconds: str = "3600", requester: str = ALICE
) -> dict[str, Any]:
    """A refund of $800 approved with a standing approval for `seconds`: its record."""
    invocation = _act(stack, run_id, order, "800.00", requester=requester)
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    page = open_page(mail.link)
    assert page.status_code == 200 and 'name="grant"' in page.text
    # The scope in plain words, before the approver confirms.
    assert f"Calls of issue_refund asked for {requester} with order_id = " in page.text
    assert "amount_usd ≤ 800.00" in page.text and "at most 2 calls" in page.text
    assert submit(mail.link, "approve", grant=seconds).status_code == 200
    record: dict[str, Any] = stack.ingress.wait_invocation(invocation).json()
    assert record["outcome"] == "approved"
    return record


def _grants(stack: IsolatedStack, requester: str | None = None) -> list[dict[str, Any]]:
    """Every grant on the stack, or (on the module's stack) those given for `requester`'s calls."""
    done = cli(stack.restate, "grants", "list", "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return [row for row in rows if requester is None or row["scope_value"] == requester]


def _audit(stack: IsolatedStack, approval_id: str, kind: str) -> dict[str, Any] | None:
    entries = stack.ingress.call("ApprovalAudit", approval_id, "entries", None).json()["entries"]
    found = [e for e in entries if e["kind"] == kind]
    return found[0] if found else None


def test_a_grant_lets_the_next_similar_call_run_alone_once_with_its_audit_entry(own_stack: IsolatedStack) -> None:
    # Its own stack: it checks the tool's trust and fatigue figures, which count every call of the tool.
    stack = own_stack
    order = new_order(stack.db_path, 300000)
    _grant_first(stack, "sa-1", order)
    [grant] = _grants(stack)
    assert grant["grant_id"] == "g-sa-1-a0" and grant["granted_by"] == GRANTOR and grant["state"] == "live"
    assert grant["same"] == {"order_id": order} and grant["at_most"] == {"amount_usd": "800.00"}

    covered = stack.ingress.wait_invocation(_act(stack, "sa-2", order, "650.00")).json()
    assert covered["outcome"] == "granted" and covered["grant_id"] == "g-sa-1-a0"
    assert covered["approved_by"] == [GRANTOR] and covered["decision_source"] == "grant"
    assert refunds_for(stack.db_path, "sa-2") == [("sa-2/0", order, 65000)]
    assert approval_emails(stack.outbox_dir, "sa-2") == [], "nobody was asked"
    entry = wait_until(lambda: _audit(stack, "sa-2-a0", "granted"), 20, "the granted call's audit entry")
    assert entry["actor"] == GRANTOR and entry["details"]["grant_id"] == "g-sa-1-a0"
    assert entry["details"]["granted_by"] == GRANTOR
    created = wait_until(lambda: _audit(stack, "sa-1-a0", "grant_created"), 20, "the grant's own audit entry")
    assert created["actor"] == GRANTOR and created["details"]["grant_id"] == "g-sa-1-a0"
    [grant] = _grants(stack)
    assert grant["uses"] == "1/2" and grant["used_by"] == ["sa-2/0"]

    # A call just above the bound is asked as usual, and its email says which bound it missed.
    above = _act(stack, "sa-3", order, "800.01", customer="c-2")
    [mail] = wait_for_email(stack.outbox_dir, "sa-3")
    assert "Not covered by your standing approval: amount_usd = 800.01 is above 800.00" in mail.text
    assert submit(mail.link, "reject", reason="enough for this order").status_code == 200
    assert stack.ingress.wait_invocation(above).json()["outcome"] == "rejected"
    # Another order: the `same` bound.
    other = new_order(stack.db_path, 300000)
    _act(stack, "sa-4", other, "600.00", customer="c-3")
    [mail] = wait_for_email(stack.outbox_dir, "sa-4")
    assert f"order_id is {other}, not {order}" in mail.text
    [grant] = _grants(stack)
    assert grant["uses"] == "1/2", "calls outside the bounds use nothing"

    # The trust figures count grant uses apart from people's decisions.
    figures = stack.ingress.call("ToolStats", "issue_refund", "stats", None).json()
    assert figures["grant_uses"] == 1 and figures["human_decisions"] == 2
    # ... and so do the fatigue figures (from the audit trail), per tool and per giver.
    stats = cli(stack.restate, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    [refunds] = [t for t in json.loads(stats.stdout) if t["tool"] == "issue_refund"]
    assert refunds["grant_uses"] == 1 and refunds["fatigue"]["grant_uses"] == 1
    assert refunds["fatigue"]["decisions"] == 2, "a grant's use is not a person's decision"


def test_fatigue_counts_grant_uses_apart_from_decisions() -> None:
    entries = [
        {"approval_id": "r-a0", "kind": "requested", "at": 1.0, "details": {"tool": "issue_refund"}},
        {
            "approval_id": "r-a0",
            "entry_id": "decided/r1/s0",
            "kind": "decided",
            "at": 2.0,
            "actor": GRANTOR,
            "details": {"verdict": "approve", "source": "human"},
        },
        {
            "approval_id": "r-a1",
            "entry_id": "granted/1",
            "kind": "granted",
            "at": 3.0,
            "actor": GRANTOR,
            "details": {"tool": "issue_refund", "grant_id": "g-r-a0"},
        },
        {
            "approval_id": "r-a2",
            "entry_id": "granted/2",
            "kind": "granted",
            "at": 4.0,
            "actor": "lead@example.com",
            "details": {"tool": "email_customer", "grant_id": "g-x-a0"},
        },
    ]
    found = fatigue(entries, reading_seconds=5, streak_warning=3)
    tools = {row.name: (row.decisions, row.grant_uses) for row in found.tools}
    assert tools == {"issue_refund": (1, 1), "email_customer": (0, 1)}
    people = {row.name: (row.decisions, row.grant_uses) for row in found.approvers}
    assert people == {GRANTOR: (1, 1), "lead@example.com": (0, 1)}


def test_the_use_limit_holds_under_concurrent_calls(stack: IsolatedStack) -> None:
    who = "sc@example.com"
    order = new_order(stack.db_path, 900000)
    _grant_first(stack, "sc-0", order, requester=who)
    runs = [f"sc-{n}" for n in range(1, 6)]
    with ThreadPoolExecutor(len(runs)) as pool:
        invocations = list(pool.map(lambda r: _act(stack, r, order, "550.00", f"k-{r}", who), runs))

    def ended(run: str, invocation: str) -> str | None:
        """How one call ended: its outcome once it returned, or "asked" once its approval email went
        out (an asked call waits for a person, so it never returns here)."""
        if approval_emails(stack.outbox_dir, run):
            return "asked"
        with contextlib.suppress(TimeoutError):
            return str(stack.ingress.wait_invocation(invocation, timeout=0.5).json()["outcome"])
        return None

    outcomes = {
        run: wait_until(lambda: ended(run, invocation), 30, f"{run} to be granted or asked")  # noqa: B023
        for run, invocation in zip(runs, invocations, strict=True)
    }
    granted = [run for run, outcome in outcomes.items() if outcome == "granted"]
    assert len(granted) == 2 and sorted(outcomes.values()).count("asked") == 3, outcomes
    asked = [r for r in runs if r not in granted]
    for run in asked:
        [mail] = wait_for_email(stack.outbox_dir, run)
        assert "was used 2 of 2 times" in mail.text
    [grant] = _grants(stack, who)
    assert grant["uses"] == "2/2" and sorted(grant["used_by"]) == sorted(f"{r}/0" for r in granted)
    assert grant["state"] == "used up"


def test_an_expired_grant_covers_nothing(stack: IsolatedStack) -> None:
    who = "se@example.com"
    order = new_order(stack.db_path, 300000)
    _grant_first(stack, "se-1", order, seconds="2", requester=who)
    [grant] = _grants(stack, who)
    wait_until(lambda: time.time() > grant["expires_at"] + 0.5 or None, 10, "the grant's expiry")
    _act(stack, "se-2", order, "600.00", requester=who)
    [mail] = wait_for_email(stack.outbox_dir, "se-2")
    assert "standing approval g-se-1-a0 expired" in mail.text
    assert _grants(stack, who)[0]["state"] == "expired" and _grants(stack, who)[0]["uses"] == "0/2"


def test_a_revoked_grant_covers_nothing(stack: IsolatedStack) -> None:
    who = "sr@example.com"
    order = new_order(stack.db_path, 300000)
    _grant_first(stack, "sr-1", order, requester=who)
    done = cli(stack.restate, "grants", "revoke", "g-sr-1-a0", "--by", "cli:ops", "--json")
    assert done.returncode == 0, done.stderr
    assert '"revoked_by": "cli:ops"' in done.stdout
    _act(stack, "sr-2", order, "600.00", requester=who)
    [mail] = wait_for_email(stack.outbox_dir, "sr-2")
    assert "standing approval g-sr-1-a0 was revoked by cli:ops" in mail.text
    [grant] = _grants(stack, who)
    assert grant["state"] == "revoked" and grant["uses"] == "0/2"
    unknown = cli(stack.restate, "grants", "revoke", "g-nothing")
    assert unknown.returncode == 1 and "no standing approval 'g-nothing'" in unknown.stderr


def test_the_receipt_emails_link_revokes_the_grant_on_post_only(stack: IsolatedStack) -> None:
    who = "sl@example.com"
    order = new_order(stack.db_path, 300000)
    _grant_first(stack, "sl-1", order, requester=who)
    [receipt] = wait_for_email(stack.outbox_dir, "sl-1", kind="grant")
    assert receipt.message["To"] == GRANTOR and "Standing approval given: issue_refund" in receipt.message["Subject"]
    assert "at most 2 calls" in receipt.text and "g-sl-1-a0" in receipt.text
    [link] = re.findall(r"https?://\S+/grants/\S+", receipt.text)
    shown = open_page(link)
    assert (
        shown.status_code == 200
        and "Live: issue_refund" in shown.text
        and "Revoke this standing approval" in shown.text
    )
    assert _grants(stack, who)[0]["state"] == "live", "opening the link (GET) changes nothing"
    # A POST from elsewhere (no CSRF value, another origin) revokes nothing.
    forged = httpx.post(link, data={"revoke": "yes"}, headers={"Origin": "https://evil.example"}, timeout=30)
    assert forged.status_code == 403 and _grants(stack, who)[0]["state"] == "live"
    revoked = submit_form(link, {"revoke": "yes"})
    assert revoked.status_code == 200 and "Revoked: issue_refund" in revoked.text
    [grant] = _grants(stack, who)
    assert grant["state"] == "revoked" and grant["revoked_by"] == GRANTOR
    _act(stack, "sl-2", order, "600.00", requester=who)
    [mail] = wait_for_email(stack.outbox_dir, "sl-2")
    assert f"standing approval g-sl-1-a0 was revoked by {GRANTOR}" in mail.text
    tampered = link[:-3] + ("AAA" if not link.endswith("AAA") else "BBB")
    assert open_page(tampered).status_code == 403


def test_the_approvers_inbox_page_lists_the_live_grant_and_revokes_it(own_stack: IsolatedStack) -> None:
    # Its own stack: the approver's inbox page lists every grant they gave, from any test.
    stack = own_stack
    order = new_order(stack.db_path, 300000)
    _grant_first(stack, "si-1", order)
    [request] = wait_for_email(stack.outbox_dir, "si-1")
    [inbox_link] = re.findall(r"https?://\S+/inbox/[^\s>]+", request.text)

    def listed() -> str | None:
        text = open_page(inbox_link).text
        return text if "Standing approvals you gave" in text else None

    inbox = wait_until(listed, 20, "the grant on the approver's inbox page")
    assert f"issue_refund for alice@example.com (order_id = {order}; amount_usd ≤ 800.00): used 0 of 2" in inbox
    [revoke_link] = re.findall(r'href="([^"]+/grants/[^"]+)"', inbox)
    assert submit_form(revoke_link.replace("&amp;", "&"), {"revoke": "yes"}).status_code == 200
    assert _grants(stack)[0]["state"] == "revoked"
    assert "Standing approvals you gave" not in open_page(inbox_link).text, "a revoked grant is no longer listed"


def test_a_forged_grant_field_is_refused_and_grants_nothing(stack: IsolatedStack) -> None:
    who = "sf@example.com"
    order = new_order(stack.db_path, 300000)
    _act(stack, "sf-1", order, "800.00", requester=who)
    [mail] = wait_for_email(stack.outbox_dir, "sf-1")
    csrf = form_csrf(mail.link)
    for forged, said in (
        ("99999999", "A standing approval lasts from 1 second to 1 day"),
        ("soon", "whole number of seconds"),
        ("-5", "A standing approval lasts"),
    ):
        refused = submit(mail.link, "approve", csrf=csrf, grant=forged)
        assert refused.status_code == 400 and said in refused.text and "Nothing was decided" in refused.text
    refused = submit(mail.link, "reject", reason="no", csrf=csrf, grant="3600")
    assert refused.status_code == 400 and "goes with an approval" in refused.text
    assert stack.ingress.call("Approval", "sf-1-a0", "status", None).json()["pending"], "still pending"
    assert _grants(stack, who) == []

    # A tool whose policy offers no grant (a quorum tool): the page shows none, a forged field is refused.
    new_order(stack.db_path, 100, customer_id="c_23")
    args = {"customer_id": "c_23", "reason": "asked to be forgotten"}
    ask = {"run_id": "sf-2", "tool": "delete_customer", "args": args, "index": 0, "requester": who}
    stack.ingress.send("RefundDesk", "c-9", "act", ask)
    [mail, _] = wait_for_email(stack.outbox_dir, "sf-2", count=2)
    assert 'name="grant"' not in open_page(mail.link).text
    refused = submit(mail.link, "approve", confirm="c_23", grant="3600")
    assert refused.status_code == 400 and "offers no standing approval" in refused.text
    assert stack.ingress.call("Approval", "sf-2-a0", "status", None).json()["pending"], "still pending"
    assert _grants(stack, who) == []


def test_a_grant_given_with_a_reviewed_edit_is_carried_through_the_review(stack: IsolatedStack) -> None:
    """An edit of a long text is shown as a diff for review first: the grant picked on the page is
    carried through the review's own form, and given only when that form decides."""
    who = "sv@example.com"
    args = {"customer_id": "c_17", "subject": "Sorry", "body": "We are sorry.\nIt was late."}
    ask = {"run_id": "sv-1", "tool": "email_customer", "args": args, "index": 0, "requester": who}
    invocation = stack.ingress.send("RefundDesk", "c-17", "act", ask)
    [mail] = wait_for_email(stack.outbox_dir, "sv-1")
    review = submit(mail.link, "approve", edits={"body": "We are sorry.\nIt was very late."}, grant="1800")
    assert review.status_code == 200 and 'name="grant" value="1800"' in review.text
    assert _grants(stack, who) == [], "nothing is decided before the review's own form"
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', review.text))
    parts = urlsplit(mail.link)
    headers = {"Origin": f"{parts.scheme}://{parts.netloc}"}
    decided = httpx.post(mail.link, data={**fields, "verdict": "approve"}, headers=headers, timeout=30)
    assert decided.status_code == 200, decided.text[-400:]
    assert stack.ingress.wait_invocation(invocation).json()["outcome"] == "approved_with_edits"
    [grant] = _grants(stack, who)
    assert grant["grant_id"] == "g-sv-1-a0" and grant["same"] == {"customer_id": "c_17"}
    assert grant["expires_at"] - grant["granted_at"] == 1800


def test_kill9_between_a_grants_use_and_the_effect_uses_it_once(
    isolated_stack: StackFactory, policy_file: Path
) -> None:
    stack = isolated_stack(app_env=_env(policy_file, COUNTERSIGN_FAULT="crash-after-grant-use"))
    order = new_order(stack.db_path, 300000)
    _grant_first(stack, "sk-1", order)
    invocation = _act(stack, "sk-2", order, "550.00")
    wait_until(lambda: not stack.app.alive(), 30, "the fault to kill the handler")
    assert refunds_for(stack.db_path, "sk-2") == []
    stack.app.env.pop("COUNTERSIGN_FAULT")
    stack.app.restart()
    record = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert record["outcome"] == "granted"
    assert refunds_for(stack.db_path, "sk-2") == [("sk-2/0", order, 55000)]
    [grant] = _grants(stack)
    assert grant["uses"] == "1/2" and grant["used_by"] == ["sk-2/0"], "the use was counted once"


def test_webhooks_hear_a_grant_given_used_and_revoked(isolated_stack: StackFactory, policy_file: Path) -> None:
    with running() as receiver:
        stack = isolated_stack(app_env=_env(policy_file, COUNTERSIGN_WEBHOOKS=config("default", receiver)))
        order = new_order(stack.db_path, 300000)
        _grant_first(stack, "sw-1", order)
        assert stack.ingress.wait_invocation(_act(stack, "sw-2", order, "600.00")).json()["outcome"] == "granted"
        assert cli(stack.restate, "grants", "revoke", "g-sw-1-a0", "--by", "cli:ops").returncode == 0

        def grant_events() -> list[Delivery] | None:
            found = [e for e in receiver.unique() if e.type.startswith("grant.")]
            return found if len(found) >= 2 else None

        created, revoked = sorted(wait_until(grant_events, 30, "the grant's events"), key=lambda e: e.type)
        assert created.type == "grant.created" and created.data["grant_id"] == "g-sw-1-a0"
        assert created.data["granted_by"] == GRANTOR and created.data["at_most"] == {"amount_usd": "800.00"}
        assert revoked.type == "grant.revoked" and revoked.data["revoked_by"] == "cli:ops"
        used = wait_until(
            lambda: (
                [e for e in receiver.unique() if e.type == "action.executed" and e.data["run_id"] == "sw-2"] or None
            ),
            30,
            "the granted call's action.executed",
        )
        assert used[0].data["grant_id"] == "g-sw-1-a0" and used[0].data["autonomous"] is False
        assert receiver.rejected == []


def test_an_agent_runs_call_is_covered_through_the_same_gate(stack: IsolatedStack) -> None:
    """AgentRun routes its model's calls through the same path: the grant an approver gave in one
    run covers a similar call in the next, and a call above the bound is asked."""
    who = "sg@example.com"
    order = new_order(stack.db_path, 300000)

    def task(*amounts: str) -> dict[str, Any]:
        calls = [{"tool": "issue_refund", "args": refund(order, a)} for a in amounts]
        return {"goal": "refunds", "requester": who, "script": calls}

    stack.ingress.start_run("sg-1", task("800.00"))
    [mail] = wait_for_email(stack.outbox_dir, "sg-1")
    assert submit(mail.link, "approve", grant="3600").status_code == 200
    assert stack.ingress.wait_output("sg-1").json()["actions"][0]["outcome"] == "approved"
    stack.ingress.start_run("sg-2", task("700.00", "900.00"))
    [mail] = wait_for_email(stack.outbox_dir, "sg-2")
    assert "amount_usd = 900.00 is above 800.00" in mail.text
    assert submit(mail.link, "approve").status_code == 200
    first, second = stack.ingress.wait_output("sg-2").json()["actions"]
    assert first["outcome"] == "granted" and first["grant_id"] == "g-sg-1-a0" and first["approved_by"] == [GRANTOR]
    assert second["outcome"] == "approved"
    assert refunds_for(stack.db_path, "sg-2") == [("sg-2/0", order, 70000), ("sg-2/1", order, 90000)]
    entry = wait_until(lambda: _audit(stack, "sg-2-a0", "granted"), 20, "the granted call's audit entry")
    assert entry["details"]["grant_id"] == "g-sg-1-a0"
    [grant] = _grants(stack, who)
    assert grant["used_by"] == ["sg-2/0"]


def test_request_approval_reports_a_covered_call_as_granted(stack: IsolatedStack) -> None:
    who = "sq@example.com"
    order = new_order(stack.db_path, 300000)
    _grant_first(stack, "sq-1", order, requester=who)
    ask = {"run_id": "sq-2", "tool": "issue_refund", "args": refund(order, "800.00"), "requester": who}
    checked = stack.ingress.send("RefundCheck", None, "ask", ask)
    outcome = stack.ingress.wait_invocation(checked).json()
    assert outcome["verdict"] == "granted" and outcome["approved_by"] == [GRANTOR]
    assert outcome["args"]["amount_usd"] == "800.00" and outcome["decision_source"] == "grant"
    assert refunds_for(stack.db_path, "sq-2") == [], "request_approval runs nothing itself"


def test_the_page_without_a_grant_gives_none(stack: IsolatedStack) -> None:
    who = "sn@example.com"
    order = new_order(stack.db_path, 300000)
    first = _act(stack, "sn-1", order, "800.00", requester=who)
    [mail] = wait_for_email(stack.outbox_dir, "sn-1")
    assert submit(mail.link, "approve").status_code == 200
    assert stack.ingress.wait_invocation(first).json()["outcome"] == "approved"
    _act(stack, "sn-2", order, "600.00", requester=who)
    [mail] = wait_for_email(stack.outbox_dir, "sn-2")
    assert "standing approval" not in mail.text
    assert _grants(stack, who) == []


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"quorum": 2, "approvers": ["a@example.com", "b@example.com"]}, "grants are for single-approver tools"),
        ({"grants": {"max_seconds": 10, "max_uses": 1}}, "grants.max_seconds: Input should be greater than or equal"),
        ({"grants": {"max_seconds": 60, "max_uses": 1, "same": ["a"], "at_most": ["a"]}}, "not both"),
        ({"grants": {"max_seconds": 60, "max_uses": 1, "forever": True}}, "grants.forever: Extra inputs"),
    ],
)
def test_a_bad_grants_table_is_refused_naming_the_field(table: dict[str, Any], said: str) -> None:
    base = ToolPolicy(gated=True, approvers=("a@example.com",), grants=GrantPolicy(max_seconds=60, max_uses=1))
    with pytest.raises(PolicyError, match=r"^policy\.toml \[tools\.x\]: ") as refused:
        merge(base, table, source="policy.toml [tools.x]")
    assert said in str(refused.value)


def test_the_offer_is_never_made_for_high_stakes_quorum_or_stopped_calls() -> None:
    grants = GrantPolicy(max_seconds=3600, max_uses=3, same=("order_id",), at_most=("amount_usd",))
    policy = ToolPolicy(gated=True, approvers=("a@example.com",), grants=grants)
    args = {"order_id": 7, "amount_usd": "612.40"}

    def offered(**verdict: Any) -> GrantOffer | None:
        made = PolicyVerdict(gated=True, rule="r", policy=verdict.pop("policy", policy), **verdict)
        return offer("issue_refund", made, args, requester="Alice@example.com", tenant="acme")

    made = offered()
    assert made is not None and made.scope_value == "alice@example.com" and made.at_most == {"amount_usd": "612.40"}
    assert made.words.startswith(
        "Calls of issue_refund asked for alice@example.com with order_id = 7, amount_usd ≤ 612.40"
    )
    assert offered(high_stakes=True) is None
    assert offered(stopped_because=[{"kind": "confidence", "text": "low"}]) is None
    assert offered(policy=policy.model_copy(update={"grants": None})) is None
    tenant = offered(policy=policy.model_copy(update={"grants": grants.model_copy(update={"scope": "tenant"})}))
    assert tenant is not None and "anyone in tenant acme" in tenant.words
    assert (
        offer(
            "issue_refund",
            PolicyVerdict(gated=True, rule="r", policy=policy),
            {"order_id": 7},
            requester="a@b.c",
            tenant="t",
        )
        is None
    )
