"""`POST /webhooks/resend`: signatures verified by Resend's own verifier (valid / tampered / stale /
wrong secret), events recorded once in `EmailDelivery` however often they are re-delivered, and a
bounced approval email recorded as a failure of that approver (and, once `AgentRun.delivery_failed`
exists, resolving the approval as `undeliverable` when nobody else can decide)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fakes.resend_server import Accepted, FakeResend, email_event, signed
from fakes.resend_stack import resend_stack
from starlette.applications import Starlette
from starlette.testclient import TestClient
from support.approver import LINK, open_page
from support.business import new_order, refunds_for
from support.journal import everything_restate_holds
from support.processes import IsolatedStack, free_port, wait_until
from support.records import approval_record

from countersign.approval.tally import slot_verdict
from countersign.contract import ApprovalRecord, Vote
from countersign.mail.intent import tag_value
from countersign.objects.delivery import DeliveryFailure
from countersign.security.codec import ENVELOPE, JournalCipher
from countersign.settings import Settings, parse_journal_keys
from countersign.web.webhooks import ResendWebhooks

SECRET = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtMTIzNDU2Nzg5MA=="


def our_email(run_id: str = "run-1", kind: str = "request", slot: str | None = "0") -> Accepted:
    tags = [
        {"name": "kind", "value": kind},
        {"name": "run_id", "value": tag_value(run_id)},
        {"name": "approval_id", "value": tag_value(f"{run_id}-a0")},
        {"name": "round", "value": "1"},
    ]
    if slot is not None:
        tags.append({"name": "slot", "value": slot})
    params = {"from": "c@example.com", "to": ["finance@example.com"], "subject": "Approval needed", "tags": tags}
    return Accepted(id="em_1", idempotency_key="k", params=params, at=time.time())


# --------------------------------------------------------------------------------------------------
# The route alone (no Restate behind it): everything that must be refused before anything is recorded


@pytest.fixture()
def route() -> Iterator[TestClient]:
    settings = Settings(resend_webhook_secret=SECRET, restate_ingress_url=f"http://127.0.0.1:{free_port()}")
    with TestClient(Starlette(routes=ResendWebhooks(settings).routes())) as client:
        yield client


def post(client: TestClient, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    response = client.post("/webhooks/resend", content=body, headers=headers)
    return response.status_code, response.json()


def test_a_tampered_body_is_refused(route: TestClient) -> None:
    delivery = signed(email_event("email.bounced", our_email()), SECRET)
    tampered = delivery.body.replace(b"email.bounced", b"email.delivered")
    status, body = post(route, tampered, delivery.headers)
    assert status == 401 and "no matching signature" in body["error"]


def test_a_stale_or_future_timestamp_is_refused(route: TestClient) -> None:
    # Clear of the 300 s tolerance: the header holds whole seconds, so a skew of 301 from a truncated
    # clock could arrive as 300.x and, a moment later, be inside it.
    for skew in (-310, 310):
        delivery = signed(email_event("email.delivered", our_email()), SECRET, timestamp=int(time.time()) + skew)
        status, body = post(route, delivery.body, delivery.headers)
        assert status == 401 and "timestamp outside tolerance" in body["error"]


def test_another_secret_or_missing_headers_are_refused(route: TestClient) -> None:
    other = signed(email_event("email.delivered", our_email()), "whsec_" + "b3RoZXItb3RoZXItb3RoZXI=")
    assert post(route, other.body, other.headers)[0] == 401
    delivery = signed(email_event("email.delivered", our_email()), SECRET)
    for missing in ("svix-id", "svix-timestamp", "svix-signature"):
        headers = {k: v for k, v in delivery.headers.items() if k != missing}
        status, body = post(route, delivery.body, headers)
        assert status == 400 and "headers are required" in body["error"]
    assert post(route, b"\xff\xfe" * 10, signed(b"\xff\xfe" * 10, SECRET).headers)[0] == 400
    assert post(route, b"x" * (300 * 1024), delivery.headers)[0] == 413


def test_events_that_are_not_about_our_emails_are_acknowledged_and_ignored(route: TestClient) -> None:
    foreign = json.dumps({"type": "email.delivered", "data": {"email_id": "x", "tags": {"campaign": "spring"}}})
    for body in (foreign.encode(), b'{"type": "contact.created", "data": {}}', b"[1, 2]"):
        status, answer = post(route, body, signed(body, SECRET).headers)
        assert (status, answer) == (200, {"status": "ignored"})


def test_a_valid_event_that_restate_cannot_take_now_asks_resend_to_retry(route: TestClient) -> None:
    delivery = signed(email_event("email.delivered", our_email()), SECRET)
    status, body = post(route, delivery.body, delivery.headers)
    assert status == 503 and "retry later" in body["error"]


def test_without_a_secret_the_route_refuses_everything() -> None:
    settings = Settings(resend_webhook_secret=None)
    with TestClient(Starlette(routes=ResendWebhooks(settings).routes())) as client:
        delivery = signed(email_event("email.delivered", our_email()), SECRET)
        status, body = post(client, delivery.body, delivery.headers)
    assert status == 503 and "RESEND_WEBHOOK_SECRET" in body["error"]


# --------------------------------------------------------------------------------------------------
# What the run should do about a failure (the pure decision `AgentRun.delivery_failed` uses)


def pending_record(**changes: object) -> ApprovalRecord:
    first: dict[str, object] = {"approval_id": "run-1-a0", "index": 0, "args": {}, "nonces": ["n"]}
    return approval_record(**{**first, "requested_at": 1.0, "round_started_at": 1.0, "deadline": 2.0, **changes})


def failure(slots: list[int], round_: int = 1) -> DeliveryFailure:
    return DeliveryFailure(
        run_id="run-1",
        approval_id="run-1-a0",
        round=round_,
        slot=slots[-1],
        kind="request",
        event="email.bounced",
        email_id="em",
        detail="Permanent General: mailbox does not exist",
        failed_slots=slots,
    )


def test_a_failure_ends_only_that_approvers_slot_of_the_current_round() -> None:
    verdict = slot_verdict(pending_record(), failure([1]), now=5.0)
    assert verdict is not None and (verdict.kind, verdict.slot, verdict.round, verdict.at) == (
        "undeliverable",
        1,
        1,
        5.0,
    )
    assert verdict.source == "system" and verdict.digest == "d" * 64
    assert (
        verdict.reason
        == "the approval email could not be delivered (bounced: Permanent General: mailbox does not exist)"
    )
    assert slot_verdict(pending_record(round=2, nonces=["n", "m"]), failure([1]), now=5.0) is None, "an older round"
    assert slot_verdict(pending_record(state="approved"), failure([1]), now=5.0) is None
    assert slot_verdict(pending_record(active_slots=[0]), failure([1]), now=5.0) is None, "no longer asked"
    voted = pending_record(votes=[Vote(slot=1, round=1, kind="reject", by="b@example.com", at=3.0)])
    assert slot_verdict(voted, failure([1]), now=5.0) is None, "already decided"


# --------------------------------------------------------------------------------------------------
# Through the real stack: restate-server, the app, EmailDelivery


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeResend]:
    with FakeResend.running() as server:
        yield server


@pytest.fixture(scope="module")
def stack(fake: FakeResend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsolatedStack]:
    root = tmp_path_factory.mktemp("webhook-stack")
    policy = root / "policy.toml"
    policy.write_text("[tools.issue_refund]\nescalate_to = []\n")  # nobody to escalate a bounce to
    with resend_stack(root, fake, {"APPROVALS_POLICY_FILE": str(policy)}) as started:
        yield started


def refund(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "900.00", "reason": "late"}}],
    }


def approval_email(stack: IsolatedStack, fake: FakeResend, run_id: str) -> Accepted:
    stack.ingress.start_run(run_id, refund(new_order(stack.db_path, 100000)))
    key = f"approval-request/{run_id}-a0/r1/s0"
    return wait_until(lambda: next(iter(fake.accepted_for(key)), None), 30, f"the approval email of {run_id}")


def delivery_log(stack: IsolatedStack, approval_id: str) -> dict[str, Any]:
    response = stack.ingress.call("EmailDelivery", approval_id, "log", None)
    response.raise_for_status()
    return dict(response.json())


def test_a_delivered_event_is_recorded_once_however_often_it_arrives(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    mail = approval_email(stack, fake, run_id)
    url = f"{stack.app.url}/webhooks/resend"
    delivery = fake.webhook("email.delivered", mail)
    for _ in range(3):
        answer = fake.post_webhook(url, delivery)
        assert (answer.status_code, answer.json()) == (200, {"status": "accepted"})
    resent = fake.webhook("email.delivered", mail, svix_id=delivery.headers["svix-id"])
    assert resent.headers["svix-timestamp"] >= delivery.headers["svix-timestamp"]
    assert fake.post_webhook(url, resent).status_code == 200

    def recorded() -> list[dict[str, Any]] | None:
        events = delivery_log(stack, f"{run_id}-a0")["events"]
        return events or None

    [event] = wait_until(recorded, 30, "the event to be recorded")
    assert event["type"] == "email.delivered" and event["email_id"] == mail.id
    assert (event["kind"], event["run_id"], event["round"], event["slot"]) == ("request", run_id, 1, 0)
    records = stack.restate.sql(
        "select id from sys_invocation where target_service_name = 'EmailDelivery'"
        f" and target_service_key = '{run_id}-a0' and target_handler_name = 'record'"
    )
    assert len(records) == 1, "the ingress idempotency key folded the re-deliveries into one invocation"
    assert delivery_log(stack, f"{run_id}-a0")["failures"] == []

    # On a connection of its own: the ingress may close one after refusing a request whose body it did
    # not read, and the next request sent on it saw "Server disconnected" (as in test_security_ingress).
    direct = stack.ingress.call("EmailDelivery", f"{run_id}-a0", "record", event, {"connection": "close"})
    assert direct.status_code == 400, "record is ingress_private: only ResendWebhook.receive reaches it"
    raw = {
        "svix_id": delivery.headers["svix-id"],
        "svix_timestamp": delivery.headers["svix-timestamp"],
        "svix_signature": delivery.headers["svix-signature"],
        "payload": delivery.body.decode(),
    }
    forged = stack.ingress.call(
        "ResendWebhook", None, "receive", {**raw, "payload": raw["payload"].replace("delivered", "bounced")}
    )
    assert forged.status_code == 401 and "no matching signature" in forged.text, "the handler re-verifies the signature"
    again = stack.ingress.call("ResendWebhook", None, "receive", raw)
    assert again.json() == {"forwarded": 1}, "the genuine delivery, straight to the public handler"
    assert len(delivery_log(stack, f"{run_id}-a0")["events"]) == 1, "recorded once however it arrives"
    assert (
        len(
            stack.restate.sql(
                "select id from sys_invocation where target_service_name = 'EmailDelivery'"
                f" and target_service_key = '{run_id}-a0' and target_handler_name = 'record'"
            )
        )
        == 1
    )
    assert stack.ingress.status(run_id)["pending"], "a delivery changes nothing about the decision"
    stack.ingress.call("AgentRun", run_id, "cancel", {"reason": "test cleanup"})


def test_a_bounced_approval_email_is_recorded_as_that_approvers_failure(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    mail = approval_email(stack, fake, run_id)
    answer = fake.post_webhook(f"{stack.app.url}/webhooks/resend", fake.webhook("email.bounced", mail))
    assert answer.status_code == 200

    def failures() -> list[dict[str, Any]] | None:
        return delivery_log(stack, f"{run_id}-a0")["failures"] or None

    [failed] = wait_until(failures, 30, "the bounce to be recorded")
    assert (failed["round"], failed["slot"], failed["failed_slots"]) == (1, 0, [0])
    assert failed["event"] == "email.bounced" and failed["email_id"] == mail.id
    assert (
        failed["detail"] == "Permanent General: The recipient's mail server rejected <address>: mailbox does not exist."
    )


def test_the_events_it_hands_to_restate_are_sealed_in_the_journal(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    """The route calls `EmailDelivery` through a client with the journal codec: the server journals a
    call's input as it arrives, so a client without it would leave the event there in plaintext."""
    mail = approval_email(stack, fake, run_id)
    bounce = fake.webhook("email.bounced", mail)
    assert fake.post_webhook(f"{stack.app.url}/webhooks/resend", bounce).status_code == 200
    wait_until(lambda: delivery_log(stack, f"{run_id}-a0")["failures"] or None, 30, "the bounce to be recorded")

    held = everything_restate_holds(stack.restate, f"{run_id}-a0")
    # The svix id as a value ('"msg_…"'); it is also part of idempotency keys, which Restate keeps as keys.
    for plaintext in (mail.id, "mailbox does not exist", '"' + bounce.headers["svix-id"] + '"'):
        assert plaintext not in held, f"{plaintext!r} is journaled in plaintext"
    cipher = JournalCipher(parse_journal_keys(stack.env["COUNTERSIGN_JOURNAL_KEYS"]))
    states = stack.restate.sql(
        f"select value_utf8 from state where service_name = 'EmailDelivery' and service_key = '{run_id}-a0'"
    )
    assert states and all(row["value_utf8"].encode().startswith(ENVELOPE) for row in states)
    opened = " ".join(cipher.open(row["value_utf8"].encode()).decode() for row in states)
    assert mail.id in opened and "mailbox does not exist" in opened, "the search looks where the event is"


def test_a_bounce_with_nobody_left_to_ask_resolves_the_approval_as_undeliverable(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    mail = approval_email(stack, fake, run_id)
    assert fake.post_webhook(f"{stack.app.url}/webhooks/resend", fake.webhook("email.bounced", mail)).status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=30).json()
    action = result["actions"][0]
    assert action["outcome"] == "undeliverable" and "bounced" in action["reason"]
    assert refunds_for(stack.db_path, run_id) == []
    page = open_page(str(LINK.findall(mail.params["text"])[0]))
    assert page.status_code == 200 and "No approval email could be delivered" in page.text
