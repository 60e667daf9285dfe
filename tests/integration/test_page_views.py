"""An approval page's GET is one `Approval` invocation, and its view is audited once a minute; a
single approval's POST is one invocation too, whether it decides or refuses.

Against the real restate-server and handlers. Completed shared-handler invocations keep no row in
`sys_invocation` (no retention), so the calls are counted where Restate counts them: its ingress
metric of requests per service (`restate_ingress_requests_total`, calls and sends alike). The
`page_viewed` entries of the audit trail say which of them recorded a view: a GET's one call does,
a HEAD's does not, nor does a view with a link that is not authentic, nor one before the approval's
workflow has saved its record (the page's setup wait).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
from support.approver import ApprovalEmail, deployment_keys, wait_for_email
from support.business import new_order
from support.operator import audit_entries
from support.processes import AppServer, Ingress, RestateServer, wait_until
from support.runs import refund_step, refund_task, task

from countersign.contract import ApprovalRecord, RunStatus, Submitted
from countersign.security import links

_APPROVAL_REQUESTS = re.compile(r'^restate_ingress_requests_total\{[^}]*rpc_service="Approval"[^}]*\} (\S+)$', re.M)
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_MINUTE = re.compile(r"/m(\d+)$")


def approval_requests(restate: RestateServer) -> int:
    """How many ingress requests (calls and sends) to the `Approval` workflows Restate has served."""
    metrics = httpx.get(f"http://{restate.env['RESTATE_BIND_ADDRESS']}/metrics", timeout=10, trust_env=False)
    metrics.raise_for_status()
    return sum(int(float(n)) for n in _APPROVAL_REQUESTS.findall(metrics.text))


def views(ingress: Ingress, approval: str) -> list[dict[str, Any]]:
    return [e for e in audit_entries(ingress, approval) if e["kind"] == "page_viewed"]


def saved_record(ingress: Ingress, approval: str) -> ApprovalRecord:
    """The approval's record once its workflow has saved it (so a page needs no setup wait)."""

    def saved() -> ApprovalRecord | None:
        answer = RunStatus.model_validate_json(ingress.call("Approval", approval, "status", None).content)
        return next((r for r in answer.approvals if r.approval_id == approval), None)

    return wait_until(saved, 20, f"the record of {approval}")


