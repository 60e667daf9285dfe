"""The approver JSON API (`/api/v1/…`) against the real app and restate-server: an approval read by
its link token and decided with an edit and with a refused edit (the page's own checks, the page's
statuses, as `application/problem+json`), a high-stakes approval's typed confirmation, a batch link's
items read and decided one by one as its page decides them, a forged token and another approval's
CSRF value refused, a replaced or expired link (410) and an approval not saved yet (503) deciding
nothing, GET never deciding, the approver's inbox listed by its token, CORS off by default, and the
OpenAPI document kept in step with the routes. Questions through the API are in
tests/integration/test_ask_person.py."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import httpx
from support.approver import INBOX, deployment_keys, open_page, wait_for_email
from support.business import new_order, refunds_for
from support.operator import audit_entries
from support.processes import AppServer, Ingress, IsolatedStack, StackFactory, wait_until
from support.records import approval_record
from support.runs import lookup_then_refund_task, reassign, refund_step, refund_task, task, wait_pending

from countersign.contract import RunStatus
from countersign.security import links
from countersign.settings import Settings
from countersign.web.api import PREFIX, openapi_document, routes_of

PROBLEM = "application/problem+json"


def api_url(app: AppServer, link: str, suffix: str = "") -> str:
    token = link.rsplit("/approvals/", 1)[1]
    return f"{app.url}{PREFIX}/items/{token}{suffix}"


def decide(app: AppServer, link: str, body: dict[str, Any], origin: str | None = None) -> httpx.Response:
    headers = {"Origin": origin} if origin else {}
    return httpx.post(api_url(app, link, "/decision"), json=body, headers=headers, timeout=30)


def refused(response: httpx.Response, status: int, title: str | None = None) -> dict[str, Any]:
    """The problem details of a refusal, checked: its status, its media type and, if given, its title."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"] == PROBLEM, response.headers["content-type"]
    problem: dict[str, Any] = response.json()
    assert problem["status"] == status and problem["detail"], problem
    assert title is None or problem["title"] == title, problem
    return problem


def votes(ingress: Ingress, run_id: str) -> list[dict[str, Any]]:
    """Every vote on the run's approvals: none while nothing was decided."""
    return [v for a in ingress.status(run_id)["approvals"] for v in a["votes"]]


def test_an_approval_is_read_and_decided_with_an_edit_and_a_refused_edit_decides_nothing(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 125000)
    assert ingress.start_run(run_id, lookup_then_refund_task("700.00", order)).status_code == 202
    wait_pending(ingress, run_id)
    [mail] = wait_for_email(outbox_dir, run_id)
    item = httpx.get(api_url(app_server, mail.link), timeout=30)
    assert item.status_code == 200 and item.headers["content-type"] == "application/json"
    view = item.json()
    assert view["kind"] == "action" and view["state"] == "pending" and view["tool"] == "issue_refund"
    assert view["args"]["amount_usd"] == "700.00" and "amount_usd" in view["editable"]
    assert view["approver"] == "finance@example.com" and view["csrf"]
    for _ in range(2):  # a GET never decides, however often it is sent
        assert httpx.get(api_url(app_server, mail.link), timeout=30).json()["state"] == "pending"

    raised = decide(
        app_server, mail.link, {"verdict": "approve", "edits": {"amount_usd": "900.00"}, "csrf": view["csrf"]}
    )
    assert raised.status_code == 400 and raised.headers["content-type"] == PROBLEM
    problem = raised.json()
    assert problem["status"] == 400 and "may only be lowered" in problem["detail"] and problem["title"]
    assert wait_pending(ingress, run_id)["pending"], "a refused edit decides nothing"

    no_csrf = decide(app_server, mail.link, {"verdict": "approve", "csrf": "x" * 40})
    assert no_csrf.status_code == 403 and no_csrf.headers["content-type"] == PROBLEM
    elsewhere = decide(app_server, mail.link, {"verdict": "approve", "csrf": view["csrf"]}, "https://evil.example")
    assert elsewhere.status_code == 403 and "origin" in elsewhere.json()["detail"]
    assert "access-control-allow-origin" not in elsewhere.headers, "no CORS unless origins are configured"
    preflight = httpx.options(
        api_url(app_server, mail.link, "/decision"),
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        timeout=30,
    )
    assert "access-control-allow-origin" not in preflight.headers

    edited = decide(
        app_server, mail.link, {"verdict": "approve", "edits": {"amount_usd": "650.00"}, "csrf": view["csrf"]}
    )
    assert edited.status_code == 200, edited.text
    assert edited.json()["state"] == "approved_with_edits" and edited.json()["decided_by"] == "finance@example.com"
    result = ingress.wait_output(run_id).json()
    assert (
        result["actions"][1]["outcome"] == "approved_with_edits"
        and result["actions"][1]["args"]["amount_usd"] == "650.00"
    )
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/1", order, 65000)]
    late = decide(app_server, mail.link, {"verdict": "reject", "reason": "too late", "csrf": view["csrf"]})
    assert late.status_code == 409 and late.json()["decided_by"] == "finance@example.com"
    after = httpx.get(api_url(app_server, mail.link), timeout=30).json()
    assert after["state"] == "approved_with_edits" and after["csrf"] is None


