"""The approval pages under attack: mail scanners, cross-site posts, hostile form input.

Every check ends by asking Restate itself (`sys_promise`) whether any decision promise was
completed, and then shows that the real approver can still decide (so "nothing happened" is not
just a broken link).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from support.approver import ApprovalEmail, form_csrf, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, RestateServer, wait_until

from countersign.approval import confirm
from countersign.tools import DEMO_TOOLS
from countersign.web.views import SECURITY_HEADERS

# hypercorn closes a connection whose request body a refusal never read, and a client that reuses
# it races that close ("Server disconnected"); browsers retry, these tests use fresh connections.
FRESH_CONNECTIONS = httpx.Limits(max_keepalive_connections=0)

SCANNERS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/120.0 Safari/537.36",
    "Microsoft Office/16.0 (Microsoft Outlook; Safe Links)",
    "Mozilla/5.0 (compatible; proofpoint-url-defense)",
    "Mimecast URL Protect",
    "Barracuda Sentinel (EE)",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "python-requests/2.32",
    "",
]


def refund_task(order: int, amount: str, requester: str = "alice@example.com") -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": requester,
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "damaged"}}],
    }


def completed_decisions(restate: RestateServer, run_id: str) -> list[dict[str, Any]]:
    rows = restate.sql(
        "select key, completed from sys_promise where service_name = 'AgentRun' "
        f"and service_key = '{run_id}' and key like 'decision:%'"
    )
    return [row for row in rows if row["completed"]]


def assert_nothing_decided(restate: RestateServer, ingress: Ingress, run_id: str) -> None:
    assert completed_decisions(restate, run_id) == []
    [pending] = ingress.status(run_id)["pending"]
    assert pending["approvals"] == 0


def assert_hardened(response: httpx.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, f"{name} on {response.request.method} {response.status_code}"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["cache-control"] == "no-store"
    assert "Traceback" not in response.text and 'File "' not in response.text


@pytest.fixture()
def pending(app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str) -> ApprovalEmail:
    """A run waiting for finance's approval of a $1,500.00 (high-stakes) refund."""
    ingress.start_run(run_id, refund_task(new_order(demo_db, 200000), "1500.00"))
    [mail] = wait_for_email(outbox_dir, run_id)
    return mail


def test_scanners_and_prefetchers_never_decide(
    pending: ApprovalEmail, app_server: AppServer, ingress: Ingress, restate_server: RestateServer, run_id: str
) -> None:
    link = pending.link
    urls = [link, f"{link}?intent=approve", f"{link}?intent=reject", f"{link}?verdict=approve&csrf=x"]
    with httpx.Client(timeout=30, limits=FRESH_CONNECTIONS) as client:
        for agent in SCANNERS:
            headers = {"User-Agent": agent, "Accept": "text/html"}
            for url in urls:
                for _ in range(3):
                    page = client.get(url, headers=headers, follow_redirects=True)
                    assert page.status_code == 200 and "<script" not in page.text
                    assert client.head(url, headers=headers, follow_redirects=True).status_code == 200
            slashed = client.get(f"{link}/", headers=headers, follow_redirects=True)
            assert slashed.status_code == 404 and not slashed.history, "no redirects, no Host-built Location"
            for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
                other = client.request(method, link, headers=headers, data={"verdict": "approve"})
                assert other.status_code == 405
                assert_hardened(other)
            # A scanner that "clicks" the button submits no CSRF value and sends no same-origin Origin.
            clicked = client.post(link, headers=headers, data={"verdict": "approve"}, follow_redirects=True)
            assert clicked.status_code == 403
    assert_nothing_decided(restate_server, ingress, run_id)
    assert submit(link, "approve", confirm="1500.00").status_code == 200
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"