def waiting_approval(ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str) -> tuple[ApprovalEmail, str]:
    ingress.start_run(run_id, refund_task(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    approval = f"{run_id}-a0"
    saved_record(ingress, approval)
    return mail, approval


def test_a_get_is_one_approval_call_and_repeated_views_fold_into_one_entry_a_minute(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    mail, approval = waiting_approval(ingress, outbox_dir, demo_db, run_id)
    with httpx.Client(timeout=30, trust_env=False) as client:
        before = approval_requests(restate_server)
        head = client.head(mail.link, headers={"User-Agent": "probe/head"})
        assert head.status_code == 200
        assert approval_requests(restate_server) == before + 1, "a HEAD reads the status, once"

        first_minute = int(time.time() // 60)
        pages = []
        for n in range(3):
            counted = approval_requests(restate_server)
            pages.append(client.get(mail.link, headers={"User-Agent": "reader/1"}))
            assert pages[-1].status_code == 200 and "Approve" in pages[-1].text
            assert approval_requests(restate_server) == counted + 1, f"GET {n + 1}: one Approval call, not two"

        # The decision, after the views, is the barrier: its `decided` entry follows every view
        # entry those calls sent into the same trail (one sender, one receiver, in order).
        match = _CSRF.search(pages[-1].text)
        assert match
        decided = client.post(mail.link, data={"csrf": match.group(1), "verdict": "approve"}, headers=_origin(mail))
        assert decided.status_code == 200, decided.text
        last_minute = int(time.time() // 60)

    trail = wait_until(
        lambda: (t := audit_entries(ingress, approval)) and any(e["kind"] == "decided" for e in t) and t,
        20,
        "the decision in the trail",
    )
    seen = [e for e in trail if e["kind"] == "page_viewed"]
    assert seen, "the GETs are audited"
    assert all(e["details"]["user_agent"] == "reader/1" for e in seen), "a HEAD is no view"
    assert seen[0]["actor"] == "finance@example.com"
    minutes = [int(m.group(1)) for e in seen if (m := _MINUTE.search(e["entry_id"]))]
    assert len(minutes) == len(set(minutes)) == len(seen), "one entry per minute, however many views"
    assert set(minutes) <= set(range(first_minute, last_minute + 1)), minutes


def test_a_batch_page_reads_its_own_item_with_the_view_and_the_others_with_status(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    first, second = new_order(demo_db, 125000), new_order(demo_db, 125000)
    ingress.start_run(run_id, task(refund_step(first, "700.00", also=[refund_step(second, "800.00")])))
    [mail] = wait_for_email(outbox_dir, run_id, kind="batch")
    items = [f"{run_id}-a0", f"{run_id}-a1"]
    for item in items:
        saved_record(ingress, item)
    claims = links.parse(mail.link.rsplit("/", 1)[1])
    own = links.approval_id(claims.run_id, claims.index)
    [other] = [i for i in items if i != own]

    before = approval_requests(restate_server)
    page = httpx.get(mail.link, headers={"User-Agent": "reader/batch"}, timeout=30, trust_env=False)
    assert page.status_code == 200 and page.text.count('type="radio"') == 6
    assert approval_requests(restate_server) == before + 2, "its own item's view, the other item's status"
    [seen] = wait_until(lambda: views(ingress, own) or None, 20, "the view of the batch's own item")
    assert seen["details"]["user_agent"] == "reader/batch"
    ingress.call("AgentRun", run_id, "cancel", {"reason": "test cleanup"})
    done = wait_until(
        lambda: (t := audit_entries(ingress, other)) and any(e["kind"] == "outcome" for e in t) and t,
        20,
        "the other item's outcome in its trail",
    )
    assert not [e for e in done if e["kind"] == "page_viewed"], "only the item the link names records the view"


def test_a_link_that_is_not_authentic_records_no_view_and_the_page_says_not_valid(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    mail, approval = waiting_approval(ingress, outbox_dir, demo_db, run_id)
    record = saved_record(ingress, approval)
    forged = links.mint(record, 0, {"k1": b"not the deployment's key, 32 bytes"}, "k1")
    other = links.mint(record.model_copy(update={"index": 7}), 0, {"k1": b"x" * 32}, "k1")

    page = httpx.get(mail.link.replace(mail.link.rsplit("/", 1)[1], forged), headers={"User-Agent": "forger"})
    assert page.status_code == 403 and "Link not valid" in page.text, "today's page for a forged link"
    for token in (forged, other):
        answer = ingress.call("Approval", approval, "viewed", {"token": token, "client": "forger"})
        assert answer.status_code == 200, answer.text
        status = RunStatus.model_validate_json(answer.content)
        assert [r.approval_id for r in status.approvals] == [approval], "the status, as `status` answers it"

    # A real view afterwards is the barrier: once it is in the trail, so would any earlier one be.
    assert httpx.get(mail.link, headers={"User-Agent": "reader/2"}, timeout=30).status_code == 200
    seen = wait_until(lambda: views(ingress, approval) or None, 20, "the real view in the trail")
    assert [e["details"]["user_agent"] for e in seen] == ["reader/2"], seen
    ingress.call("AgentRun", run_id, "cancel", {"reason": "test cleanup"})


def test_the_setup_wait_records_nothing_and_says_try_again(
    app_server: AppServer, ingress: Ingress, run_id: str
) -> None:
    """A link of ours to an approval whose workflow has not saved its record: the page waits, then 503."""
    unsaved = _unsaved(run_id)
    token = links.mint(unsaved, 0, deployment_keys(app_server), "k1")
    for method in ("GET", "HEAD"):
        page = httpx.request(method, f"{app_server.url}/approvals/{token}", timeout=30)
        assert page.status_code == 503, (method, page.status_code)
    assert "still being set up" in httpx.get(f"{app_server.url}/approvals/{token}", timeout=30).text
    assert audit_entries(ingress, unsaved.approval_id) == []


def _origin(mail: ApprovalEmail) -> dict[str, str]:
    return {"Origin": "/".join(mail.link.split("/", 3)[:3])}


def test_a_single_approvals_post_is_one_approval_call_whether_it_decides_or_refuses(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    mail, approval = waiting_approval(ingress, outbox_dir, demo_db, run_id)
    record = saved_record(ingress, approval)
    keys = deployment_keys(app_server)
    forged = links.mint(record, 0, {"k1": b"not the deployment's key, 32 bytes"}, "k1")
    with httpx.Client(timeout=30, trust_env=False) as client:
        match = _CSRF.search(client.get(mail.link).text)
        assert match
        csrf = match.group(1)

        def post(data: dict[str, str], *, link: str = mail.link, origin: bool = True) -> tuple[httpx.Response, int]:
            before = approval_requests(restate_server)
            reply = client.post(
                link, data=data, headers=_origin(mail) if origin else {"Origin": "https://evil.example"}
            )
            return reply, approval_requests(restate_server) - before

        # The page's own checks come before any call.
        reply, calls = post({"csrf": "not-the-value", "verdict": "approve"})
        assert (reply.status_code, calls) == (403, 0), "a bad CSRF value makes no call"
        reply, calls = post({"csrf": csrf, "verdict": "approve"}, origin=False)
        assert (reply.status_code, calls) == (403, 0), "a cross-site POST makes no call"

        # Refusals: one call each, with the page they always had.
        refusals = [
            ({"csrf": csrf}, mail.link, 400, "Choose a verdict"),
            ({"csrf": csrf, "verdict": "reject", "reason": "  "}, mail.link, 400, "Reason required"),
            ({"csrf": csrf, "verdict": "approve", "reason": "x" * 2001}, mail.link, 400, "Reason too long"),
            (
                {"csrf": csrf, "verdict": "reject", "reason": "no", "edit.amount_usd": "1.00"},
                mail.link,
                400,
                "Edits go with an approval, not a rejection.",
            ),
            (
                {"csrf": links.csrf_token(forged, keys, "k1"), "verdict": "approve"},
                mail.link.replace(mail.link.rsplit("/", 1)[1], forged),
                403,
                "Link not valid",
            ),
        ]
        for data, link, status, text in refusals:
            reply, calls = post(data, link=link)
            assert (reply.status_code, calls) == (status, 1), (text, reply.status_code, calls)
            assert text in reply.text, reply.text

        # The decision: one call; the same form again is the same answer (one decision); another
        # form afterwards learns it came too late.
        decided, calls = post({"csrf": csrf, "verdict": "approve"})
        assert (decided.status_code, calls) == (200, 1), decided.text
        again, calls = post({"csrf": csrf, "verdict": "approve"})
        assert (again.status_code, calls) == (200, 1), again.text
        late, calls = post({"csrf": csrf, "verdict": "reject", "reason": "too late"})
        assert (late.status_code, calls) == (409, 1), late.text
        assert "finance@example.com" in late.text
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"


def test_a_post_before_the_record_is_saved_waits_for_it_and_says_try_again(
    app_server: AppServer, ingress: Ingress, run_id: str
) -> None:
    """An authentic link and form for an approval whose workflow has not saved its record: `submit`
    decides nothing, the page waits for the record with reads, then answers 503."""
    unsaved = _unsaved(run_id)
    keys = deployment_keys(app_server)
    token = links.mint(unsaved, 0, keys, "k1")
    reply = httpx.post(
        f"{app_server.url}/approvals/{token}",
        data={"csrf": links.csrf_token(token, keys, "k1"), "verdict": "approve"},
        headers={"Origin": app_server.url},
        timeout=30,
    )
    assert reply.status_code == 503 and "still being set up" in reply.text, reply.text
    assert audit_entries(ingress, unsaved.approval_id) == []


def test_a_forged_link_to_an_approval_not_saved_is_refused_at_once(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, run_id: str
) -> None:
    """A well-formed token that the deployment's keys did not seal, for an approval with no record:
    no setup wait (about 3 s per request, an amplification that needs no secret), but the page's 403
    after the one `Approval` call any link costs (the read, or for a POST `submit`), and no polling."""
    unsaved = _unsaved(run_id)
    keys = deployment_keys(app_server)
    forged = links.mint(unsaved, 0, {"k1": b"not the deployment's key, 32 bytes"}, "k1")
    url = f"{app_server.url}/approvals/{forged}"
    # A CSRF value that fits the forged link (made here with the deployment's key), so that the POST
    # reaches `submit` and only the link itself is left to refuse.
    form = {"csrf": links.csrf_token(forged, keys, "k1"), "verdict": "approve"}
    with httpx.Client(timeout=30, trust_env=False) as client:
        for method in ("GET", "HEAD", "POST"):
            before = approval_requests(restate_server)
            started = time.monotonic()
            if method == "POST":
                reply = client.post(url, data=form, headers={"Origin": app_server.url})
            else:
                reply = client.request(method, url)
            took = time.monotonic() - started
            calls = approval_requests(restate_server) - before
            assert (reply.status_code, calls) == (403, 1), (method, reply.status_code, calls)
            assert took < 1.0, (method, took)
            assert method == "HEAD" or "Link not valid" in reply.text, reply.text
    assert audit_entries(ingress, unsaved.approval_id) == []


def _unsaved(run_id: str) -> ApprovalRecord:
    return ApprovalRecord.model_validate(
        {
            "approval_id": f"{run_id}-a0",
            "run_id": run_id,
            "tenant": "default",
            "index": 0,
            "tool": "issue_refund",
            "args": {},
            "digest": "d" * 64,
            "summary": "",
            "why": "",
            "policy": "p",
            "requester": "alice@example.com",
            "approvers": ["finance@example.com"],
            "active_slots": [0],
            "nonces": ["n"],
            "requested_at": time.time(),
            "round_started_at": time.time(),
            "deadline": time.time() + 3600,
        }
    )


def test_a_submission_through_the_ingress_verifies_the_link_itself(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    """`Approval.submit` is reachable through the ingress without the page: a token that is not a
    link is a 4xx, and one that is not authentic for this approval decides nothing."""
    mail, approval = waiting_approval(ingress, outbox_dir, demo_db, run_id)
    record = saved_record(ingress, approval)
    not_a_link = {"token": "not-a-valid-token-at-all", "verdict": "approve"}
    malformed = ingress.call("Approval", approval, "submit", not_a_link)
    assert 400 <= malformed.status_code < 500, malformed.text
    forged = links.mint(record, 0, {"k1": b"not the deployment's key, 32 bytes"}, "k1")
    elsewhere = links.mint(record.model_copy(update={"index": 7}), 0, deployment_keys(app_server), "k1")
    for token in (forged, elsewhere):
        answer = ingress.call("Approval", approval, "submit", {"token": token, "verdict": "approve"})
        assert answer.status_code == 200, answer.text
        submitted = Submitted.model_validate_json(answer.content)
        assert submitted.receipt is None and submitted.refused is not None
        assert (submitted.refused.status, submitted.refused.title) == (403, "Link not valid")
    assert saved_record(ingress, approval).state == "pending" and not saved_record(ingress, approval).votes
    # The real link still decides (nothing above took the slot).
    real = ingress.call("Approval", approval, "submit", {"token": mail.link.rsplit("/", 1)[1], "verdict": "approve"})
    receipt = Submitted.model_validate_json(real.content).receipt
    assert receipt is not None and receipt.accepted and receipt.state == "approved", real.text
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"
