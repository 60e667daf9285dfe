"""Unit tests: what every email says, that its links work, that it is escaped, and that it renders
byte-identically from the same journaled values under its own idempotency key."""

from __future__ import annotations

import email
import email.policy
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import css_inline
import pytest
from jinja2 import FileSystemLoader, TemplateError
from pydantic import BaseModel, ValidationError
from support.injection import (
    BIDI,
    FORGED_LINES,
    INVISIBLE,
    MARKERS,
    anchors,
    forged_reason,
    hidden_characters,
    our_lines_only,
    predictable_boundary,
    value_lines_outside_blocks,
)

from countersign.approval.question import form_of
from countersign.contract import ApprovalRecord, Fact, GrantOffer, TrailStep, Vote
from countersign.mail.approval_email import approval_request, batch_request
from countersign.mail.grant_email import grant_receipt
from countersign.mail.intent import from_tag_value, tag_value
from countersign.mail.message import MailRejected, OutgoingEmail
from countersign.mail.outbox import OutboxMailer
from countersign.mail.outcome_email import outcome_notice
from countersign.mail.receipt_email import decision_receipt
from countersign.mail.render import environment, styled, stylesheet, template_dir
from countersign.security import links
from countersign.settings import Settings

SETTINGS = Settings(
    approvals_signing_keys="k1:" + "s" * 40,  # type: ignore[arg-type]
    approvals_public_url="https://approve.example.org",
)
HREF = re.compile(r'href="([^"]+)"')
EVIL = "<script>alert('x')</script>"


def record(**changes: object) -> ApprovalRecord:
    base = ApprovalRecord(
        approval_id="run-7-a1",
        run_id="run-7",
        tenant="default",
        index=1,
        tool="issue_refund",
        args={"order_id": 1042, "amount_usd": "612.40", "reason": "damaged in transit"},
        digest="ab12cd34ef56" + "0" * 52,
        summary="Refund $612.40 to order 1042",
        why="The customer sent photos of the damage.",
        policy="amount_usd > 500",
        requester="alice@example.com",
        approvers=["finance@example.com", "cfo@example.com"],
        active_slots=[0, 1],
        nonces=["nonce-1"],
        requested_at=1_767_225_600.0,  # 2026-01-01 00:00 UTC
        round_started_at=1_767_225_600.0,
        deadline=1_767_225_600.0 + 2 * 86400,
    )
    return base.model_copy(update=changes)


def decided(state: str = "approved", **changes: object) -> ApprovalRecord:
    kind = "reject" if state == "rejected" else "approve"
    reason = changes.get("reason")
    vote = Vote(
        slot=1, round=1, kind=kind, by="cfo@example.com", at=1_767_229_200.0, reason=str(reason) if reason else None
    )
    return record(state=state, decided_by="cfo@example.com", decided_at=1_767_229_200.0, votes=[vote], **changes)


def reminder(rec: ApprovalRecord, slot: int, goal: str, number: int, at: float, settings: Settings) -> OutgoingEmail:
    return approval_request(rec.model_copy(update={"reminders_sent": number}), slot, goal, settings, "reminder", at)


def escalation(rec: ApprovalRecord, slot: int, goal: str, reason: str, settings: Settings) -> OutgoingEmail:
    return approval_request(rec, slot, goal, settings, "escalation", None, reason)


def test_the_request_says_what_why_how_much_who_which_policy_and_when() -> None:
    mail = approval_request(record(), 0, "Refund order 1042 for $612.40", SETTINGS)
    assert mail.to == ["finance@example.com"]
    assert mail.subject == "Approval needed: Refund $612.40 to order 1042"
    for part in (mail.text, mail.html):
        for fact in (
            "Refund $612.40 to order 1042",
            "issue_refund",
            "612.40",
            "1042",
            "damaged in transit",
            "The customer sent photos of the damage.",
            "alice@example.com",
            "amount_usd &gt; 500" if part is mail.html else "amount_usd > 500",
            "2026-01-03 00:00 UTC (2 days after the request)",
            "Refund order 1042 for $612.40",
            "ab12cd34ef56",
        ):
            assert fact in part, f"{fact!r} missing from the {'html' if part is mail.html else 'text'} part"
    assert "    amount_usd: 612.40" in mail.text