def test_cross_site_and_csrf_failures_decide_nothing(
    pending: ApprovalEmail, app_server: AppServer, ingress: Ingress, restate_server: RestateServer, run_id: str
) -> None:
    link, origin = pending.link, app_server.url
    csrf = form_csrf(link)
    other_csrf = csrf[:-2] + ("AA" if not csrf.endswith("AA") else "BB")
    good = {"csrf": csrf, "verdict": "approve", "confirm": "1500.00"}
    refusals: list[tuple[str, dict[str, str], dict[str, str] | bytes, int]] = [
        ("no origin", {}, good, 403),
        ("foreign origin", {"Origin": "https://evil.example"}, good, 403),
        ("other port", {"Origin": origin.rsplit(":", 1)[0] + ":1"}, good, 403),
        ("other scheme", {"Origin": origin.replace("http://", "https://")}, good, 403),
        ("origin with path", {"Origin": origin + "/approvals"}, good, 403),
        ("null origin alone", {"Origin": "null"}, good, 403),
        ("null origin, cross-site", {"Origin": "null", "Sec-Fetch-Site": "cross-site"}, good, 403),
        ("same origin, cross-site fetch", {"Origin": origin, "Sec-Fetch-Site": "cross-site"}, good, 403),
        ("same origin, same-site fetch", {"Origin": origin, "Sec-Fetch-Site": "same-site"}, good, 403),
        ("no csrf", {"Origin": origin}, {**good, "csrf": ""}, 403),
        ("forged csrf", {"Origin": origin}, {**good, "csrf": other_csrf}, 403),
        ("json body", {"Origin": origin, "Content-Type": "application/json"}, b'{"verdict":"approve"}', 400),
        ("oversized body", {"Origin": origin}, {**good, "reason": "x" * 70_000}, 400),
        ("no confirmation", {"Origin": origin}, {**good, "confirm": ""}, 400),
        ("wrong confirmation", {"Origin": origin}, {**good, "confirm": "1500.01"}, 400),
        ("no verdict", {"Origin": origin}, {"csrf": csrf}, 400),
        ("reject without reason", {"Origin": origin}, {"csrf": csrf, "verdict": "reject", "reason": "  "}, 400),
    ]
    with httpx.Client(timeout=30, limits=FRESH_CONNECTIONS) as client:
        for what, headers, body, status in refusals:
            if isinstance(body, bytes):
                reply = client.post(link, headers=headers, content=body)
            else:
                reply = client.post(link, headers=headers, data=body)
            assert reply.status_code == status, what
            assert_hardened(reply)
            assert csrf not in reply.text and link.rsplit("/", 1)[1] not in reply.text, what
        multipart = client.post(link, headers={"Origin": origin}, data=good, files={"f": ("a.txt", b"x")})
        assert multipart.status_code == 400
    assert_nothing_decided(restate_server, ingress, run_id)
    # What Chromium sends with Referrer-Policy no-referrer: Origin null plus Sec-Fetch-Site same-origin.
    browser = httpx.post(link, data=good, headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"}, timeout=30)
    assert browser.status_code == 200
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"


def test_high_stakes_page_asks_to_type_the_amount(
    pending: ApprovalEmail, app_server: AppServer, ingress: Ingress, demo_db: Path, run_id: str
) -> None:
    page = open_page(pending.link)
    assert 'name="confirm"' in page.text and "<code>1500.00</code>" in page.text
    assert "formnovalidate" in page.text, "rejecting needs no typed confirmation"
    typed = submit(pending.link, "approve", confirm="1,500")
    assert typed.status_code == 200, "a number is compared as a number"
    result = ingress.wait_output(run_id).json()
    assert result["actions"][0]["outcome"] == "approved" and len(refunds_for(demo_db, run_id)) == 1


def test_every_page_and_error_carries_the_hardening_headers(
    pending: ApprovalEmail, app_server: AppServer, ingress: Ingress, run_id: str
) -> None:
    link, base = pending.link, app_server.url
    token = link.rsplit("/", 1)[1]
    tampered = link[:-2] + ("AA" if not link.endswith("AA") else "BB")
    with httpx.Client(timeout=30, limits=FRESH_CONNECTIONS) as client:
        responses = {
            "page": client.get(link),
            "head": client.head(link),
            "malformed link": client.get(f"{base}/approvals/not-a-token"),
            "tampered link": client.get(tampered),
            "refused post": client.post(link, data={"verdict": "approve"}),
            "unknown path": client.get(f"{base}/admin"),
            "unknown path with token": client.get(f"{base}/approve?t={token}"),
            "wrong method": client.put(link),
            "healthz": client.get(f"{base}/healthz"),
        }
        assert submit(link, "reject", "not today").status_code == 200
        responses["decided"] = client.get(link)
        responses["already decided"] = submit(link, "approve", csrf=form_csrf_of(responses["page"]))
    expected = {
        "page": 200,
        "head": 200,
        "malformed link": 400,
        "tampered link": 403,
        "refused post": 403,
        "unknown path": 404,
        "unknown path with token": 404,
        "wrong method": 405,
        "healthz": 200,
        "decided": 200,
        "already decided": 409,
    }
    assert {k: r.status_code for k, r in responses.items()} == expected
    for what, response in responses.items():
        assert_hardened(response)
        if what not in ("head", "healthz"):
            assert '<div class="card">' in response.text, f"{what}: the same page layout for every answer"
            assert token not in response.text, f"{what} echoes the token"
    assert responses["wrong method"].headers.get("allow")
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "rejected"


def form_csrf_of(page: httpx.Response) -> str:
    marker = 'name="csrf" value="'
    start = page.text.index(marker) + len(marker)
    return page.text[start : page.text.index('"', start)]


@pytest.fixture()
def garbage_ingress() -> Iterator[str]:
    """A stand-in for a Restate ingress that answers every call with 200 and a body that is not JSON:
    a real restate-server cannot be made to do that, and it is what drives a page into a 500."""

    class Garbage(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b"<html>proxy error at 10.0.0.7, contact admin@example.com</html>"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_an_unexpected_error_is_the_uniform_500_page(garbage_ingress: str, tmp_path: Path) -> None:
    env = {
        "COUNTERSIGN_ENV": "test",
        "COUNTERSIGN_TOOLS": DEMO_TOOLS,
        "RESTATE_INGRESS_URL": garbage_ingress,
        "APPROVALS_SIGNING_KEYS": "k1:" + "s" * 32,
        "APPROVALS_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DEMO_DB": str(tmp_path / "b.db"),
    }
    app = AppServer.start(env=env, log_path=tmp_path / "app.log")
    token = "v1.k1.cnVuLTF-Mn4xfjF-MjAwMA." + "A" * 43
    try:
        reply = httpx.get(f"{app.url}/approvals/{token}", timeout=30)
    finally:
        app.stop()
    assert reply.status_code == 500
    assert "Something went wrong" in reply.text and "Nothing was decided" in reply.text
    for leak in ("ValidationError", "Traceback", "admin@example.com", "10.0.0.7", token):
        assert leak not in reply.text
    assert_hardened(reply)
    log = (tmp_path / "app.log").read_text()
    assert "unexpected error in a page handler: ValidationError" in log and token not in log


# --------------------------------------------------------------------------------------------------
# Fuzzing the live pages: any link text and any form input get a 4xx, never a 500, never a decision.

HTTP_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@HTTP_FUZZ
@given(text=st.text(min_size=1, max_size=300), method=st.sampled_from(["GET", "HEAD", "POST"]))
@example(text="0/", method="GET")  # once a 307 from Starlette's trailing-slash redirect
@example(text="v1.k1.cnVuLTF-Mn4xfjF-MjAwMA." + "A" * 43, method="POST")
def test_fuzzed_links_are_a_4xx(app_server: AppServer, text: str, method: str) -> None:
    reply = httpx.request(
        method,
        f"{app_server.url}/approvals/{quote(text, safe='')}",
        headers={"Origin": app_server.url},
        data={"verdict": "approve"} if method == "POST" else None,
        timeout=30,
    )
    assert 400 <= reply.status_code < 500, (text, reply.status_code)


form_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)


@pytest.fixture(scope="module")
def fuzz_target(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, restate_server: RestateServer
) -> Iterator[tuple[str, str]]:
    """One pending high-stakes run shared by every fuzz example (cancelled at the end)."""
    run_id = "fuzz-form-" + str(new_order(demo_db, 500000))
    ingress.start_run(run_id, refund_task(new_order(demo_db, 500000), "2500.00"))
    [mail] = wait_for_email(outbox_dir, run_id)
    yield run_id, mail.link
    assert_nothing_decided(restate_server, ingress, run_id)
    ingress.call("AgentRun", run_id, "cancel", {"reason": "fuzzing done"})


@HTTP_FUZZ
@given(
    verdict=st.one_of(st.sampled_from(["approve", "reject", "APPROVE", "", "approve\x00"]), form_text),
    reason=form_text,
    confirm_text=form_text,
    csrf_mode=st.sampled_from(["real", "random", "missing"]),
    csrf_random=st.text(max_size=60),
    extra=st.dictionaries(st.text(min_size=1, max_size=20), form_text, max_size=5),
    origin=st.sampled_from(["self", "null+same-origin", "none", "evil"]),
)
def test_fuzzed_forms_are_a_4xx_and_decide_nothing(
    fuzz_target: tuple[str, str],
    app_server: AppServer,
    verdict: str,
    reason: str,
    confirm_text: str,
    csrf_mode: str,
    csrf_random: str,
    extra: dict[str, str],
    origin: str,
) -> None:
    _, link = fuzz_target
    assume(not confirm.matches(confirm_text, "2500.00"))
    assume(not (verdict == "reject" and reason.strip()))  # a reason-giving rejection is a legitimate decision
    data = {**extra, "verdict": verdict, "reason": reason, "confirm": confirm_text}
    if csrf_mode == "real":
        data["csrf"] = form_csrf(link)
    elif csrf_mode == "random":
        data["csrf"] = csrf_random
    else:
        data.pop("csrf", None)
    headers = {
        "self": {"Origin": app_server.url},
        "null+same-origin": {"Origin": "null", "Sec-Fetch-Site": "same-origin"},
        "none": {},
        "evil": {"Origin": "https://evil.example"},
    }[origin]
    reply = httpx.post(link, data=data, headers=headers, timeout=30)
    assert 400 <= reply.status_code < 500, (reply.status_code, data, headers)


def test_a_client_that_disconnects_mid_body_is_no_error(
    pending: ApprovalEmail, app_server: AppServer, ingress: Ingress, restate_server: RestateServer, run_id: str
) -> None:
    """A browser closed (or a connection dropped) while the form was on its way: nothing to answer and
    nothing went wrong on our side, so one INFO line and no ERROR, no traceback in the app's log."""
    parts = urlsplit(pending.link)
    log_path = app_server.log_path
    start = log_path.stat().st_size
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nOrigin: {app_server.url}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\n"
    )
    for sent in ("", "csrf=abc&verdict=appr"):
        with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=30) as raw:
            raw.sendall(head.encode() + sent.encode())

    def logged() -> list[str] | None:
        lines = log_path.read_bytes()[start:].decode(errors="replace").splitlines()
        ended = [line for line in lines if "disconnected" in line or "ERROR" in line or "Traceback" in line]
        return lines if len(ended) >= 2 else None

    lines = wait_until(logged, 20, "the app to log both disconnects")
    assert not [line for line in lines if "ERROR" in line or "Traceback" in line or 'File "' in line], lines
    assert sum("a client disconnected before its form arrived" in line for line in lines) == 2, lines
    assert_nothing_decided(restate_server, ingress, run_id)
    assert submit(pending.link, "approve", confirm="1500.00").status_code == 200
