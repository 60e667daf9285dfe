"""Unit tests: link tokens, policy conditions, action digests and the outbox's byte-identical files."""

from __future__ import annotations

import email
import email.policy
from pathlib import Path

import pytest
from pydantic import ValidationError
from support.records import approval_record

from countersign.approval.gate import action_digest
from countersign.contract import ApprovalRecord
from countersign.mail.message import OutgoingEmail
from countersign.mail.outbox import OutboxMailer
from countersign.security import links
from countersign.settings import Settings
from countersign.tools.policy import ToolPolicy, evaluate

KEYS = {"k1": b"a" * 32, "k0": b"b" * 32}


def record(**changes: object) -> ApprovalRecord:
    return approval_record(**changes)


def test_a_minted_token_checks_and_carries_no_personal_data() -> None:
    token = links.mint(record(), 1, KEYS, "k1")
    claims, state = links.check(token, record(), KEYS, now=1500)
    assert state == "valid" and claims.slot == 1 and claims.run_id == "run-1"
    assert "example.com" not in token and "d" * 12 not in token
    assert len(token) < 120


@pytest.mark.parametrize(
    "changed",
    [
        {"tenant": "other"},
        {"approval_id": "run-1-a3"},
        {"digest": "e" * 64},
        {"nonces": ["n2"]},
        {"approvers": ["a@example.com", "mallory@example.com"]},
        {"deadline": 2500.0},
    ],
)
def test_the_tag_binds_every_record_field(changed: dict[str, object]) -> None:
    token = links.mint(record(), 1, KEYS, "k1")
    with pytest.raises(links.LinkInvalid):
        links.check(token, record(**changed), KEYS, now=1500)


def test_every_byte_of_the_token_matters() -> None:
    token = links.mint(record(), 0, KEYS, "k1")
    for i, ch in enumerate(token):
        flipped = token[:i] + ("A" if ch != "A" else "B") + token[i + 1 :]
        try:
            _, state = links.check(flipped, record(), KEYS, now=1500)
        except links.LinkInvalid:
            continue
        assert state == "replaced", f"byte {i} flip accepted as {state}"


def test_expiry_rounds_and_key_rotation() -> None:
    token = links.mint(record(), 0, KEYS, "k0")
    assert links.check(token, record(), KEYS, now=1999.9)[1] == "valid"
    assert links.check(token, record(), KEYS, now=2000)[1] == "expired"
    older = links.mint(record(), 0, KEYS, "k1")
    assert links.check(older, record(round=2, nonces=["n1", "n2"]), KEYS, now=1500)[1] == "replaced"
    with pytest.raises(links.LinkInvalid):
        links.check(links.mint(record(round=2, nonces=["n1", "n2"]), 0, KEYS, "k1"), record(), KEYS, now=1500)
    with pytest.raises(links.LinkInvalid):
        links.check(token, record(), {"k1": KEYS["k1"]}, now=1500)


def test_csrf_is_bound_to_the_link() -> None:
    token = links.mint(record(), 0, KEYS, "k1")
    other = links.mint(record(), 1, KEYS, "k1")
    csrf = links.csrf_token(token, KEYS, "k1")
    assert links.csrf_ok(token, csrf, KEYS)
    assert not links.csrf_ok(other, csrf, KEYS)


def test_policy_conditions() -> None:
    refund = ToolPolicy(gated=True, when="amount_usd > 500", approvers=("f@example.com",))
    assert evaluate("issue_refund", refund, {"amount_usd": "500.01"}).gated
    assert not evaluate("issue_refund", refund, {"amount_usd": "500.00"}).gated
    assert evaluate("issue_refund", refund, {}).gated, "a missing field must fail closed"
    assert not evaluate("lookup_order", ToolPolicy(), {}).gated
    with pytest.raises(ValidationError):
        ToolPolicy(gated=True, when="amount_usd > 500")
    with pytest.raises(ValidationError):
        ToolPolicy(gated=True, when="__import__('os')", approvers=("f@example.com",))


def test_digest_is_canonical_and_covers_everything() -> None:
    a = action_digest("r", 1, "issue_refund", {"order_id": 1, "amount_usd": "600.00"})
    assert a == action_digest("r", 1, "issue_refund", {"amount_usd": "600.00", "order_id": 1})
    assert a != action_digest("r", 1, "issue_refund", {"order_id": 1, "amount_usd": "600.01"})
    assert a != action_digest("r", 2, "issue_refund", {"order_id": 1, "amount_usd": "600.00"})
    assert a != action_digest("s", 1, "issue_refund", {"order_id": 1, "amount_usd": "600.00"})


def test_outbox_keeps_the_first_file_for_an_intent(tmp_path: Path) -> None:
    """One file per intent: a retried send, or another message under the same key (a second caller
    at a placement already asked), leaves the first as it was, as a provider's idempotency key does."""
    mailer = OutboxMailer(tmp_path, "Countersign <a@countersign.local>")
    message = OutgoingEmail(
        to=["x@example.com"],
        subject="Approval needed: <b>x</b>",
        text="text part",
        html="<p>html part</p>",
        idempotency_key="approval-request/r-a1/r1/s0",
        sent_at=1000.0,
        tags={"run_id": "r"},
    )
    first = mailer.send(message)
    files = list(tmp_path.glob("*.eml"))
    written = files[0].read_bytes()
    again = mailer.send(message)
    other = mailer.send(message.model_copy(update={"text": "a new link", "html": "<p>a new link</p>"}))
    assert first == again == other and list(tmp_path.glob("*.eml")) == files, "one file per intent, one Message-ID"
    assert files[0].read_bytes() == written, "the first message stays, byte for byte"
    assert not list(tmp_path.glob(".tmp-*")), "no temporary file is left behind"
    before = email.message_from_bytes(written, policy=email.policy.default)
    assert before["Message-ID"] == first.message_id
    assert before["Subject"] == "Approval needed: <b>x</b>"
    assert [p.get_content_type() for p in before.walk()] == ["multipart/alternative", "text/plain", "text/html"]
    assert [p.get_content() for p in before.iter_parts()] == ["text part", "<p>html part</p>"]
    # The boundary is drawn afresh for every message written, never derived from the key.
    mailer.send(message.model_copy(update={"idempotency_key": "approval-request/r-a2/r1/s0"}))
    boundaries = {
        email.message_from_bytes(path.read_bytes(), policy=email.policy.default).get_boundary()
        for path in tmp_path.glob("*.eml")
    }
    assert len(boundaries) == 2


def test_settings_fail_fast_on_bad_keys() -> None:
    with pytest.raises(ValidationError, match="shorter than 32"):
        Settings(approvals_signing_keys="k1:short")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="kid:secret"):
        Settings(approvals_signing_keys="nocolon")  # type: ignore[arg-type]
    keys = Settings(approvals_signing_keys="new:" + "x" * 32 + ",old:" + "y" * 32)  # type: ignore[arg-type]
    assert list(keys.approvals_signing_keys) == ["new", "old"] and keys.signing_kid == "new"