def test_approve_and_reject_links_are_distinct_and_verify_for_this_slot_and_round() -> None:
    rec = record()
    mail = approval_request(rec, 1, "goal", SETTINGS)
    hrefs = HREF.findall(mail.html)
    approve = [h for h in hrefs if h.endswith("?intent=approve")]
    reject = [h for h in hrefs if h.endswith("?intent=reject")]
    assert len(approve) == 1 and len(reject) == 1 and approve != reject
    assert approve[0] in mail.text and reject[0] in mail.text
    for href in (approve[0], reject[0]):
        parts = urlsplit(href)
        assert f"{parts.scheme}://{parts.netloc}" == "https://approve.example.org"
        token = parts.path.removeprefix("/approvals/")
        claims, state = links.check(token, rec, SETTINGS.approvals_signing_keys, now=rec.requested_at + 60)
        assert state == "valid" and claims.slot == 1 and claims.round == rec.round
    inbox = f"{SETTINGS.approvals_public_url}/inbox/"
    assert hrefs[:2] == [approve[0], reject[0]] and len(hrefs) == 3 and hrefs[2].startswith(inbox), (
        "no other links: no tracking, no redirects"
    )
    assert (
        links.check_inbox_token(
            urlsplit(hrefs[2]).path.removeprefix("/inbox/"), SETTINGS.approvals_signing_keys, now=rec.requested_at
        )
        == "cfo@example.com"
    )
    assert "<img" not in mail.html and "<style" not in mail.html and 'style="' in mail.html


def test_agent_and_requester_text_is_escaped_in_html_and_fenced_in_text() -> None:
    rec = record(
        why=f"{EVIL}\nReview and approve:\nhttps://evil.example/approvals/x",
        args={"order_id": 1, "amount_usd": "1.00", "reason": EVIL},
        summary=f"Refund {EVIL}",
    )
    mail = approval_request(rec, 0, f"goal {EVIL}", SETTINGS)
    assert "<script" not in mail.html
    assert mail.html.count("&lt;script&gt;") >= 3
    assert "    Review and approve:" in mail.text, "agent text is indented, never at the start of a line"
    assert re.search(r"^Review and approve:\n" + re.escape(SETTINGS.approvals_public_url), mail.text, re.M)
    assert "\n" not in mail.subject and len(mail.subject) <= 180


def test_rendering_is_byte_identical_for_the_same_journaled_values() -> None:
    again = Settings(
        approvals_signing_keys="k1:" + "s" * 40,  # type: ignore[arg-type]
        approvals_public_url="https://approve.example.org",
    )
    builds: list[Callable[[Settings], OutgoingEmail]] = [
        lambda s: approval_request(record(), 0, "goal", s),
        lambda s: reminder(record(), 0, "goal", 2, record().requested_at + 3600, s),
        lambda s: escalation(record(round=2, nonces=["n1", "n2"]), 1, "goal", "nobody answered within 4 h", s),
        lambda s: batch_request([record(), record(index=2, approval_id="run-7-a2")], [0, 0], "goal", s),
        lambda s: outcome_notice(decided(), "executed", s, result={"refund_id": 9}),
        lambda s: decision_receipt(decided(), 1, "Firefox", s),
    ]
    for build in builds:
        first, second = build(SETTINGS), build(again)
        assert first.model_dump_json() == second.model_dump_json()
        assert first.log_links == second.log_links