def test_a_forged_token_and_another_approvals_csrf_are_refused(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    garbage = f"v1.k1.{'A' * 60}"
    response = httpx.get(f"{app_server.url}{PREFIX}/items/{garbage}", timeout=30)
    assert response.status_code in (400, 403) and response.headers["content-type"] == PROBLEM
    orders = [new_order(demo_db, 125000), new_order(demo_db, 125000)]
    runs = [f"{run_id}-a", f"{run_id}-b"]
    for run, order in zip(runs, orders, strict=True):
        assert ingress.start_run(run, lookup_then_refund_task("700.00", order)).status_code == 202
    mails = [wait_for_email(outbox_dir, run)[0] for run in runs]
    other_csrf = httpx.get(api_url(app_server, mails[1].link), timeout=30).json()["csrf"]
    refused(decide(app_server, mails[0].link, {"verdict": "approve", "csrf": other_csrf}), 403)
    assert wait_pending(ingress, runs[0])["pending"] and refunds_for(demo_db, runs[0]) == []

    # A forged token POSTed answers what the page's POST of it answers, and decides nothing: one
    # that is not a link at all, and one made for the waiting approval with a key not the deployment's,
    # sent with a CSRF value that fits it (made with the deployment's key), so that only the link is
    # left to refuse it, in `Approval.submit`.
    keys = deployment_keys(app_server)
    record = RunStatus.model_validate_json(ingress.call("Approval", f"{runs[0]}-a1", "status", None).content)
    forged = links.mint(record.approvals[0], 0, {"k1": b"not the deployment's key, 32 bytes"}, "k1")
    for token, status in ((garbage, None), (forged, 403)):
        csrf = links.csrf_token(token, keys, "k1")
        page = httpx.post(
            f"{app_server.url}/approvals/{token}",
            data={"csrf": csrf, "verdict": "approve"},
            headers={"Origin": app_server.url},
            timeout=30,
        )
        assert status is None or page.status_code == status, page.status_code
        api = httpx.post(f"{app_server.url}{PREFIX}/items/{token}/decision", json={"verdict": "approve", "csrf": csrf})
        refused(api, page.status_code, "Link not valid")
    assert votes(ingress, runs[0]) == [] and refunds_for(demo_db, runs[0]) == []
    # The inbox lists what waits for the approver, each with a fresh token the API reads.
    [inbox_token] = {m.group(1) for m in INBOX.finditer(mails[0].text)}
    inbox = httpx.get(f"{app_server.url}{PREFIX}/inbox/{inbox_token}", timeout=30)
    assert inbox.status_code == 200 and inbox.json()["approver"] == "finance@example.com"
    listed = {i["approval_id"]: i for i in inbox.json()["items"]}
    assert {f"{r}-a1" for r in runs} <= set(listed)
    fresh = httpx.get(f"{app_server.url}{PREFIX}/items/{listed[f'{runs[0]}-a1']['token']}", timeout=30)
    assert fresh.status_code == 200 and fresh.json()["approval_id"] == f"{runs[0]}-a1"
    bad_inbox = httpx.get(f"{app_server.url}{PREFIX}/inbox/{inbox_token[:-4]}AAAA", timeout=30)
    assert bad_inbox.status_code in (400, 403) and bad_inbox.headers["content-type"] == PROBLEM


def test_the_openapi_document_describes_exactly_the_routes(app_server: AppServer) -> None:
    document = openapi_document()
    described = {(path, method) for path, methods in document["paths"].items() for method in methods}
    assert described == set(routes_of(Settings())), "the OpenAPI document and the routes differ"
    served = httpx.get(f"{app_server.url}{PREFIX}/openapi.json", timeout=30)
    assert served.status_code == 200 and served.json() == document
    schemas = document["components"]["schemas"]
    for name in ("ItemView", "DecisionIn", "DecisionOut", "BatchDecisionIn", "BatchDecisionOut", "InboxOut", "Problem"):
        assert name in schemas
    # Every schema an operation names is in the document, and a decision takes either kind of body.
    refs = re.findall(r'"\$ref": "#/components/schemas/(\w+)"', json.dumps(document))
    assert refs and set(refs) <= set(schemas), set(refs) - set(schemas)
    decision = document["paths"][f"{PREFIX}/items/{{token}}/decision"]["post"]
    body = decision["requestBody"]["content"]["application/json"]["schema"]
    assert body == {
        "oneOf": [{"$ref": "#/components/schemas/DecisionIn"}, {"$ref": "#/components/schemas/BatchDecisionIn"}]
    }


def test_a_high_stakes_approval_needs_the_typed_value_through_the_api(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 300000)
    ingress.start_run(run_id, refund_task(order, "1500.00"))
    [mail] = wait_for_email(outbox_dir, run_id)
    view = httpx.get(api_url(app_server, mail.link), timeout=30).json()
    assert (view["confirm_field"], view["confirm_value"]) == ("amount_usd", "1500.00") and view["batch"] == []
    for confirmation in ({}, {"confirm": ""}, {"confirm": "1499.99"}, {"confirm": "c_17"}):
        wrong = decide(app_server, mail.link, {"verdict": "approve", "csrf": view["csrf"], **confirmation})
        assert "type the value shown" in refused(wrong, 400)["detail"], confirmation
    # A batch's body on a single approval's link: refused, as the page refuses a form it cannot read.
    batch_body = {"items": [{"index": 0, "verdict": "approve", "confirm": "1500"}], "csrf": view["csrf"]}
    refused(decide(app_server, mail.link, batch_body), 400, "Not a batch")
    assert votes(ingress, run_id) == [] and refunds_for(demo_db, run_id) == [], "nothing was decided"

    typed = decide(app_server, mail.link, {"verdict": "approve", "confirm": "$1,500.00", "csrf": view["csrf"]})
    assert typed.status_code == 200 and typed.json()["state"] == "approved", typed.text
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/0", order, 150000)]


def items(csrf: str, *chosen: dict[str, Any]) -> dict[str, Any]:
    """A batch decision's body: the items chosen, each `{"index", "verdict", "reason"?, "confirm"?}`."""
    return {"items": list(chosen), "csrf": csrf}


def test_a_batch_link_is_read_with_its_items_and_decided_item_by_item_as_its_page_decides(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    """Two gated refunds of one turn: one email and one batch link; the API shows both items and takes
    a verdict per item, with the batch page's rules (a reason to reject, the typed value of a
    high-stakes item, items left to decide later, a second decision too late)."""
    big, small = new_order(demo_db, 300000), new_order(demo_db, 300000)
    ingress.start_run(run_id, task(refund_step(big, "2000.00", also=[refund_step(small, "800.00")])))
    [mail] = wait_for_email(outbox_dir, run_id, kind="batch")
    view = httpx.get(api_url(app_server, mail.link), timeout=30).json()
    assert view["approver"] == "finance@example.com" and view["csrf"] and view["index"] == 0
    listed = [(i["index"], i["open"], i["args"]["amount_usd"], i["confirm_value"]) for i in view["batch"]]
    assert listed == [(0, True, "2000.00", "2000.00"), (1, True, "800.00", None)]
    csrf = view["csrf"]

    single = decide(app_server, mail.link, {"verdict": "approve", "csrf": csrf})
    assert "items" in refused(single, 400, "A batch")["detail"]
    no_reason = items(csrf, {"index": 1, "verdict": "approve"}, {"index": 0, "verdict": "reject"})
    refused(decide(app_server, mail.link, no_reason), 400, "Reason required")
    twice = items(csrf, {"index": 1, "verdict": "approve"}, {"index": 1, "verdict": "reject", "reason": "no"})
    assert "more than once" in refused(decide(app_server, mail.link, twice), 400)["detail"]
    refused(decide(app_server, mail.link, items(csrf, {"index": 7, "verdict": "approve"})), 400, "Nothing chosen")
    untyped = decide(app_server, mail.link, items(csrf, {"index": 0, "verdict": "approve"}))
    [outcome] = refused(untyped, 409, "Not decided")["items"]
    assert outcome["index"] == 0 and outcome["accepted"] is None and "type the value shown" in outcome["error"]
    assert votes(ingress, run_id) == [], "nothing was decided"

    typed = decide(
        app_server,
        mail.link,
        items(csrf, {"index": 0, "verdict": "approve", "confirm": "2000"}, {"index": 7, "verdict": "approve"}),
    )
    assert typed.status_code == 200, typed.text
    [first] = typed.json()["items"]
    assert (first["index"], first["accepted"], first["state"]) == (0, True, "approved") and typed.json()["ignored"] == [
        7
    ]
    assert first["decided_by"] == "finance@example.com"
    wait_until(lambda: len(ingress.status(run_id)["pending"]) == 1, 10, "the first item to be decided")
    assert refunds_for(demo_db, run_id) == [], "nothing runs before the whole turn is decided"
    again = httpx.get(api_url(app_server, mail.link), timeout=30).json()
    assert [(i["index"], i["open"]) for i in again["batch"]] == [(0, False), (1, True)] and again["csrf"]

    rejected = decide(app_server, mail.link, items(csrf, {"index": 1, "verdict": "reject", "reason": "one is enough"}))
    assert rejected.status_code == 200 and rejected.json()["items"][0]["state"] == "rejected", rejected.text
    late = decide(app_server, mail.link, items(csrf, {"index": 1, "verdict": "approve"}))
    [too_late] = refused(late, 409)["items"]
    assert (too_late["accepted"], too_late["state"]) == (False, "rejected")
    result = ingress.wait_output(run_id).json()
    assert [a["outcome"] for a in result["actions"]] == ["approved", "rejected"]
    assert result["actions"][1]["reason"] == "one is enough"
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/0", big, 200000)]
    done = httpx.get(api_url(app_server, mail.link), timeout=30).json()
    assert not any(i["open"] for i in done["batch"]) and done["csrf"] is None
    assert 'type="radio"' not in open_page(mail.link).text, "the batch page agrees: nothing left to decide"


def test_a_replaced_link_answers_410_to_a_read_and_what_the_page_answers_to_a_decision(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, run_id: str
) -> None:
    """Reassigning ops's part of a 2-of-2 deletion starts round 2: ops's link was handed on, and
    security's was replaced by a fresh one. A read of either answers 410, as the page does; a decision
    sent with either answers what the page's POST answers, 409 with how the link's round ended for
    that slot (a single approval's POST is decided by `decide`'s rules, which find the old round's
    decision point closed), and decides nothing; security's fresh link still decides. (A batch link's
    POST answers 410: see the expired batch link below.)"""
    ingress.start_run(run_id, task({"tool": "delete_customer", "args": {"customer_id": "c_41", "reason": "duplicate"}}))
    by_person = {m.message["To"]: m for m in wait_for_email(outbox_dir, run_id, count=2)}
    csrf = {to: httpx.get(api_url(app_server, m.link), timeout=30).json()["csrf"] for to, m in by_person.items()}
    reassign(ingress, run_id, f"{run_id}-a0", "carol@example.com", replacing="ops@example.com")
    first = {m.path for m in by_person.values()}
    fresh = {m.message["To"]: m for m in wait_for_email(outbox_dir, run_id, count=4) if m.path not in first}
    assert set(fresh) == {"carol@example.com", "security@example.com"}

    old_links = (
        ("ops@example.com", "Handed on", "reassigned"),
        ("security@example.com", "Link replaced", "escalated"),
    )
    for to, title, ended in old_links:
        link = by_person[to].link
        refused(httpx.get(api_url(app_server, link), timeout=30), 410, title)
        assert open_page(link).status_code == 410, "the page's status"
        body = {"verdict": "approve", "confirm": "c_41", "csrf": csrf[to]}
        page = httpx.post(link, data=body, headers={"Origin": app_server.url}, timeout=30)
        assert page.status_code == 409, (to, page.text[-300:])
        assert refused(decide(app_server, link, body), 409, "Already decided")["state"] == ended, to
    assert [v for v in votes(ingress, run_id) if v["kind"] in ("approve", "reject")] == [], "nothing was decided"

    link = fresh["security@example.com"].link
    view = httpx.get(api_url(app_server, link), timeout=30).json()
    approved = decide(app_server, link, {"verdict": "approve", "confirm": "c_41", "csrf": view["csrf"]})
    assert approved.status_code == 200 and approved.json()["decided_by"] == "security@example.com", approved.text
    wait_until(lambda: ingress.status(run_id)["pending"][0]["approvals"] == 1, 10, "the round-2 approval")
    ingress.call("AgentRun", run_id, "cancel", {"reason": "test done"})


def test_an_expired_batch_link_answers_410_on_read_and_decision_and_decides_nothing(
    isolated_stack: StackFactory, tmp_path: Path, run_id: str
) -> None:
    """A batch link past its expiry (the items' deadline): the batch page's 410 before anything else,
    through the API as on the page; a decision sent with it decides nothing."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[tools.issue_refund]\ndeadline_seconds = 3\nreminders_seconds = []\nescalate_to = []\n")
    stack: IsolatedStack = isolated_stack(app_env={"APPROVALS_POLICY_FILE": str(policy)})
    first, second = new_order(stack.db_path, 125000), new_order(stack.db_path, 125000)
    stack.ingress.start_run(run_id, task(refund_step(first, "700.00", also=[refund_step(second, "800.00")])))
    [mail] = wait_for_email(stack.outbox_dir, run_id, kind="batch")
    csrf = httpx.get(api_url(stack.app, mail.link), timeout=30).json()["csrf"]
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert [a["outcome"] for a in result["actions"]] == ["expired", "expired"]
    expires = math.ceil(stack.ingress.status(run_id)["approvals"][0]["deadline"])  # the link's own expiry
    wait_until(lambda: time.time() > expires, 10, "the batch link to expire")

    refused(httpx.get(api_url(stack.app, mail.link), timeout=30), 410, "Link expired")
    refused(decide(stack.app, mail.link, items(csrf, {"index": 0, "verdict": "approve"})), 410, "Link expired")
    assert open_page(mail.link).status_code == 410, "the page's status"
    assert votes(stack.ingress, run_id) == [] and refunds_for(stack.db_path, run_id) == []


def test_an_approval_not_saved_yet_answers_503_and_decides_nothing(
    app_server: AppServer, ingress: Ingress, run_id: str
) -> None:
    """An authentic link to an approval whose workflow has not saved its record (its email goes out
    just before): the API waits for the record as the page does (bounded, in the app), then answers
    503 "try again" to a read and to either kind of decision, recording nothing."""
    now = time.time()
    unsaved = approval_record(
        approval_id=f"{run_id}-a0",
        run_id=run_id,
        index=0,
        approvers=["finance@example.com"],
        active_slots=[0],
        requested_at=now,
        round_started_at=now,
        deadline=now + 3600,
    )
    keys = deployment_keys(app_server)
    token = links.mint(unsaved, 0, keys, "k1")
    csrf = links.csrf_token(token, keys, "k1")
    url = f"{app_server.url}{PREFIX}/items/{token}"
    assert "still being set up" in refused(httpx.get(url, timeout=30), 503)["detail"]
    for body in ({"verdict": "approve", "csrf": csrf}, items(csrf, {"index": 0, "verdict": "approve"})):
        assert "still being set up" in refused(httpx.post(f"{url}/decision", json=body, timeout=30), 503)["detail"]
    assert audit_entries(ingress, unsaved.approval_id) == []
