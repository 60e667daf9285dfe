"""The approver JSON API (`/api/v1/…`) against the real app and restate-server: an approval read by
its link token and decided with an edit and with a refused edit (the page's own checks, the page's
statuses, as `application/problem+json`), a forged token and another approval's CSRF value refused,
GET never deciding, the approver's inbox listed by its token, CORS off by default, and the OpenAPI
document kept in step with the routes. Questions through the API are in tests/integration/test_ask_person.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from support.approver import wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress
from support.runs import lookup_then_refund_task, wait_pending

from countersign.settings import Settings
from countersign.web.api import PREFIX, openapi_document, routes_of

INBOX = re.compile(r"https?://\S+/inbox/([A-Za-z0-9._~-]+)")
PROBLEM = "application/problem+json"


def api_url(app: AppServer, link: str, suffix: str = "") -> str:
    token = link.rsplit("/approvals/", 1)[1]
    return f"{app.url}{PREFIX}/items/{token}{suffix}"


def decide(app: AppServer, link: str, body: dict[str, Any], origin: str | None = None) -> httpx.Response:
    headers = {"Origin": origin} if origin else {}
    return httpx.post(api_url(app, link, "/decision"), json=body, headers=headers, timeout=30)


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
    forged = f"{app_server.url}{PREFIX}/items/v1.k1.{'A' * 60}"
    response = httpx.get(forged, timeout=30)
    assert response.status_code in (400, 403) and response.headers["content-type"] == PROBLEM
    orders = [new_order(demo_db, 125000), new_order(demo_db, 125000)]
    runs = [f"{run_id}-a", f"{run_id}-b"]
    for run, order in zip(runs, orders, strict=True):
        assert ingress.start_run(run, lookup_then_refund_task("700.00", order)).status_code == 202
    mails = [wait_for_email(outbox_dir, run)[0] for run in runs]
    other_csrf = httpx.get(api_url(app_server, mails[1].link), timeout=30).json()["csrf"]
    refused = decide(app_server, mails[0].link, {"verdict": "approve", "csrf": other_csrf})
    assert refused.status_code == 403
    assert wait_pending(ingress, runs[0])["pending"] and refunds_for(demo_db, runs[0]) == []
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
    for name in ("ItemView", "DecisionIn", "DecisionOut", "InboxOut", "Problem"):
        assert name in document["components"]["schemas"]