def test_each_intent_has_its_own_key_and_a_subject_that_says_the_action() -> None:
    mails: list[OutgoingEmail] = [
        approval_request(record(), 0, "g", SETTINGS),
        approval_request(record(), 1, "g", SETTINGS),
        approval_request(record(round=2, nonces=["n1", "n2"]), 0, "g", SETTINGS),
        reminder(record(), 0, "g", 1, 1_767_240_000.0, SETTINGS),
        reminder(record(), 0, "g", 2, 1_767_250_000.0, SETTINGS),
        escalation(record(round=2, nonces=["n1", "n2"], active_slots=[1]), 1, "g", "no answer", SETTINGS),
        approval_request(record(round=2, nonces=["n1", "n2"]), 0, "g", SETTINGS, "reapproval"),
        *(
            outcome_notice(decided(), o, SETTINGS)
            for o in ("approved", "rejected", "expired", "executed", "failed", "undeliverable", "superseded")
        ),
        decision_receipt(decided(), 1, "", SETTINGS),
    ]
    keys = [m.idempotency_key for m in mails]
    assert len(set(keys)) == len(keys)
    assert keys[0] == "approval-request/run-7-a1/r1/s0", "the request key keeps its documented shape"
    assert keys[3] == "approval-reminder/run-7-a1/r1/s0/n1" and keys[5] == "approval-escalation/run-7-a1/r2/s1"
    assert keys[-1] == "approval-receipt/run-7-a1/r1/s1" and keys[7] == "approval-outcome/run-7-a1/r1/approved"
    assert all("Refund $612.40 to order 1042" in m.subject for m in mails)
    assert [m.subject.split(":")[0] for m in mails[6:14]] == [
        "Approve again",
        "Approved",
        "Rejected",
        "Expired, not run",
        "Done",
        "Failed",
        "Not run",
        "Not run, things changed",
    ]
    assert all(m.tags["run_id"] == "run-7" and m.tags["approval_id"] == "run-7-a1" for m in mails)
    assert {m.tags["kind"] for m in mails} == {"request", "reminder", "escalation", "reapproval", "outcome", "receipt"}


def test_reminder_and_escalation_say_why_they_came() -> None:
    late = reminder(record(), 1, "g", 2, record().deadline - 5400, SETTINGS)
    assert late.subject.startswith("Reminder: approval needed by 2026-01-03 00:00 UTC")
    assert "Reminder 2" in late.text and "1 hour 30 minutes left" in late.text and late.to == ["cfo@example.com"]
    up = escalation(
        record(round=2, nonces=["n1", "n2"], active_slots=[1]), 1, "g", "finance@example.com did not answer", SETTINGS
    )
    assert up.subject.startswith("Escalated to you:") and up.to == ["cfo@example.com"]
    assert "It was first sent to finance@example.com" in up.text
    assert "finance@example.com did not answer" in up.html and "their links no longer work" in up.text
    token = urlsplit(up.log_links[0]).path.removeprefix("/approvals/")
    assert links.parse(token).round == 2


def test_a_batch_email_lists_every_action_behind_one_link_for_this_approver() -> None:
    second = record(index=2, approval_id="run-7-a2", summary="Refund $800.00 to order 1043", args={"order_id": 1043})
    mail = batch_request([record(), second], [1, 1], "Refund both", SETTINGS)
    assert mail.to == ["cfo@example.com"] and mail.kind == "batch"
    assert mail.subject == "Approval needed: 2 actions (Refund $612.40 to order 1042, …)"
    for part in (mail.text, mail.html):
        assert "Refund $612.40 to order 1042" in part and "Refund $800.00 to order 1043" in part and "1043" in part
    assert mail.idempotency_key == "approval-batch/run-7-a1/r1/s1" and mail.tags["items"] == "1s1-2s1"
    assert HREF.findall(mail.html)[0] == mail.log_links[0] and len(HREF.findall(mail.html)) == 2
    assert mail.log_links[0] in mail.text and "/inbox/" in HREF.findall(mail.html)[1]
    token = urlsplit(mail.log_links[0]).path.removeprefix("/approvals/")
    assert links.check(token, record(), SETTINGS.approvals_signing_keys, now=record().requested_at)[0].slot == 1


