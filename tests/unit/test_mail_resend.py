"""The Resend backend and the send step against the local fake Resend API, through the real `resend` SDK:
idempotency, how each provider answer is sorted (retry later / final), and what reaches Restate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import resend
from fakes.resend_server import FakeResend, Fault
from restate import TerminalError
from restate.exceptions import RetryableError
from support.injection import (
    BIDI,
    FORGED_LINES,
    INVISIBLE,
    anchors,
    hidden_characters,
    our_lines_only,
    value_lines_outside_blocks,
)
from support.records import approval_record

from countersign.mail import deliver as deliver_module
from countersign.mail.approval_email import approval_request
from countersign.mail.deliver import deliver
from countersign.mail.message import MailDeferred, MailRejected, OutgoingEmail
from countersign.mail.resend_backend import ResendMailer, retry_after
from countersign.settings import Settings

SENDER = "Countersign <approvals@countersign.example>"


@pytest.fixture()
def fake() -> Iterator[FakeResend]:
    with FakeResend.running() as server:
        yield server


def message(key: str = "approval-request/r-a0/r1/s0", **changes: object) -> OutgoingEmail:
    base = OutgoingEmail(
        kind="request",
        to=["finance@example.com"],
        subject="Approval needed: Refund $612.40 to order 1042",
        text="text part",
        html="<p>html part</p>",
        idempotency_key=key,
        sent_at=1000.0,
        tags={"run_id": "r", "approval_id": "r-a0", "kind": "request"},
    )
    return base.model_copy(update=changes)


def mailer(fake: FakeResend, timeout: float = 2.0) -> ResendMailer:
    return ResendMailer("re_test_key", SENDER, api_url=fake.url, timeout=timeout)


def sdk_params(subject: str = "s") -> resend.Emails.SendParams:
    return {"from": SENDER, "to": ["a@example.com"], "subject": subject, "text": "t"}


def test_the_fake_keeps_resends_idempotency_rules_through_the_sdk(fake: FakeResend) -> None:
    resend.api_key, resend.api_url = "re_test_key", fake.url
    first = resend.Emails.send(sdk_params(), {"idempotency_key": "k1"})
    again = resend.Emails.send(sdk_params(), {"idempotency_key": "k1"})
    assert first["id"] == again["id"]
    with pytest.raises(resend.exceptions.ResendError) as changed:
        resend.Emails.send(sdk_params("other"), {"idempotency_key": "k1"})
    assert changed.value.code == 409 and changed.value.error_type == "invalid_idempotent_request"
    other = resend.Emails.send(sdk_params(), {"idempotency_key": "k2"})
    assert other["id"] != first["id"]

    batch = [sdk_params("b1"), sdk_params("b2")]
    sent = resend.Batch.send(batch, {"idempotency_key": "batch-1"})
    assert len(sent["data"]) == 2
    assert resend.Batch.send(batch, {"idempotency_key": "batch-1"})["data"] == sent["data"]
    with pytest.raises(resend.exceptions.ResendError) as batch_changed:
        resend.Batch.send([sdk_params("b1")], {"idempotency_key": "batch-1"})
    assert batch_changed.value.code == 409
    assert [a.params["subject"] for a in fake.accepted] == ["s", "s", "b1", "b2"]
    assert len(fake.requests) == 7


def test_the_fake_validates_like_resend(fake: FakeResend) -> None:
    resend.api_key, resend.api_url = "re_test_key", fake.url
    with pytest.raises(resend.exceptions.ResendError) as bad:
        resend.Emails.send({**sdk_params(), "to": ["not-an-address"]})
    assert bad.value.code == 422 and bad.value.error_type == "validation_error"
    resend.api_key = ""
    with pytest.raises(resend.exceptions.ResendError) as keyless:
        resend.Emails.send(sdk_params())
    assert keyless.value.code == 401
    assert fake.accepted == []


def test_one_send_carries_the_key_the_tags_and_records_the_provider_id(fake: FakeResend) -> None:
    receipt = mailer(fake).send(message())
    [accepted] = fake.accepted
    assert receipt.message_id == accepted.id and receipt.backend == "resend" and receipt.kind == "request"
    assert accepted.idempotency_key == "approval-request/r-a0/r1/s0"
    assert accepted.tags == {"approval_id": "r-a0", "kind": "request", "run_id": "r"}
    assert accepted.params["from"] == SENDER and accepted.to == ["finance@example.com"]
    assert accepted.params["html"] == "<p>html part</p>" and accepted.params["text"] == "text part"


@pytest.mark.parametrize(
    ("fault", "expected", "hint"),
    [
        (Fault("rate_limit", retry_after="7"), MailDeferred, 7.0),
        (Fault("server_error"), MailDeferred, None),
        (Fault("bad_gateway"), MailDeferred, None),
        (Fault("drop"), MailDeferred, None),
        (
            Fault("reject", status=422, name="validation_error", message="Invalid `to`: x@example.com"),
            MailRejected,
            None,
        ),
        (Fault("reject", status=403, name="validation_error", message="domain is not verified"), MailRejected, None),
        (Fault("reject", status=401, name="missing_api_key", message="Missing API key"), MailRejected, None),
    ],
    ids=["429", "500", "502-html", "dropped", "422", "403", "401"],
)
def test_each_provider_answer_is_sorted(
    fake: FakeResend, fault: Fault, expected: type[Exception], hint: float | None
) -> None:
    fake.fail_next(fault)
    with pytest.raises(expected) as caught:
        mailer(fake).send(message())
    assert "example.com" not in str(caught.value), "no address in an error message"
    if isinstance(caught.value, MailDeferred):
        assert caught.value.retry_after == hint
    assert fake.accepted == []
    assert mailer(fake).send(message()).message_id == fake.accepted[0].id, "the next try goes through"


def test_a_lost_answer_is_retried_under_the_same_key_and_sends_once(fake: FakeResend) -> None:
    fake.fail_next(Fault("drop", accept=True))
    with pytest.raises(MailDeferred, match="no answer"):
        mailer(fake).send(message())
    assert len(fake.accepted) == 1, "the provider did take it"
    receipt = mailer(fake).send(message())
    assert receipt.message_id == fake.accepted[0].id and len(fake.accepted) == 1


def test_a_slow_provider_times_out_then_answers_with_the_same_id(fake: FakeResend) -> None:
    fake.fail_next(Fault("slow", seconds=2.0, accept=True))
    started = time.monotonic()
    with pytest.raises(MailDeferred, match="no answer"):
        mailer(fake, timeout=0.5).send(message())
    assert time.monotonic() - started < 1.5, "the client timeout bounds the wait"
    with pytest.raises(MailDeferred, match="still in progress") as busy:
        mailer(fake, timeout=0.5).send(message())
    assert busy.value.retry_after == 1.0
    [first] = fake.accepted

    def settled() -> str | None:
        try:
            return mailer(fake).send(message()).message_id
        except MailDeferred:
            return None

    deadline = time.monotonic() + 10
    while (sent := settled()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sent == first.id and len(fake.accepted) == 1


def test_a_changed_message_under_a_used_key_is_final_and_says_why(fake: FakeResend) -> None:
    mailer(fake).send(message())
    with pytest.raises(MailRejected, match="already used for a different message"):
        mailer(fake).send(message(text="re-rendered differently"))
    assert len(fake.accepted) == 1


def test_retry_after_accepts_seconds_and_dates_and_stays_bounded() -> None:
    assert retry_after({"Retry-After": "3"}) == 3.0
    assert retry_after({"retry-after": "0"}) == 0.5
    assert retry_after({"retry-after": "86400"}) == 3600.0
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 20 <= (retry_after({"retry-after": soon}) or 0) <= 31
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


@pytest.fixture()
def resend_settings(fake: FakeResend, monkeypatch: pytest.MonkeyPatch) -> Settings:
    settings = Settings(
        approvals_signing_keys="k1:" + "s" * 40,  # type: ignore[arg-type]
        resend_api_key="re_test_key",
        resend_api_url=fake.url,
        resend_from=SENDER,
        countersign_env="test",
    )
    monkeypatch.setattr(deliver_module, "get_settings", lambda: settings)
    return settings


def test_the_step_body_maps_provider_answers_onto_restate(fake: FakeResend, resend_settings: Settings) -> None:
    fake.fail_next(Fault("rate_limit", retry_after="2"))
    with pytest.raises(RetryableError) as limited:
        deliver(lambda _: message())
    assert limited.value.retry_after == timedelta(seconds=2) and limited.value.status_code == 429

    fake.fail_next(Fault("server_error"))
    with pytest.raises(MailDeferred):
        deliver(lambda _: message())

    fake.fail_next(Fault("reject"))
    with pytest.raises(TerminalError) as refused:
        deliver(lambda _: message())
    assert refused.value.status_code == 422 and "email not sent" in refused.value.message
    assert "validation_error" in refused.value.message

    receipt = deliver(lambda _: message())
    assert receipt.message_id == fake.accepted[0].id and len(fake.accepted) == 1


def test_agent_text_cannot_forge_lines_links_or_reading_order_in_the_resend_payload(fake: FakeResend) -> None:
    settings = Settings(
        approvals_signing_keys="k1:" + "s" * 40,  # type: ignore[arg-type]
        approvals_public_url="https://approve.example.org",
    )
    forged = "\n".join(["damaged in transit", *FORGED_LINES, f"refund {BIDI}{INVISIBLE}"])
    record = approval_record(
        args={"order_id": 1042, "amount_usd": "1200.00", "reason": forged},
        summary="Refund $1200.00 to order 1042",
        why=forged,
        digest="ab12cd34ef56" + "0" * 52,
    )
    mail = approval_request(record, 0, forged, settings)
    mailer(fake).send(mail)
    [accepted] = fake.accepted
    text, html = accepted.params["text"], accepted.params["html"]
    assert isinstance(text, str) and isinstance(html, str), "one text part and one HTML part"
    approve = f"{mail.log_links[0]}?intent=approve"
    for shown in (text, html):
        assert "Refund $1200.00 to order 1042" in shown and "1200.00" in shown and approve in shown
        assert hidden_characters(shown) == [] and "[U+202E]00.21$ dnufer[U+202C]" in shown
    assert anchors(html)[0] == approve and len(anchors(html)) == 3
    our_lines_only(text, "ab12cd34ef56", approve)
    assert value_lines_outside_blocks(text, forged, ("    ", "      | ")) == []
    assert "    reason:\n      | damaged in transit\n      | Fingerprint: 000000000000\n" in text
