"""The graduation dial: `graduate` and `tighten` round-trip through the policy file, and a run made
after the handlers restart with the graduated file goes autonomous, its audit entry naming the
policy version that let it run alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.approver import form_csrf, wait_for_email
from support.business import new_order
from support.operator import cli
from support.processes import StackFactory, wait_until
from support.runs import refund_task

from countersign.ops.dial import DialRefused, graduate, tighten
from countersign.tools.policy import evaluate
from countersign.tools.policy_file import merge
from handlers.demo.tools import DEMO_TOOLS

REFUND = next(t for t in DEMO_TOOLS if t.name == "issue_refund")
ORIGINAL = "# finance owns this file\n[tools.email_customer]\ndeadline_seconds = 3600  # one hour\n"


def test_graduate_then_tighten_is_the_identity_on_the_table() -> None:
    up = graduate(REFUND, {}, "amount_usd < 700")
    assert up.table == {"when": "(amount_usd > 500) && !(amount_usd < 700)"}
    policy = merge(REFUND.policy, up.table, source="test")
    for amount, gated in (("650.00", False), ("750.00", True), ("450.00", False)):
        args = REFUND.validate({"order_id": 1, "amount_usd": amount, "reason": "x"})
        assert evaluate("issue_refund", policy, args).gated is gated, amount
    down = tighten(REFUND, up.table, "amount_usd < 700")
    assert down.table == {} and (down.before, down.after) == (up.after, up.before)

    alone = graduate(REFUND, {"deadline_seconds": 172800})
    assert alone.table == {"deadline_seconds": 172800, "gated": False}
    assert tighten(REFUND, alone.table).table == {"deadline_seconds": 172800}
    other = tighten(REFUND, {}, "reason == 'vip'")
    assert other.table == {"when": "(amount_usd > 500) || (reason == 'vip')"}


def test_the_dial_refuses_what_it_cannot_do() -> None:
    with pytest.raises(DialRefused, match="already runs without approval"):
        graduate(REFUND, {"gated": False})
    with pytest.raises(DialRefused, match="not a valid CEL expression"):
        graduate(REFUND, {}, "amount_usd <")
    with pytest.raises(DialRefused, match="already needs approval for every call"):
        tighten(REFUND, {"when": "true"})


def entries(stack: Any, approval: str) -> list[dict[str, Any]] | None:
    found: list[dict[str, Any]] = stack.ingress.call("ApprovalAudit", approval, "entries", None).json()["entries"]
    return found or None


def test_graduate_and_tighten_through_the_policy_file_and_a_run_that_goes_autonomous(
    private_stacks: StackFactory, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(ORIGINAL)
    stack = private_stacks(app_env={"APPROVALS_POLICY_FILE": str(policy), "TRUST_RAMP_MIN_DECISIONS": "1"})
    dial = ("--when", "amount_usd < 700", "--write", str(policy))

    early = cli(stack.restate, "graduate", "issue_refund", *dial)
    assert early.returncode == 1 and "has not suggested graduating issue_refund" in early.stderr
    assert policy.read_text() == ORIGINAL, "a refusal writes nothing"

    stack.ingress.start_run("asked", refund_task(new_order(stack.db_path, 100000), "650.00"))
    [mail] = wait_for_email(stack.outbox_dir, "asked")
    reply = httpx.post(
        mail.link, data={"csrf": form_csrf(mail.link), "verdict": "approve"}, headers={"Origin": stack.app.url}
    )
    assert reply.status_code == 200, reply.text
    stack.ingress.wait_output("asked")

    def graduated() -> dict[str, Any] | None:
        done = cli(stack.restate, "graduate", "issue_refund", *dial, "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    change = wait_until(graduated, 30, "the trust ramp's graduation hint")
    assert change["table"] == {"when": "(amount_usd > 500) && !(amount_usd < 700)"}
    text = policy.read_text()
    assert text.startswith(ORIGINAL) and 'when = "(amount_usd > 500) && !(amount_usd < 700)"' in text
    [requested] = [e for e in entries(stack, "asked-a0") or [] if e["kind"] == "requested"]
    assert requested["details"]["policy_version"] == change["policy_version_before"]

    stack.app.restart()  # the handlers read the policy file at start
    stack.ingress.start_run("alone", refund_task(new_order(stack.db_path, 100000), "650.00"))
    result = stack.ingress.wait_output("alone", timeout=60).json()
    assert result["actions"][0]["outcome"] == "autonomous"
    [alone] = wait_until(lambda: entries(stack, "alone-a0"), 30, "the autonomous call's audit entry")
    assert alone["kind"] == "autonomous" and alone["details"]["tool"] == "issue_refund"
    assert alone["details"]["policy_version"] == change["policy_version_after"] != change["policy_version_before"]
    assert alone["details"]["idempotency_key"] == "alone/0"

    back = cli(stack.restate, "tighten", "issue_refund", *dial)
    assert back.returncode == 0, back.stderr
    assert "[tools.email_customer]" in policy.read_text() and "issue_refund" not in policy.read_text()
    assert policy.read_text().strip() == ORIGINAL.strip(), "tighten undid graduate"