def test_outcome_notices_go_to_the_requester_without_decision_links() -> None:
    rejected = outcome_notice(decided("rejected", reason=f"No photos {EVIL}"), "rejected", SETTINGS)
    assert rejected.to == ["alice@example.com"]
    assert "cfo@example.com rejected this at 2026-01-01 01:00 UTC" in rejected.text
    assert "No photos" in rejected.text and "<script" not in rejected.html
    assert "/approvals/" not in rejected.text + rejected.html
    failed = outcome_notice(decided(), "failed", SETTINGS, error="order has only $0.00 left to refund")
    assert "running it failed" in failed.text and "$0.00 left" in failed.html
    done = outcome_notice(decided(), "executed", SETTINGS, result={"refund_id": 77})
    assert "refund_id: 77" in done.text and "and it ran" in done.text
    lost = outcome_notice(record(state="undeliverable"), "undeliverable", SETTINGS)
    assert "finance@example.com, cfo@example.com" in lost.text and "did not run" in lost.text


def test_the_decision_receipt_tells_the_decider_what_to_do_if_it_was_not_them() -> None:
    settings = SETTINGS.model_copy(update={"approvals_security_contact": "security@example.com"})
    receipt = decision_receipt(decided(), 1, "Mozilla/5.0 <b>", settings)
    assert receipt.to == ["cfo@example.com"] and receipt.idempotency_key == "approval-receipt/run-7-a1/r1/s1"
    assert receipt.subject == "You approved: Refund $612.40 to order 1042"
    assert "IF THIS WASN'T YOU" in receipt.text and "security@example.com" in receipt.text
    assert "action may already have run" in receipt.text and "Mozilla/5.0 &lt;b&gt;" in receipt.html
    with pytest.raises(MailRejected):
        decision_receipt(decided(), 0, "", SETTINGS)
    rejected = decision_receipt(decided("rejected"), 1, "", SETTINGS)
    assert rejected.subject.startswith("You rejected:") and "may already have run" not in rejected.text


class NewAddress(BaseModel):
    street: str
    floor: int


def question(state: str = "approved", **changes: object) -> ApprovalRecord:
    fields = [f.model_dump(mode="json") for f in form_of(NewAddress)]
    args = {"question": "New address?", "fields": fields}
    return decided(state, kind="question", tool="question", args=args, **changes)


def test_a_questions_receipt_says_answered_or_declined_and_shows_the_answer() -> None:
    answered = decision_receipt(question(), 1, "", SETTINGS, edits={"street": "Baker St 221b", "floor": "2"})
    assert answered.subject.startswith("You answered:")
    for part in (answered.text, answered.html):
        assert "link for this question was used to" in part and "answer" in part and "Baker St 221b" in part
        assert "acted on the answer" in part and "approval link" not in part and "action may" not in part
    assert "Your answer:\n    Street: Baker St 221b\n    Floor: 2" in answered.text
    declined = decision_receipt(question("rejected", reason="ask them"), 1, "", SETTINGS)
    assert declined.subject.startswith("You declined:") and "Your answer" not in declined.text
    assert "acted on the decline" in declined.text and "ask them" in declined.text


@pytest.mark.parametrize(
    "value",
    ["run-1", "r.un:1_x", "a" * 128 + "-a99", "." * 127 + "a-a1", "Ünïcode"],
)
def test_tag_values_are_reversible_and_within_resend_limits(value: str) -> None:
    tag = tag_value(value)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,256}", tag)
    assert from_tag_value(tag) == value


def test_a_value_that_is_no_tag_is_refused() -> None:
    for bad in ("_!!", "has space", "_0"):
        with pytest.raises(ValueError, match="tag"):
            from_tag_value(bad)


def test_the_outbox_writes_each_kind_as_a_two_part_message(tmp_path: Path) -> None:
    mailer = OutboxMailer(tmp_path, "Countersign <a@countersign.local>")
    for mail in (
        approval_request(record(), 0, "g", SETTINGS),
        outcome_notice(decided(), "approved", SETTINGS),
        decision_receipt(decided(), 1, "", SETTINGS),
    ):
        receipt = mailer.send(mail)
        assert receipt.kind == mail.kind and receipt.idempotency_key == mail.idempotency_key
    files = sorted(p.name for p in tmp_path.glob("*.eml"))
    assert [f.split("_run-7")[0] for f in files] == ["approval-outcome", "approval-receipt", "approval-request"]
    parsed = email.message_from_bytes((tmp_path / files[0]).read_bytes(), policy=email.policy.default)
    assert parsed["To"] == "alice@example.com" and parsed["X-Countersign-Kind"] == "outcome"
    assert [p.get_content_type() for p in parsed.walk()] == ["multipart/alternative", "text/plain", "text/html"]


def test_mail_settings_fail_fast() -> None:
    with pytest.raises(ValidationError, match="whsec_"):
        Settings(resend_webhook_secret="not-base64!")
    with pytest.raises(ValidationError, match="http"):
        Settings(resend_api_url="ftp://x")
    with pytest.raises(ValidationError):
        Settings(resend_timeout_seconds=0)
    ok = Settings(resend_webhook_secret="whsec_" + "QUJD" * 8, resend_api_url="http://127.0.0.1:1/")
    assert ok.resend_api_url == "http://127.0.0.1:1"


REQUEST_KEY = "approval-request/run-7-a1/r1/s0"
ARG_BLOCK = "      | "
"""Where each line of a several-line argument value goes in the text part (under `    name:`)."""


def parsed_outbox_file(folder: Path, mail: OutgoingEmail) -> email.message.EmailMessage:
    OutboxMailer(folder, "Countersign <a@countersign.local>").send(mail)
    [path] = folder.glob("*.eml")
    raw = path.read_bytes()
    assert raw.isascii(), "quoted-printable parts: no raw 8-bit byte in the file"
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(parsed, email.message.EmailMessage)
    return parsed


def part(message: email.message.EmailMessage, subtype: str) -> str:
    body = message.get_body((subtype,))
    assert body is not None
    return str(body.get_content())


def test_an_argument_cannot_forge_a_mime_part_of_the_outbox_file(tmp_path: Path) -> None:
    reason = forged_reason(REQUEST_KEY)
    mail = approval_request(record(args={**record().args, "reason": reason}), 0, "goal", SETTINGS)
    assert mail.idempotency_key == REQUEST_KEY
    parsed = parsed_outbox_file(tmp_path, mail)

    assert [p.get_content_type() for p in parsed.walk()] == ["multipart/alternative", "text/plain", "text/html"]
    assert parsed.get_boundary() != predictable_boundary(REQUEST_KEY)
    assert not (parsed.epilogue or "").strip(), "nothing of ours was pushed past the last part"
    text, html = part(parsed, "plain"), part(parsed, "html")
    approve = f"{mail.log_links[0]}?intent=approve"
    for shown in (text, html):
        assert "Refund $612.40 to order 1042" in shown and "612.40" in shown and approve in shown
    found = anchors(html)
    assert found == anchors(mail.html) and len(found) == 3 and found[0] == approve, "exactly our three links"
    assert not [href for href in found if "evil" in href]
    assert "<p>Refund $6.12" not in html and "&lt;p&gt;Refund $6.12" in html, "the forged HTML is shown as text"
    our_lines_only(text, "ab12cd34ef56", approve)
    assert value_lines_outside_blocks(text, reason, (ARG_BLOCK,)) == []


def test_no_line_of_agent_text_leaves_its_block_in_any_text_part() -> None:
    forged = "\n".join(["first line", *FORGED_LINES])
    rec = record(
        summary="Refund $612.40 to order 1042\n" + "\n".join(FORGED_LINES),
        why=forged,
        args={**record().args, "reason": forged, "note": {"nested": forged}},
        change_note=forged,
    )
    goal = forged
    approve = "?intent=approve"
    mails = {
        "request": approval_request(rec, 0, goal, SETTINGS),
        "reminder": reminder(rec, 0, goal, 1, rec.requested_at + 60, SETTINGS),
        "escalation": escalation(rec.model_copy(update={"round": 2, "nonces": ["a", "b"]}), 1, goal, forged, SETTINGS),
        "reapproval": approval_request(rec, 0, goal, SETTINGS, "reapproval"),
        "receipt": decision_receipt(
            decided(**{**rec.model_dump(include={"summary", "why", "args"}), "reason": forged}), 1, forged, SETTINGS
        ),
        "outcome": outcome_notice(
            decided(**{**rec.model_dump(include={"summary", "why", "args"}), "reason": forged}),
            "executed",
            SETTINGS,
            result={"refund_id": forged},
            error=forged,
        ),
    }
    for kind, mail in mails.items():
        links_ = [f"{link}{approve}" for link in mail.log_links]
        our_lines_only(mail.text, "ab12cd34ef56", links_[0] if links_ else None)
        outside = value_lines_outside_blocks(mail.text, forged, ("    ", ARG_BLOCK))
        assert outside == [], f"{kind}: agent text at the margin: {outside}"
        assert "    reason:\n" + ARG_BLOCK + "first line\n" + ARG_BLOCK + FORGED_LINES[0] in mail.text, kind
        assert mail.text.splitlines()[0].endswith("order 1042 ↵ " + " ↵ ".join(FORGED_LINES)), (
            "the summary keeps its line"
        )

    batch = batch_request([rec, rec.model_copy(update={"index": 2, "approval_id": "run-7-a2"})], [0, 0], goal, SETTINGS)
    assert value_lines_outside_blocks(batch.text, forged, ("    ", "       ", "         | ")) == []
    fingerprints = [line for line in batch.text.splitlines() if line.startswith("   Fingerprint")]
    assert fingerprints == ["   Fingerprint: ab12cd34ef56"] * 2
    margin = ("Fingerprint", "Review and approve", "http://evil", "   Fingerprint: 0")
    assert [line for line in batch.text.splitlines() if line.startswith(margin)] == []


def test_a_single_line_argument_stays_on_its_name_line() -> None:
    mail = approval_request(record(), 0, "g", SETTINGS)
    assert "    amount_usd: 612.40\n    order_id: 1042\n    reason: damaged in transit\n" in mail.text


def test_bidi_and_zero_width_characters_are_shown_as_markers_in_both_parts(tmp_path: Path) -> None:
    hostile = f"Customer asked: {BIDI} {INVISIBLE}"
    rec = record(why=hostile, args={**record().args, "reason": hostile}, summary=f"Refund $612.40 {BIDI}")
    mail = approval_request(rec, 0, hostile, SETTINGS)
    parsed = parsed_outbox_file(tmp_path, mail)
    for shown in (mail.subject, mail.text, mail.html, part(parsed, "plain"), part(parsed, "html")):
        assert hidden_characters(shown) == []
    for shown in (mail.text, mail.html, part(parsed, "plain"), part(parsed, "html")):
        assert all(marker in shown for marker in MARKERS), "each hidden character shows where it was"
        assert "[U+202E]00.21$ dnufer[U+202C]" in shown
    assert "[U+202E]" in mail.subject
    outcome = outcome_notice(decided(why=hostile, reason=hostile), "rejected", SETTINGS, error=hostile)
    assert hidden_characters(outcome.text + outcome.html) == []


def test_email_templates_autoescape_html_and_not_text() -> None:
    env = environment()
    assert callable(env.autoescape)
    assert env.autoescape("approval_request.html") and env.autoescape("_action.html")
    assert not env.autoescape("approval_request.txt")


@pytest.mark.parametrize(
    ("asked_by", "who", "why_label"),
    [
        ("agent", "An agent working for", "Why (the agent's words):"),
        ("code", "A workflow working for", "Why (as the workflow gave it):"),
    ],
)
def test_the_request_is_worded_by_who_asked(asked_by: str, who: str, why_label: str) -> None:
    """A workflow's own gated_call is not an agent: its email and page say who asked."""
    import time

    from countersign.web import wording
    from countersign.web.views import page

    rec = record(asked_by=asked_by, why="")
    mail = approval_request(rec, 0, "", SETTINGS)
    assert f"{who} alice@example.com wants to run issue_refund" in mail.text
    assert why_label in mail.text
    assert f"{who} <strong>alice@example.com</strong>" in mail.html
    other = "A workflow" if asked_by == "agent" else "An agent"
    assert other not in mail.text and other not in mail.html
    now = time.time()
    body = page(
        "confirm.html",
        record=rec,
        approver="finance@example.com",
        goal="",
        intent="",
        csrf="c",
        confirm_label="",
        confirm_value="",
        deadline=wording.deadline(rec.deadline, now),
        requested=wording.moment(rec.requested_at),
        fingerprint=rec.digest[:12],
    ).body
    html = bytes(body).decode()
    asker = "the agent" if asked_by == "agent" else "the workflow"
    assert f"({asker} gave none)" in html and f"tells {asker} your reason" in html
    assert ("Agent's reason" in html) == (asked_by == "agent")


@pytest.mark.parametrize("asked_by", ["agent", "code"])
def test_what_happens_next_is_worded_by_who_asked(asked_by: str) -> None:
    """After the decision too (the outcome notice, the pages of a closed approval, the next steps
    after a decision), a workflow's call is the workflow's, an agent's the agent's."""
    from countersign.web import wording

    asker, other = ("agent", "workflow") if asked_by == "agent" else ("workflow", "agent")
    rejected = outcome_notice(decided("rejected", asked_by=asked_by), "rejected", SETTINGS)
    assert f"the {asker} was told why" in rejected.text and f"the {asker} was told why" in rejected.html
    assert f"The action your {asker} asked for" in rejected.html
    for mail in (rejected, outcome_notice(decided(asked_by=asked_by), "approved", SETTINGS)):
        assert f" {other} " not in mail.text.lower(), mail.text
    rec = decided(asked_by=asked_by)
    closed = [wording.closed_state(state, "cfo@example.com", 0.0, None, None, None, rec.asker) for state in STATES]
    assert all(f"the {other}" not in (v.headline + v.consequence).lower() for v in closed)
    assert any(f"The {asker} was told" in v.consequence for v in closed)
    for state in ("approved", "rejected"):
        told = wording.next_steps(state, rec.tool, rec.digest[:12], who_asked=rec.asker)
        assert f"The {asker} " in told and f"The {other} " not in told


STATES = ("approved", "rejected", "superseded", "failed", "undeliverable", "expired", "cancelled")


class _Tags(HTMLParser):
    """An HTML document as (event, tag, sorted attributes) and text items, whitespace-only text left out."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.items: list[object] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.items.append(("start", tag, sorted(attrs)))

    def handle_endtag(self, tag: str) -> None:
        self.items.append(("end", tag))

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.items.append(data)


def _document(html: str) -> list[object]:
    """What a mail client reads: the HTML parsed as a browser does (tbody added, entities read) and
    listed element by element, each with its attributes (its inline style among them)."""
    parsed = _Tags()
    parsed.feed(css_inline.CSSInliner(load_remote_stylesheets=False).inline(html))
    return parsed.items


def _inlined_per_email(styled_html: str) -> str:
    """The email as each render used to make it: the template's own HTML (no style attribute, the
    layout's stylesheet in its head) through the CSS inliner."""
    layout = FileSystemLoader(template_dir()).get_source(environment(), "_layout.html")[0]
    css = stylesheet(layout)
    plain = re.sub(r' style="[^"]*"', "", styled_html).replace("</head>", f"<style>{css}</style>\n</head>", 1)
    inliner = css_inline.CSSInliner(load_remote_stylesheets=False, keep_style_tags=False, keep_link_tags=False)
    return inliner.inline(plain)


def test_each_email_has_the_inline_styles_that_inlining_each_render_gave() -> None:
    trail = [TrailStep(index=0, tool="lookup_order", outcome="autonomous", args='{"order_id": 1042}', result="ok")]
    full = record(trail=trail, context=[Fact(label="Order total", value="$612.40")], args={"note": "a\nb\nc"})
    offer = GrantOffer(max_uses=3, scope="requester", scope_value="alice@example.com", max_seconds=86400, words="a day")
    grant = {"key": "k", "grant_id": "g1", "granted_by": "cfo@example.com", "granted_at": 1_767_229_200.0}
    mails = [
        approval_request(full, 0, "goal", SETTINGS),
        reminder(record(), 0, "goal", 2, record().requested_at + 3600, SETTINGS),
        escalation(record(round=2, nonces=["n1", "n2"]), 1, "goal", "nobody answered within 4 h", SETTINGS),
        approval_request(record(round=2, nonces=["n1", "n2"]), 0, "g", SETTINGS, "reapproval"),
        batch_request([record(), record(index=2, approval_id="run-7-a2")], [0, 0], "goal", SETTINGS),
        *(outcome_notice(decided(), o, SETTINGS, result={"refund_id": 9}) for o in ("executed", "rejected", "failed")),
        # A long text changed: the receipt's diff has a row of each sign, each with its own class.
        decision_receipt(decided(args={"note": "a\nb\nc"}), 1, "Firefox", SETTINGS, edits={"note": "a\nB\nc\nd"}),
        grant_receipt(decided(grant_offer=offer), {**grant, "expires_at": 1_767_315_600.0, "max_uses": 3}, SETTINGS),
    ]
    for mail in mails:
        assert "<style" not in mail.html and ' style="' in mail.html, mail.kind
        assert _document(mail.html) == _document(_inlined_per_email(mail.html)), mail.kind
    receipt = mails[-2].html
    assert all(f'<td class="diff-{sign}" style="' in receipt for sign in ("del", "add", "same"))


def test_every_html_template_is_its_source_with_only_inline_styles_added() -> None:
    plain = FileSystemLoader(template_dir())
    for name in sorted(p.name for p in template_dir().glob("*.html")):
        source = plain.get_source(environment(), name)[0]
        styled_source = environment().loader.get_source(environment(), name)[0]  # type: ignore[union-attr]
        assert re.sub(r' style="[^"]*"', "", styled_source) == re.sub(r"<style>.*?</style>", "", source, flags=re.S)


def test_a_template_whose_styles_cannot_be_inlined_once_is_refused() -> None:
    css = "p { margin: 0; } .a { color: red; }"
    assert styled("_x.html", '<p class="a">{{ x }}</p>', css) == (
        '<p class="a" style="margin: 0;color: red;">{{ x }}</p>'
    )
    unreadable = ('<p class="{{ c }}">', '<p style="color: blue">', "<p {% if x %}hidden{% endif %}>", "<td nowrap=1>")
    for source in unreadable:
        with pytest.raises(TemplateError):
            styled("_x.html", source, css)
    with pytest.raises(TemplateError):
        styled("x.html", "<p>no layout</p>", css)
    with pytest.raises(TemplateError):
        styled("_x.html", "<p>", "table p { color: red; }")
